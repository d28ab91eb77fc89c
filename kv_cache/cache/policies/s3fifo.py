"""S3-FIFO (Yang et al., SOSP'23): a small probationary FIFO, a main FIFO and a ghost list.

New blocks enter the small queue (10 % of the blocks); one seen again while in
the ghost list enters the main queue directly. Eviction looks at the small
queue first: a block hit while there moves to main, one never hit is evicted
(its key goes to the ghost list). In main, a hit block gets another round
(its count decremented, moved to the young end), one with count 0 is
evicted. Those queue moves happen lazily when the cache asks for candidates,
before it iterates them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

SMALL_SHARE = 0.1
MAX_FREQ = 3


class S3FIFOPolicy:
    name = "s3fifo"

    def __init__(self) -> None:
        self._small: OrderedDict[int, None] = OrderedDict()
        self._main: OrderedDict[int, None] = OrderedDict()
        self._ghost: OrderedDict[int, None] = OrderedDict()
        self._freq: dict[int, int] = {}

    def on_insert(self, key: int, label: str = "", nbytes: int = 0) -> None:
        self._freq[key] = 0
        if key in self._ghost:
            del self._ghost[key]
            self._main[key] = None
        else:
            self._small[key] = None

    def on_hit(self, key: int) -> None:
        if key in self._freq:
            self._freq[key] = min(self._freq[key] + 1, MAX_FREQ)

    def on_remove(self, key: int) -> None:
        self._freq.pop(key, None)
        if self._small.pop(key, 0) is None:  # evicted from probation: remember it
            self._ghost[key] = None
            while len(self._ghost) > max(len(self._small) + len(self._main), 1):
                self._ghost.popitem(last=False)
        self._main.pop(key, None)

    def _settle(self) -> None:
        """Lazy queue moves: hit blocks leave probation; hit main blocks get another round."""
        for key in [k for k in self._small if self._freq[k] > 0]:
            if len(self._small) <= SMALL_SHARE * (len(self._small) + len(self._main)):
                break
            del self._small[key]
            self._freq[key] = 0
            self._main[key] = None
        for key in list(self._main):
            if self._freq[key] == 0:
                break
            self._freq[key] -= 1
            self._main.move_to_end(key)

    def candidates(self) -> Iterator[int]:
        self._settle()
        cold_small = [k for k in self._small if self._freq[k] == 0]
        order = cold_small + [k for k in self._main if self._freq[k] == 0]
        rest = [k for k in self._small if self._freq[k] > 0] + [k for k in self._main if self._freq[k] > 0]
        return iter(order + rest)

    def __len__(self) -> int:
        return len(self._freq)
