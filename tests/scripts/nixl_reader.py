"""A decode side that reads one block, waits for the test to kill the prefill side, then reads the other."""

import os
import sys
import time

import numpy as np

from kv_cache.errors import RunFault
from kv_cache.lifecycle.handoff.nixl import NixlLoader

link = NixlLoader(sys.argv[1], {"seed": 1}, 30, print)
link.ready()  # its clock runs: the prefill side hands requests only to such a node
while len(link.slot_of) < 2:
    time.sleep(0.01)
out = memoryview(np.zeros(2**20, np.uint8))
print("first", link.load(1, out), flush=True)
sys.stdin.readline()  # the test kills the prefill side, then says go
try:
    print("second", link.load(2, out), flush=True)
except RunFault as e:
    print("RunFault:", e, flush=True)
link.detach()
os._exit(0)
