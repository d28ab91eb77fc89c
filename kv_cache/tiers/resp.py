"""RESP replies read from a Valkey / Redis socket straight into a block's buffer (recv_into: the GIL released, no
copy through the client's parser): the Valkey medium's read path (valkey.py)."""

from __future__ import annotations

import socket
import time

import numpy as np

from kv_cache.errors import RunFault
from kv_cache.tiers.base import in_flight


def _exact(sock, n: int) -> bytes:
    data = b""
    while len(data) < n:
        got = sock.recv(n - len(data))
        if not got:
            raise ConnectionError("the server closed the connection")
        data += got
    return data


def _line(sock, most: int = 1024) -> bytes:
    """A reply's first line, without its CRLF, never read past (the value follows): peeked at, then taken to its
    end, two system calls (a byte at a time it was a dozen, each a GIL hand-off beside the other threads')."""
    try:
        seen = sock.recv(most, socket.MSG_PEEK)
    except ValueError:  # a TLS socket (rediss://) takes no flags
        seen = b""
    else:
        if not seen:
            raise ConnectionError("the server closed the connection")
    end = seen.find(b"\r\n")
    if end >= 0:
        return _exact(sock, end + 2)[:-2]
    line = b""  # TLS, or the line has not all arrived (a reply split inside its first line): a byte at a time
    while not line.endswith(b"\r\n"):
        if len(line) > most:
            raise ConnectionError(f"a reply line longer than {most} bytes: {line[:most]!r}")
        line += _exact(sock, 1)
    return line[:-2]


def bulk_into(sock, key: str, out: np.ndarray, url: str, policy: str) -> None:
    """One RESP bulk-string reply ($<n>CRLF<n bytes>CRLF) read into out, which must hold exactly n bytes."""
    head = _line(sock)
    if head[:1] == b"-":
        raise RunFault(f"{url} refused reading {key}: {head[1:].decode(errors='replace')}.")
    n = int(head[1:]) if head[:1] == b"$" else None
    if n is None or n != out.size:
        got = "gone" if n == -1 else f"{n:,} bytes instead of {out.size:,}" if n is not None else repr(head[:40])
        raise RunFault(f"{url}: key {key} the run wrote is {got} (maxmemory-policy {policy or '?'}: "
                       f"the server evicts or changed it; run with noeviction).")
    view = memoryview(out).cast("B")
    done = 0
    while done < n:
        got = sock.recv_into(view[done:], n - done)
        if not got:
            raise ConnectionError("the server closed the connection")
        done += got
    if _exact(sock, 2) != b"\r\n":
        raise RunFault(f"{url}: the reply for key {key} does not end where its length says.")


def outstanding(read_ahead: int, value_bytes: int, gets: int) -> int:
    """The GETs a batch keeps outstanding: read_ahead bytes of replies, one GET at least (0: every GET at once).
    Two at least had a second 32 MiB reply buffered in the server's memory while the first was read: a batch of 16
    read at 0.40 of the same GETs one by one, where one at a time reads at 0.99 (loopback's round trip is tens of
    microseconds against 10 ms a value)."""
    return max(1, read_ahead // max(value_bytes, 1)) if read_ahead else gets


def gets_ahead(conn, parts: list[tuple[int, str, np.ndarray]], ahead: int, url: str, policy: str) -> list[int]:
    """GET each part's key (parts: (block, key, the view its value fills)) on conn, a Valkey / Redis client
    connection, with at most `ahead` GETs outstanding: the next sent as each reply is read into its view (recv_into,
    the GIL released; the client's reply parser copies a value twice under the GIL: 4 threads' GETs of 2 MiB at
    0.70 of redis-benchmark that way). Not all at once: a server handed a whole batch of large GETs answered it
    slower than the same GETs one by one. Each part's arrival (monotonic ns), in order; the GETs' time outstanding,
    from each one's send to its reply read, is the batch's depth (in_flight)."""
    sent_at: list[int] = []
    arrived: list[int] = []

    def send(upto: int) -> None:
        first, now = len(sent_at), time.monotonic_ns()  # outstanding from its submission, as each medium counts
        conn.send_packed_command(conn.pack_commands([("GET", k) for _, k, _ in parts[first:upto]]))
        sent_at.extend([now] * (upto - first))

    send(min(ahead, len(parts)))
    for _, key, view in parts:
        bulk_into(conn._sock, key, view, url, policy)
        arrived.append(time.monotonic_ns())
        if len(sent_at) < len(parts):
            send(len(sent_at) + 1)
    in_flight(sum(a - s for a, s in zip(arrived, sent_at)))
    return arrived
