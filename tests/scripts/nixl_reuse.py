"""Both sides in one process: blocks 1 and 2 published and read; slot 1 reused, block 2 damaged in place."""

import os
import sys
import time

import numpy as np

from kv_cache.lifecycle.handoff.nixl import NixlLoader, NixlPublisher
from kv_cache.lifecycle.payload import PayloadPool
from kv_cache.types import Handoff

size, pool = 2**20, PayloadPool(1)
def payload(k):
    out = np.zeros(size, np.uint8)
    pool.fill(k, out)
    return out
store = NixlPublisher.create(sys.argv[1], size, 2 * size, {"seed": 1})
for k in (1, 2):
    store.blocks.put(k, memoryview(payload(k)))
store.hand_over(Handoff("r", (1, 2), (size,) * 2, (), (), 32, 1, 16, time.time()))
link = NixlLoader(sys.argv[1], {"seed": 1}, 30, lambda m: None)
link.ready()  # its clock runs: the prefill side hands requests only to such a node
while len(link.slot_of) < 2:
    time.sleep(0.01)
out = np.zeros(size, np.uint8)
print("before", link.load(1, out), pool.check(1, out, "full"), link.load(2, out), pool.check(2, out, "full"))
store.blocks.delete(1)
store.blocks.put(3, memoryview(payload(3)))  # block 1's slot now holds block 3
slot2 = store.blocks.where([2])[0]
store.blocks.region[slot2 * size + 5 * 4096] ^= 0xFF  # block 2 damaged in place: its tag still says 2
print("after", link.load(1, out), link.load(2, out), pool.check(2, out, "full"), flush=True)
os._exit(0)  # no detach: with both agents in one process NIXL's teardown can wait on itself
