"""The prefill side's region in the fake device's memory, read by the decode side with NIXL READs."""

import os
import sys
import time

import numpy as np

from kv_cache.lifecycle.handoff.nixl import NixlLoader, NixlPublisher
from kv_cache.lifecycle.payload import PayloadPool, block_digest
from kv_cache.recorder.recorder import Recorder
from kv_cache.tiers.devices import FakeDevice
from kv_cache.types import Handoff

size, pool, dev, rec = 2**20, PayloadPool(1), FakeDevice(), Recorder()
store = NixlPublisher.create(sys.argv[1], size, 4 * size, {"seed": 1}, (dev, 0))
keys = (11, 12, 13)
store.publish(keys, (size,) * 3, pool.fill, np.empty(size, np.uint8), rec)
store.hand_over(Handoff("r", keys, (size,) * 3, (), (), 48, 1, 16, time.time(), store.digests(keys)))
copies = sum(s.copies for s in dev.streams)
link = NixlLoader(sys.argv[1], {"seed": 1}, 30, lambda m: None)
link.ready()  # its clock runs: the prefill side hands requests only to such a node
while len(link.slot_of) < 3:
    time.sleep(0.01)
out, good = np.zeros(size, np.uint8), 0
for k, d in zip(keys, store.digests(keys)):
    good += link.load(k, out) and block_digest(out) == d
print("device", store.blocks.region_mem, copies, dev.allocated[0], good, flush=True)
store.blocks.close()
print("freed", dev.allocated[0], flush=True)
os._exit(0)
