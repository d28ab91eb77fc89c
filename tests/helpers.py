"""Checks shared by scenario, property and end-to-end tests."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import subprocess
import threading
from pathlib import Path


def assert_cache_consistent(cache) -> None:
    """Accounting never drifts: index, per-tier counters, tier slot maps and policies agree."""
    for i, t in enumerate(cache.tiers):
        in_tier = [e for e in cache.index.values() if e.tier == i]
        slots = sum(t.slots_for(e.nbytes) for e in in_tier)
        assert cache.used[i] == slots == t.slots.used_slots <= t.num_slots, cache.names[i]
        assert cache.leaving[i] == 0, cache.names[i]
        assert cache.policies[i].keys() == {e.key for e in in_tier}, cache.names[i]
        assert all(e.held == cache._blocked(e) for e in in_tier), cache.names[i]
        offered = set(cache.policies[i].candidates())
        assert offered == {e.key for e in in_tier if not e.held}, cache.names[i]
        assert all(e.pins >= 0 for e in in_tier)


def bench_module(name: str):
    """A script of bench/ as a module (bench/ is not a package; its scripts import each other by name)."""
    path = Path(__file__).resolve().parent.parent / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sentences(text: str) -> list[str]:
    """The sentences a program wrote on stderr: each starts a line, its continuation lines (wrapped at 100
    columns) are indented; whitespace joined."""
    out: list[str] = []
    for line in text.strip().splitlines():
        if line.startswith(" ") and out:
            out[-1] += " " + line.strip()
        elif line.strip():
            out.append(line.strip())
    return [" ".join(x.split()) for x in out]


def said(text: str) -> str:
    """What a person reads on the console, its lines joined: a sentence wrapped at 100 columns is one sentence."""
    return " ".join(text.split())


def sparse_trace(path: Path, size: int) -> Path:
    """A Mooncake trace of `size` bytes that takes none: 200 records (what is read of a file's start to tell it is
    text), then a hole."""
    path.write_text("".join(f'{{"timestamp": {i}, "input_length": 2048, "output_length": 10, "hash_ids": [{i}, 1, 2, '
                            f'3]}}\n' for i in range(200)))
    os.truncate(path, size)
    return path


def assert_clean_error(r, *fragments):
    """Exit 2 and one sentence on stderr (no traceback, no usage block) holding every fragment, wrapped at 100
    columns: its continuation lines indented."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = [x for x in r.stderr.strip().splitlines() if x]
    assert lines and not lines[0].startswith(" ") and all(x.startswith("    ") for x in lines[1:]), r.stderr
    assert all(len(x) <= 100 for x in lines) or any(len(w) > 90 for w in r.stderr.split()), r.stderr
    sentence = said(r.stderr)
    for f in fragments:
        assert f in sentence, r.stderr
    # one sentence a person reads: a memory budget's numbers are the longest (about 400 characters); issue 37's
    # tour met two of 663 (a results file's path said in every field, every known key listed)
    assert len(sentence) <= MOST_CHARACTERS, (len(sentence), sentence)


MOST_CHARACTERS = 480


def wait_for_line(proc, pattern: str, seconds: float = 120) -> None:
    """Read proc's stdout until a line matches pattern (a regular expression); proc ending first, or no match
    within seconds, fails the test: the deadline kills the process, so a silent one ends the blocking read too."""
    watchdog = threading.Timer(seconds, proc.kill)
    watchdog.start()
    try:
        while not re.search(pattern, proc.stdout.readline()):
            if proc.poll() is not None:
                raise AssertionError(f"{pattern!r} never came within {seconds:g} s (exit {proc.poll()})")
    finally:
        watchdog.cancel()


def assert_held_until_loaded(p: dict, d: dict) -> None:
    """A prefill node (results p) flat out into a space its decode node (d) could not keep up with: it waited for
    room (timed, "wait" on the handoff tier), no block went missing or read wrong, every request was loaded."""
    assert d["role"]["missing_blocks"] == 0 and d["verification"]["failures"] == 0
    assert d["requests"]["completed"] == p["requests"]["completed"] + p["warmup"]["requests"] > 0
    assert p["latency_ms"]["handoff"]["wait"]["count"] > 0  # 128 slots for 40 requests: it waited, and said so


@contextlib.contextmanager
def loop_filesystem(image: Path, point: Path, size: str, *mkfs: str):
    """ext4 (made with mkfs's options) on a loop device over a sparse file of size at image, mounted at point, as
    root: yields (the device's name, ""), or (None, why) where no loop device can be had (a container). The loop
    device is let go and the image removed whatever fails: what a run wrote through it, up to size of the disk, is
    not kept with a test's folder."""
    try:
        subprocess.run(["truncate", "-s", size, str(image)], check=True)
        loop = subprocess.run(["losetup", "-f", "--show", str(image)], capture_output=True, text=True)
        if loop.returncode != 0:
            yield None, loop.stderr.strip()
            return
        dev = loop.stdout.strip()
        try:
            point.mkdir()
            subprocess.run(["mkfs.ext4", "-q", *mkfs, dev], check=True)
            subprocess.run(["mount", dev, str(point)], check=True)
            yield Path(dev).name, ""
        finally:
            subprocess.run(["umount", str(point)], capture_output=True)
            subprocess.run(["losetup", "-d", dev], capture_output=True)
    finally:
        Path(image).unlink(missing_ok=True)
