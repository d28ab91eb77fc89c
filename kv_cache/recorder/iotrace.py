"""--io-trace: every block operation as one CSV row, and a fio job file approximating the mix.

Columns: intended_start_s (the request's intended start), start_s, latency_ms, op, tier, bytes,
key (hex), phase, measured (0 during warm-up). Times are seconds since the run started. Workers
only enqueue a tuple; one background thread formats and writes (zstd-compressed when the file
name ends in .zst), so tracing adds no I/O to a timed operation.
"""

from __future__ import annotations

import csv
import io
import os
import queue
import threading
import time
from collections import Counter
from pathlib import Path

from kv_cache.errors import UserError
from kv_cache.safefiles import write_file

COLUMNS = ("intended_start_s", "start_s", "latency_ms", "op", "tier", "bytes", "key", "phase", "measured")
# the MLPerf reference's --io-trace-log (its own docs: io_trace_log_usage.md in the reference's repository): one
# row per KV object I/O
MLPERF_COLUMNS = ("Timestamp", "Operation", "Object_Size_Bytes", "Tier", "Key", "Phase")
MLPERF_OPS = {"write": ("Write", "Prefill"), "read": ("Read", "Decode"), "donor_read": ("Read", "Decode"),
              "demote": ("Write", "Evict"), "promote": ("Write", "Decode")}  # evict (a delete) moves no bytes


SYNC_ENGINES = ("psync", "sync", "pvsync", "pvsync2", "mmap")  # fio's engines with one I/O a job in flight


def mlperf_tier(tier: str, storage_tier: str) -> str:
    """Its three tiers: Tier-0 GPU, Tier-1 CPU, Tier-2 the storage (ours: the bottom tier)."""
    return {"gpu": "Tier-0", "cpu": "Tier-1"}.get(tier, "Tier-2" if tier == storage_tier else tier)


def _stem_and_ext(name: str) -> tuple[str, str]:
    """A trace's name split before its .csv / .zst / .csv.zst ending (the ending a reader picks its format by)."""
    for ext in (".csv.zst", ".zst", ".csv"):
        if name.endswith(ext) and len(name) > len(ext):
            return name[:-len(ext)], ext
    return name, ""


def marked_trace_path(trace: str, marks: str) -> str:
    """One trial's or rank's trace: marks (".trial2.rank0") go before the ending, so ops.csv.zst becomes
    ops.trial2.rank0.csv.zst, still a compressed CSV by its name (it was ops.csv.trial2.rank0.zst)."""
    head, name = os.path.split(trace)
    stem, ext = _stem_and_ext(name)
    return os.path.join(head, stem + marks + ext)


def fio_job_path(trace) -> Path:
    """The fio job written beside a trace: its name without .zst and .csv, then .fio."""
    trace = Path(trace)
    return trace.with_name(_stem_and_ext(trace.name)[0] + ".fio")


