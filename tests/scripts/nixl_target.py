"""A prefill side that publishes two blocks and serves them until killed (test_nixl_handoff.py)."""

import sys
import time

import numpy as np

from kv_cache.lifecycle.handoff.nixl import NixlPublisher
from kv_cache.types import Handoff

store = NixlPublisher.create(sys.argv[1], 2**20, 4 * 2**20, {"seed": 1})
data = memoryview(np.ones(2**20, np.uint8))
for k in (1, 2):
    store.blocks.put(k, data)
store.hand_over(Handoff("r", (1, 2), (2**20,) * 2, (), (), 32, 1, 16, time.time()))
print("published", flush=True)
time.sleep(600)
