"""The NIXL handoff's side channel (lifecycle/handoff/channel.py) over real sockets on 127.0.0.1: which decode
node each request goes to. No NIXL is needed: the channel carries lines, the region is only described."""

import json
import socket
import time

from servers import free_port

from kv_cache.lifecycle.handoff.channel import Line, PrefillChannel

IDENTITY = {"model": "m", "kv_dtype": "bf16", "tp": 1, "block_tokens": 16, "seed": 7}


class _Region:
    """What the header describes of the prefill node's registered slots (the channel reads these fields only)."""

    region_addr, region_mem, region_dev, tags_addr, slot_bytes, nslots = 0, "DRAM", 0, 0, 4096, 64

    def where(self, keys):
        return list(range(len(keys)))


def _node(port: int, name: str) -> Line:
    link = Line(socket.create_connection(("127.0.0.1", port), timeout=10))
    link.send({"kind": "attach", "name": name, "identity": IDENTITY})
    assert link.recv()["kind"] == "header"
    return link


def _requests(link: Line, expect: int = 0, seconds: float = 30.0) -> list[str]:
    """The request ids handed to this node (heartbeats skipped): once expect of them came (a busy machine waits
    longer, never fails sooner), or all that came within seconds when none is expected."""
    got, end = [], time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0 and not (expect and len(got) >= expect):
        link.sock.settimeout(left)
        try:
            rec = link.recv()
        except (TimeoutError, OSError):
            break
        if rec and rec["kind"] == "request":
            got.append(rec["rid"])
    return got


def _request(rid: str) -> bytes:
    return (json.dumps({"kind": "request", "rid": rid, "keys": ["a1", "b2"]}, separators=(",", ":")) + "\n").encode()


def test_requests_go_only_to_decode_nodes_whose_clock_runs():
    """A decode node attaches, then builds its tiers (tens of seconds): requests handed to it then held their
    blocks, and the prefill node's space, until its clock started. They wait for a node that says it is ready."""
    port = free_port()
    channel = PrefillChannel("127.0.0.1", port, IDENTITY, _Region(), b"meta", dict(IDENTITY))
    try:
        fast, slow = _node(port, "fast"), _node(port, "slow")
        channel.append(_request("r0"))  # nobody is ready yet: it waits
        assert _requests(fast, seconds=0.3) == [] and _requests(slow, seconds=0.3) == []
        fast.send({"kind": "ready"})
        assert _requests(fast, 1) == ["r0"]  # the waiting request goes to the first ready node
        for rid in ("r1", "r2", "r3"):
            channel.append(_request(rid))
        assert _requests(fast, 3) == ["r1", "r2", "r3"] and _requests(slow, seconds=0.3) == []
        slow.send({"kind": "ready"})
        deadline = time.monotonic() + 30
        while "slow" not in channel.ready_nodes() and time.monotonic() < deadline:
            time.sleep(0.01)
        for rid in ("r4", "r5"):
            channel.append(_request(rid))
        assert _requests(fast, 1) + _requests(slow, 1) == ["r4", "r5"]  # in turn once both are ready
        assert channel.ready_nodes() == {"fast", "slow"}
    finally:
        channel.close()