class IOTraceWriter:
    """Background CSV writer of block operations; also tallies the NVMe mix for the fio job."""

    def __init__(self, path: str, t0_ns: int, storage_tier: str, schema: str = "kv-cache-bench"):
        self.path, self.t0_ns, self.storage_tier = Path(path), t0_ns, storage_tier  # the fio job's tier
        self.mlperf = schema == "mlperf"
        self.t0_wall = time.time() - (time.monotonic_ns() - t0_ns) / 1e9  # its Timestamp is the Unix time
        try:
            if self.path.suffix == ".zst":
                import zstandard

                self._raw = open(self.path, "xb")
                self._zst = zstandard.ZstdCompressor(level=3).stream_writer(self._raw)
                self._file = io.TextIOWrapper(self._zst, encoding="utf-8", newline="")
            else:
                self._file = open(self.path, "x", newline="", encoding="utf-8")
        except FileExistsError:
            raise UserError(f"--io-trace {path} exists; pass a new file name (a trace is never written over an "
                            f"existing file).") from None
        except OSError as e:
            raise UserError(f"--io-trace {path}: cannot write there ({e.strerror}).") from None
        self._csv = csv.writer(self._file)
        self.failed = ""  # why the trace stopped (a full filesystem): a side output fails alone
        try:  # its header reaches the filesystem now: one full from the start is said before the run
            self._csv.writerow(MLPERF_COLUMNS if self.mlperf else COLUMNS)
            self._file.flush()
            if self.path.suffix == ".zst":
                self._zst.flush()
        except OSError as e:
            self._discard()
            raise UserError(f"--io-trace {path}: cannot write there ({e.strerror}); free space or name another "
                            f"file.") from None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.sizes: Counter = Counter()   # storage tier's (op kind, bytes) -> count
        self.rows = 0
        self._thread = threading.Thread(target=self._drain, name="io-trace", daemon=True)
        self._thread.start()

    def op(self, intended_ns, start_ns, op, tier, nbytes, key, dur_ns, phase, measured: bool) -> None:
        self._queue.put((intended_ns, start_ns, op, tier, nbytes, key, dur_ns, phase, measured))

    def _discard(self) -> None:
        """The file made for the trace goes (nothing of it was written)."""
        try:
            self._file.close()
        except OSError:
            pass
        self.path.unlink(missing_ok=True)

    def _drain(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if self.failed:
                continue  # the rows after a failed write are dropped: the run goes on
            try:
                self._row(item)
            except OSError as e:
                self.failed = f"{e.strerror or e} after {self.rows:,} rows"

    def _row(self, item: tuple) -> None:
        t0 = self.t0_ns
        intended, start, op, tier, nbytes, key, dur, phase, measured = item
        if not self.mlperf:
            self._csv.writerow((f"{(intended - t0) / 1e9:.6f}", f"{(start - t0) / 1e9:.6f}", f"{dur / 1e6:.4f}",
                                op, tier, nbytes, f"{key:016x}", phase, int(measured)))
        elif op in MLPERF_OPS:
            operation, ref_phase = MLPERF_OPS[op]
            self._csv.writerow((f"{self.t0_wall + (start - t0) / 1e9:.6f}", operation, nbytes,
                                mlperf_tier(tier, self.storage_tier), f"{key:016x}", ref_phase))
        self.rows += 1
        if tier == self.storage_tier and op != "evict":
            self.sizes[("read" if op == "read" else "write", nbytes)] += 1

    def close(self) -> None:
        """Ends the trace; a write that failed on the way (or at the last flush) is in `failed`, never raised: the
        run's results do not depend on a side output."""
        self._queue.put(None)
        self._thread.join()
        try:
            self._file.close()
        except OSError as e:
            self.failed = self.failed or f"{e.strerror or e} at its last {self.rows:,} rows' flush"

    def fio_job(self, directory: str, fio: tuple[str, int, bool], workers: int, runtime_s: float,
                capacity_bytes: int, depth: int = 1) -> Path:
        """A fio job file beside the trace that approximates the NVMe tier's measured mix; fio: the engine's
        (ioengine, direct, fsync after each write), from its table; depth: the most I/Os a worker kept in flight
        (its batches on its engine: a synchronous engine's pool threads are as many fio jobs, a ring its iodepth)."""
        ioengine, direct, fsync = fio
        jobs, iodepth = (workers * depth, 1) if ioengine in SYNC_ENGINES else (workers, depth)
        reads = sum(n * b for (kind, b), n in self.sizes.items() if kind == "read")
        writes = sum(n * b for (kind, b), n in self.sizes.items() if kind == "write")
        bs = max(self.sizes, key=self.sizes.get)[1] if self.sizes else 4096
        mix = round(100 * reads / (reads + writes)) if reads + writes else 0
        size = max(capacity_bytes // max(jobs, 1) // bs * bs, bs)  # the jobs' files together span the tier
        path = fio_job_path(self.path)
        write_file(path,
            f"; fio job approximating the NVMe I/O mix kv-cache-bench measured ({self.rows:,} operations traced)\n"
            f"; read {reads:,} B, written {writes:,} B (demotions included); most common block size {bs:,} B\n"
            f"; {workers} workers x {depth} I/Os in flight each: {jobs} jobs at iodepth {iodepth}\n"
            f"; fio lays out {jobs} files of {size:,} B in {directory} (the tier's {capacity_bytes:,} B) and leaves "
            f"them there: rm {directory}/kv-cache-mix.* after\n"
            f"; run: fio {path.name}\n"
            "[global]\n"
            f"directory={directory}\nioengine={ioengine}\ndirect={direct}\n"
            f"rw=randrw\nrwmixread={mix}\nbs={bs}\nsize={size}\n"
            f"numjobs={jobs}\niodepth={iodepth}\ntime_based\nruntime={max(int(runtime_s), 1)}\ngroup_reporting\n"
            + ("fsync=1\n" if fsync else "")
            + "\n[kv-cache-mix]\n")
        return path
