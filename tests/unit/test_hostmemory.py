"""The memory a run may take is its memory cgroup's room when that is smaller than the host's available memory
(a container's /proc/meminfo is the host's: a pod limited to 8 GiB on a large host passed every check)."""

from pathlib import Path

from kv_cache.hostmemory import available_bytes, cgroup_room

GiB = 2**30


def _write(folder: Path, files: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)


def test_cgroup_v2_room_is_its_limit_less_what_it_cannot_reclaim(tmp_path):
    root = tmp_path / "cg"
    _write(root, {"cgroup.controllers": "cpu memory\n"})
    _write(root / "pod" / "ctr", {"memory.max": str(8 * GiB), "memory.current": str(3 * GiB),
                                  "memory.stat": f"anon 1\ninactive_file {GiB}\n"})
    proc = tmp_path / "cgroup"
    proc.write_text("0::/pod/ctr\n")
    assert cgroup_room(root, proc) == 6 * GiB  # 8 - (3 - 1 reclaimable)
    assert available_bytes(root, proc) <= 6 * GiB


def test_the_tightest_ancestor_limits(tmp_path):
    root = tmp_path / "cg"
    _write(root, {"cgroup.controllers": "memory\n"})
    _write(root / "slice", {"memory.max": str(2 * GiB), "memory.current": str(GiB // 2)})
    _write(root / "slice" / "job", {"memory.max": "max", "memory.current": str(GiB // 4)})
    proc = tmp_path / "cgroup"
    proc.write_text("0::/slice/job\n")
    assert cgroup_room(root, proc) == 2 * GiB - GiB // 2


def test_cgroup_v1_and_no_limit(tmp_path):
    root = tmp_path / "cg"
    _write(root / "memory" / "docker" / "abc", {"memory.limit_in_bytes": str(4 * GiB),
                                                "memory.usage_in_bytes": str(GiB),
                                                "memory.stat": "total_inactive_file 0\n"})
    proc = tmp_path / "cgroup"
    proc.write_text("12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n")
    assert cgroup_room(root, proc) == 3 * GiB
    (root / "memory" / "docker" / "abc" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert cgroup_room(root, proc) is None  # v1's "no limit"
    proc.write_text("0::/\n")  # v2 named, but no v2 hierarchy mounted there: nothing to read
    assert cgroup_room(root, proc) is None


def _limited_cgroup(tmp_name: str, limit: int):
    """A memory cgroup of its own with limit bytes ((folder, the file a pid is written to) or None where this
    machine does not let the test make one: not root, no memory controller, no delegation)."""
    import os

    if os.geteuid() != 0:
        return None
    v2, v1 = Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/memory")
    for mount, limit_file in ((v2, "memory.max"), (v1, "memory.limit_in_bytes")):
        if mount == v2 and not (v2 / "cgroup.controllers").exists():
            continue
        if mount == v1 and not (v1 / "memory.limit_in_bytes").exists():
            continue
        folder = mount / tmp_name
        try:
            folder.mkdir()
        except OSError:
            continue
        try:
            (folder / limit_file).write_text(str(limit))
            return folder
        except OSError:
            folder.rmdir()
    return None


def test_a_run_in_a_small_memory_cgroup_is_refused_with_its_room(tmp_path):
    """A run whose CPU tier fits the host but not its cgroup: refused before it allocates, the cgroup named (it was
    killed by the cgroup's OOM killer while pre-touching its CPU tier)."""
    import os
    import subprocess
    import sys

    import pytest
    from conftest import REPO, SMALL

    folder = _limited_cgroup(f"kvbench-test-{os.getpid()}", GiB)
    if folder is None:
        pytest.skip("this machine does not let the test make a memory cgroup (root and a memory controller needed)")
    try:
        cmd = [sys.executable, str(REPO / "kv_cache_benchmark.py"), "--config", str(SMALL), "--cpu-mem-gb", "2",
               "--output-dir", str(tmp_path), "--cache-dir", str(tmp_path), "--run-id", "c", "--max-requests", "2"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                           preexec_fn=lambda: (folder / "cgroup.procs").write_text(str(os.getpid())))
    finally:
        folder.rmdir()
    said = " ".join(r.stderr.split())
    assert r.returncode == 2, (r.returncode, said[-2000:])
    assert "memory budget" in said and "memory cgroup" in said and "Traceback" not in said, said[-2000:]


def test_an_address_space_limit_the_budget_cannot_see_is_one_sentence(tmp_path):
    """ulimit -v below the CPU tier: the budget (the host's memory) passed and the arena's mmap failed with ENOMEM,
    an internal error; now one sentence naming the limit, exit 2, nothing left behind."""
    import resource
    import subprocess
    import sys

    from conftest import REPO, SMALL

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (3 * GiB, 3 * GiB))

    cmd = [sys.executable, str(REPO / "kv_cache_benchmark.py"), "--config", str(SMALL), "--cpu-mem-gb", "4",
           "--output-dir", str(tmp_path / "out"), "--cache-dir", str(tmp_path), "--run-id", "u", "--max-requests", "2"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, preexec_fn=limit)
    said = " ".join(r.stderr.split())
    assert r.returncode == 2, (r.returncode, said[-2000:])
    assert "ulimit -v" in said and "internal error" not in said, said[-2000:]
    assert not (tmp_path / "out" / "u").exists() and [p.name for p in tmp_path.iterdir()] in ([], ["out"])
