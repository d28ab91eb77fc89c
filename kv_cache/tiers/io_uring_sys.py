"""io_uring spoken through its two system calls (io_uring_setup, io_uring_enter) and the rings they map: no
native binding, so nothing compiled for one CPU's instructions (the liburing wheel carried AVX-512 and died by
SIGILL on an AVX2-only EPYC). x86-64 Linux only; the kernel's ABI is stable (include/uapi/linux/io_uring.h).

One Ring per thread: a batch of reads or writes is written into the submission queue, made visible by one store
of its tail, submitted and waited for in one io_uring_enter, and its completions reaped from the completion
queue. On x86-64 stores are not reordered with other stores, nor loads with other loads, which is the ordering
the ring protocol asks of user space (the kernel's side has its own barriers); a store of the tail after the
entries and a load of the completion tail before the entries are therefore enough.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import struct
import time

SYS_SETUP, SYS_ENTER = 425, 426  # x86-64 system call numbers
OFF_SQ_RING, OFF_CQ_RING, OFF_SQES = 0, 0x8000000, 0x10000000
FEAT_SINGLE_MMAP = 1
ENTER_GETEVENTS = 1
OP_NOP, OP_READ, OP_WRITE = 0, 22, 23  # IORING_OP_READ / WRITE: kernel 5.6 and later
SQE_BYTES, CQE_BYTES = 64, 16

_u32, _u64 = ctypes.c_uint32, ctypes.c_uint64


class _SqOffsets(ctypes.Structure):
    _fields_ = [(n, _u32) for n in ("head", "tail", "ring_mask", "ring_entries", "flags", "dropped", "array",
                                    "resv1")] + [("user_addr", _u64)]


class _CqOffsets(ctypes.Structure):
    _fields_ = [(n, _u32) for n in ("head", "tail", "ring_mask", "ring_entries", "overflow", "cqes", "flags",
                                    "resv1")] + [("user_addr", _u64)]


class _Params(ctypes.Structure):
    _fields_ = [(n, _u32) for n in ("sq_entries", "cq_entries", "flags", "sq_thread_cpu", "sq_thread_idle",
                                    "features", "wq_fd")] + [("resv", _u32 * 3), ("sq_off", _SqOffsets),
                                                             ("cq_off", _CqOffsets)]


class _Sqe(ctypes.Structure):
    _fields_ = [("opcode", ctypes.c_uint8), ("flags", ctypes.c_uint8), ("ioprio", ctypes.c_uint16),
                ("fd", ctypes.c_int32), ("off", _u64), ("addr", _u64), ("len", _u32), ("rw_flags", _u32),
                ("user_data", _u64), ("pad", _u64 * 3)]


class _Cqe(ctypes.Structure):
    _fields_ = [("user_data", _u64), ("res", ctypes.c_int32), ("flags", _u32)]


assert ctypes.sizeof(_Params) == 120 and ctypes.sizeof(_Sqe) == SQE_BYTES and ctypes.sizeof(_Cqe) == CQE_BYTES
# An entry written whole in one call, its unused fields zero: a third of the time of a memset and six ctypes field
# stores (0.33 against 1.0 us an entry; the ring's Python cost per I/O, issue 48). _Sqe/_Cqe above are the layout
# these formats must match (a test holds them equal).
SQE_FORMAT = struct.Struct("<BBHiQQIIQ24x")  # opcode, flags, ioprio, fd, off, addr, len, rw_flags, user_data
CQE_FORMAT = struct.Struct("<QiI")            # user_data, res, flags

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _check_platform() -> None:
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise OSError(0, f"io_uring's system calls are spoken here for x86-64 Linux only, not "
                         f"{platform.system()} {platform.machine()}")


class Ring:
    """An io_uring of `entries` submission slots: submit(ops) runs a batch of reads and writes and returns each
    one's result (bytes moved, or -errno), in the order given."""

    def __init__(self, entries: int):
        _check_platform()
        p = _Params()
        fd = _libc.syscall(SYS_SETUP, _u32(entries), ctypes.byref(p))
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"io_uring_setup: {os.strerror(err)}")
        self.fd, self.entries = fd, p.sq_entries
        # the arguments of io_uring_enter that never change, made once and passed by value: made per call, they took
        # an empty io_uring_enter from Python from 1.2 to 2.7 us (the ring enters about once every 2.5 I/Os)
        self._fd_arg, self._one, self._getevents, self._no_sig = \
            ctypes.c_uint(fd), ctypes.c_uint(1), ctypes.c_uint(ENTER_GETEVENTS), ctypes.c_size_t(0)
        self._maps: list[mmap.mmap] = []
        try:
            sq_len = p.sq_off.array + p.sq_entries * 4
            cq_len = p.cq_off.cqes + p.cq_entries * CQE_BYTES
            if p.features & FEAT_SINGLE_MMAP:
                sq = cq = self._map(max(sq_len, cq_len), OFF_SQ_RING)
            else:
                sq, cq = self._map(sq_len, OFF_SQ_RING), self._map(cq_len, OFF_CQ_RING)
            sqes = self._map(p.sq_entries * SQE_BYTES, OFF_SQES)
        except BaseException:
            self.close()
            raise
        self._sq_tail = _u32.from_buffer(sq, p.sq_off.tail)
        self._sq_mask = _u32.from_buffer(sq, p.sq_off.ring_mask).value
        # slot i of the submission ring always names entry i: set once here, as liburing does, not per entry
        sq_array = (_u32 * p.sq_entries).from_buffer(sq, p.sq_off.array)
        sq_array[:] = range(p.sq_entries)
        del sq_array  # a view would pin the map
        self._sqes = sqes
        self._cq_head = _u32.from_buffer(cq, p.cq_off.head)
        self._cq_tail = _u32.from_buffer(cq, p.cq_off.tail)
        self._cq_mask = _u32.from_buffer(cq, p.cq_off.ring_mask).value
        self._cq, self._cqes_at = cq, p.cq_off.cqes

    def _map(self, length: int, offset: int) -> mmap.mmap:
        m = mmap.mmap(self.fd, length, mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                      mmap.PROT_READ | mmap.PROT_WRITE, offset=offset)
        self._maps.append(m)
        return m

    def submit(self, ops: list[tuple[int, int, int, int, int]], completed: list | None = None) -> list[int]:
        """ops: (opcode, fd, file offset, buffer address, length), at most `entries` of them; all submitted with
        one system call that also waits for them. Returns each op's result. completed: a list of len(ops) given
        to know when each one completed (monotonic ns, as it is reaped): the calls then wait for one completion
        at a time, not for all."""
        n = len(ops)
        if not 0 < n <= self.entries:
            raise ValueError(f"a batch of {n} operations on a ring of {self.entries}")
        tail = self._sq_tail.value
        for k, op in enumerate(ops):
            self._queue(tail + k, op, k)
        self._sq_tail.value = (tail + n) & 0xFFFFFFFF  # the entries are written before the kernel sees the tail
        done = 0
        results = [0] * n
        while done < n:
            wait = n - done if completed is None else 1
            got = _libc.syscall(SYS_ENTER, self._fd_arg, ctypes.c_uint(n if done == 0 else 0),
                                ctypes.c_uint(wait), self._getevents, None, self._no_sig)
            if got < 0:
                err = ctypes.get_errno()
                if err == 4:  # EINTR: a signal (the run's Ctrl-C handler runs between calls)
                    continue
                raise OSError(err, f"io_uring_enter: {os.strerror(err)}")
            done += self._reap(results, completed)
        return results

    def stream(self, ops: list[tuple[int, int, int, int, int]], completed: list) -> tuple[list[int], int]:
        """ops, any number of them, with the ring kept full: up to `entries` in flight, each one reaped as it
        completes (its monotonic ns into completed[i]) and the next submitted in its place (fio's iodepth, where
        submit() waits for a whole round before the next). Returns each op's result, in the order given, and the sum
        of their submission times (monotonic ns: each op's is the system call that handed it to the kernel)."""
        n, results = len(ops), [0] * len(ops)
        sent = done = pending = submitted = 0  # pending: entries in the submission ring the kernel has not taken yet
        while done < n:
            tail, k = self._sq_tail.value, 0
            while sent < n and sent - done < self.entries:
                self._queue(tail + k, ops[sent], sent)
                sent, k = sent + 1, k + 1
            self._sq_tail.value = (tail + k) & 0xFFFFFFFF
            pending += k
            submitted += k * time.monotonic_ns()
            got = _libc.syscall(SYS_ENTER, self._fd_arg, ctypes.c_uint(pending), self._one, self._getevents, None,
                                self._no_sig)
            if got < 0:
                err = ctypes.get_errno()
                if err == 4:  # EINTR: nothing taken (the run's Ctrl-C handler runs between calls): again
                    continue
                raise OSError(err, f"io_uring_enter: {os.strerror(err)}")
            pending -= min(got, pending)  # io_uring_enter answers how many it took
            done += self._reap(results, completed)
        return results, submitted

    def _queue(self, at: int, op: tuple[int, int, int, int, int], user_data: int) -> None:
        """One (opcode, fd, file offset, buffer address, length) into the submission slot at position at; its
        completion comes back under user_data (its index in the caller's list)."""
        opcode, fd, off, addr, length = op
        SQE_FORMAT.pack_into(self._sqes, (at & self._sq_mask) * SQE_BYTES, opcode, 0, 0, fd, off, addr, length, 0,
                             user_data)

    def _reap(self, results: list[int], completed: list | None = None) -> int:
        head, tail, seen = self._cq_head.value, self._cq_tail.value, 0
        now = time.monotonic_ns() if completed is not None else 0
        cq, at, mask, unpack = self._cq, self._cqes_at, self._cq_mask, CQE_FORMAT.unpack_from
        while head != tail:
            user_data, res, _ = unpack(cq, at + (head & mask) * CQE_BYTES)
            results[user_data] = res
            if completed is not None:
                completed[user_data] = now
            head = (head + 1) & 0xFFFFFFFF
            seen += 1
        self._cq_head.value = head
        return seen

    def close(self) -> None:
        for name in ("_sq_tail", "_sqes", "_cq_head", "_cq_tail", "_cq"):
            self.__dict__.pop(name, None)  # ctypes views pin their map: released before it is closed
        for m in self._maps:
            m.close()
        self._maps = []
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def probe() -> str:
    """Why this host cannot run io_uring ("" when it can): a ring is made, a no-op completes, and a write then a read
    of a few bytes through it come back whole (rings came with Linux 5.1, their read and write operations with 5.6:
    a kernel between has rings that refuse every I/O the engine would submit)."""
    try:
        ring = Ring(2)
    except OSError as e:
        return f"io_uring is refused here ({e.strerror or e}; a container's seccomp profile blocks it)"
    try:
        if ring.submit([(OP_NOP, -1, 0, 0, 0)]) != [0]:
            return "the kernel's io_uring did not complete a no-op"
        return _moves_bytes(ring)
    except OSError as e:
        return f"io_uring is refused here ({e.strerror or e})"
    finally:
        ring.close()


def _moves_bytes(ring: Ring) -> str:
    """"" when a write and a read through ring move their bytes (a temporary file, buffered: any filesystem)."""
    import tempfile

    sent, got = ctypes.create_string_buffer(b"kvbench!", 8), ctypes.create_string_buffer(8)
    with tempfile.TemporaryFile() as f:
        wrote = ring.submit([(OP_WRITE, f.fileno(), 0, ctypes.addressof(sent), 8)])
        read = ring.submit([(OP_READ, f.fileno(), 0, ctypes.addressof(got), 8)])
    if wrote != [8] or read != [8] or got.raw != sent.raw:
        res = wrote[0] if wrote != [8] else read[0]
        why = os.strerror(-res) if res < 0 else f"{res} of 8 bytes, {got.raw!r}"
        return f"the kernel's io_uring does not read and write files ({why}: Linux 5.6 or later has them)"
    return ""
