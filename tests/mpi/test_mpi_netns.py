"""Two MPI ranks on two network stacks (issue 26, item 3): each rank in its own network namespace and hostname,
joined by a veth pair, launched by Open MPI's ssh launcher through an agent that enters the namespace. The
ranks' merge, their common clock and their own cache directories must hold across hosts, not just on localhost.
"""

import json
import os
import sys

import pytest
from conftest import REPO, SMALL, bounded
from netns import NetnsPair, why_not
from test_mpi_e2e import MPIRUN, _mpi_ready

WHY_NOT = _mpi_ready() or why_not()
pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.root, pytest.mark.skipif(WHY_NOT is not None,
                                                                                     reason=WHY_NOT or "")]


def test_two_ranks_in_two_network_namespaces_merge_exactly(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    with NetnsPair() as net:
        agent = net.rsh_agent(tmp_path / "agent.sh")
        cmd = [MPIRUN, "--allow-run-as-root", "--host", f"{net.addr['a']}:1,{net.addr['b']}:1", "-np", "2",
               "--prtemca", "plm_ssh_agent", str(agent), "--prtemca", "oob_tcp_if_include", net.cidr,
               "--mca", "btl_tcp_if_include", net.cidr, "--mca", "btl", "tcp,self", "--mca", "pml", "ob1",
               sys.executable, str(REPO / "kv_cache_benchmark.py"), "--config", str(SMALL), "--output-dir",
               str(tmp_path), "--cache-dir", str(cache), "--run-id", "n", "--quiet", *bounded(16)]
        r = net.run("a", cmd, timeout=180, cwd=REPO)  # mpirun in namespace a; rank 1's daemon enters b
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    merged = json.loads((tmp_path / "n" / "results.json").read_text())
    ranks = [json.loads((tmp_path / "n" / f"rank-{i}.json").read_text()) for i in (0, 1)]
    assert sorted(x["run"]["host"] for x in ranks) == sorted(net.ns.values())  # two hosts, one per namespace
    assert sorted(d["host"] for d in merged["ranks_detail"]) == sorted(net.ns.values())
    assert merged["requests"]["completed"] == sum(x["requests"]["completed"] for x in ranks) > 0
    for tier in merged["bytes"]:
        for d in ("read", "write"):
            assert merged["bytes"][tier][d] == sum(x["bytes"][tier][d] for x in ranks)
    starts = [x["snapshot"]["window_ns"][0] + x["run"]["wall_offset_ns"] for x in ranks]
    assert abs(starts[0] - starts[1]) < 1e9, "ranks did not start together"
    assert os.listdir(cache) == []  # each rank's own directory (kvbench-n-r<rank>) made and removed
