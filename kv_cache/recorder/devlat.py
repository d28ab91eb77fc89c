"""The device's own latency: every block request of the storage tier's disk, from issue to completion.

The application's per-block latency (what fio calls clat) includes the kernel's file system, the page-cache
bypass and the queue in front of the device; the *device* latency is the block layer's view of the same work:
one block request (a block may be split into several), from ``block_rq_issue`` to ``block_rq_complete``,
measured in the kernel with eBPF (bpftrace on the two tracepoints), filtered on the disk that holds the cache
directory, and recorded into the same HDR histograms. Reads and writes are told apart by the request's rwbs
flags (R, W; flushes and discards are counted apart). Percentiles cover the measurement window; request counts
and bytes cover the whole run, to set beside the blocks the tier moved.

It needs root, bpftrace (``make install`` installs it as root) and the block tracepoints; where any is missing,
or the storage tier is not a local disk, ``unavailable`` says why in one line and no figure is made up.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time

from kv_cache.recorder.histogram import new_histogram, record, summary_ms

# {dev}: the disk's dev_t as the kernel encodes it (major << 20 | minor); the sector keys a request in flight.
# "attached" comes from a probe that fires once probes are attached: BEGIN fires before they are (bpftrace's
# manual), and a run that starts then loses its first block requests.
PROGRAM = """
tracepoint:block:block_rq_issue /args->dev == {dev}/ { @start[args->sector] = nsecs; }
tracepoint:block:block_rq_complete /args->dev == {dev}/ {
  $t = @start[args->sector];
  printf("%s %d %d\\n", args->rwbs, args->nr_sector, $t ? nsecs - $t : -1);
  delete(@start[args->sector]);
}
interval:ms:10 /@ready == 0/ { @ready = 1; printf("attached\\n"); }
END { clear(@start); clear(@ready); }
"""
TRACEFS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
START_S = 15.0  # bpftrace compiles and attaches in about half a second; a slow machine gets far longer


def whole_disk(directory: str) -> tuple[str, int, int] | str:
    """(name, major, minor) of the whole disk under directory (a partition's parent), or why there is none."""
    try:
        dev = os.stat(directory).st_dev
        path = os.path.realpath(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    except OSError as e:
        return f"{directory}: {e.strerror}"
    if not os.path.exists(path):
        return f"{directory} is not on a block device (tmpfs, overlay or a network file system)"
    if os.path.exists(os.path.join(path, "partition")):
        path = os.path.dirname(path)
    with open(os.path.join(path, "dev")) as f:
        major, minor = (int(x) for x in f.read().split(":"))
    return os.path.basename(path), major, minor


class DeviceLatency:
    """bpftrace running beside the run; window(True/False) marks the measurement window."""

    def __init__(self, directory: str | None):
        self.unavailable, self.proc, self.device = "", None, ""
        self.hists = {"read": new_histogram(), "write": new_histogram()}
        self.requests = {"read": 0, "write": 0, "other": 0}
        self.bytes = {"read": 0, "write": 0}
        self.lost, self.measuring = 0, False
        self.last_line = time.monotonic()
        self.unavailable = self._start(directory)

    def _start(self, directory: str | None) -> str:
        if directory is None:
            return "the storage tier is not a local disk"
        if os.geteuid() != 0:
            return "eBPF needs root"
        if shutil.which("bpftrace") is None:
            return "bpftrace is not installed (make install installs it as root)"
        if not any(os.path.isdir(f"{root}/events/block") for root in TRACEFS):
            return f"the block tracepoints are not visible (mount tracefs: mount -t tracefs tracefs {TRACEFS[0]})"
        disk = whole_disk(directory)
        if isinstance(disk, str):
            return disk
        self.device, major, minor = disk
        program = PROGRAM.replace("{dev}", str(major << 20 | minor))
        self.proc = subprocess.Popen(["bpftrace", "-e", program], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=dict(os.environ, BPFTRACE_PERF_RB_PAGES="1024"))
        ready = threading.Event()
        self.reader = threading.Thread(target=self._read, args=(ready,), name="devlat", daemon=True)
        self.reader.start()
        if not ready.wait(START_S):
            err = self._stop()
            return f"bpftrace did not attach to the block tracepoints ({err or f'no answer in {START_S:g} s'})"
        return ""

    def _read(self, ready: threading.Event) -> None:
        for line in self.proc.stdout:
            self.last_line = time.monotonic()
            if line.startswith("attached"):
                ready.set()
                continue
            parts = line.split()
            if len(parts) != 3 or not parts[2].lstrip("-").isdigit():
                if "Lost" in line:
                    self.lost += int("".join(c for c in line if c.isdigit()) or 0)
                continue
            flags = parts[0].lstrip("F")
            op = {"R": "read", "W": "write"}.get(flags[:1], "other")
            self.requests[op] += 1
            if op == "other":
                continue
            self.bytes[op] += int(parts[1]) * 512  # every completion's bytes, a partial one's too
            if self.measuring and int(parts[2]) >= 0:  # -1: no issue seen for its sector (the rest of a
                record(self.hists[op], int(parts[2]))  # request completed in parts, or issued before the trace)

    def window(self, measuring: bool) -> None:
        self.measuring = measuring

    def _stop(self) -> str:
        """Stop bpftrace; its first error line, if it failed."""
        if self.proc is None:
            return ""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.reader.is_alive():
            self.reader.join(5)
        err = [x for x in self.proc.stderr.read().splitlines() if x.strip() and "RLIMIT_MEMLOCK" not in x]
        self.lost += sum(int("".join(c for c in x if c.isdigit()) or 0) for x in err if "Lost" in x)
        self.proc = None
        return err[0][:200] if err else ""

    def summary(self) -> dict:
        """The device's latency (window) and its requests and bytes (whole run), or why there are none."""
        self._drain()
        self._stop()
        if self.unavailable:
            return {"unavailable": self.unavailable}
        return {"source": f"eBPF (bpftrace): block_rq_issue -> block_rq_complete on {self.device}",
                "device": self.device, "read": summary_ms(self.hists["read"]),
                "write": summary_ms(self.hists["write"]), "requests_whole_run": dict(self.requests),
                "bytes_whole_run": dict(self.bytes), "lost_events": self.lost}

    def _drain(self, quiet_s: float = 0.25, most_s: float = 3.0) -> None:
        """Wait until bpftrace has printed the run's last completions: no line for quiet_s (a loaded machine
        delays them; stopping it earlier loses them), at most most_s (another writer keeps the disk busy)."""
        end = time.monotonic() + most_s
        while self.proc is not None and time.monotonic() < end and time.monotonic() - self.last_line < quiet_s:
            time.sleep(0.05)

    def close(self) -> None:
        self._stop()
