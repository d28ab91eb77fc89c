"""What the remote tiers share: a store behind a URL, its run namespace and marker, and the tier over it.

Vocabulary: a *store* is one medium's client (Valkey keys, S3 objects) reduced to bytes: put an object, read one
into a caller's buffer, delete some, write and read a small one (the marker). A *namespace* is what one run writes
there (``kvbench-<run-id>``): the run touches no key or object outside it, removes all of it at the end (or marks it
kept with --keep-data). The namespace's bookkeeping is apart from the bytes: a store that can list its keys (a
``Listing``: Valkey's SCAN, S3's LIST) lets a run remove whatever its namespace holds and lets the next run against
the same URL find a killed run's namespace through its marker (``clean --remote-url``); a store that cannot (a
memcached) still plugs in: the tier's own key index (every block it holds, its slots) is what it removes at the
end, and a killed run's objects are left to the server's own eviction (said by ``clean``).

The URL is shown without its password everywhere (results, logs, settings.yaml, messages). A remote tier's
latency is the network and the server together: the output says so and never calls it a device.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable
from urllib.parse import urlsplit, urlunsplit

import numpy as np

from kv_cache import runlog
from kv_cache.errors import RunFault, ServerDown, UserError
from kv_cache.markers import Swept, leftover, marker_body, sweep
from kv_cache.tiers.base import BATCHES, REMOTE, STORAGE, SlottedTier, slots_of
from kv_cache.tiers.kinds import GiB, StackContext, TierKind, capacity_of, scheme_of
from kv_cache.tiers.null import NullTier

NAMESPACE = "kvbench-"
MARKER_OBJECT = ".kvbench-run.json"  # the marker of a namespace, as the marker file of a data directory
REMOTE_AUTO_MAX = 64 * GiB  # --remote-gb 0 where the server sets no bound (an object store): as the NVMe tier's


def redact(url: str) -> str:
    """url without its password (user names stay: they say which account ran)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = f"{parts.username}:" if parts.username else ":"
    host = parts.hostname or ""
    netloc = f"{user}****@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def medium_of(media, url: str) -> TierKind:
    """The TierKind (of catalog.Media media) serving url's scheme; an unknown scheme is one sentence naming those
    that are served."""
    kind = media.remote_kind(url)
    if kind is None:
        raise UserError(f"--remote-url {redact(url)}: no medium serves that scheme; use one of "
                        f"{media.schemes_served()}.")
    return kind


class Names:
    """How a store names a run's objects: <prefix>kvbench-<run-id><sep><key in hex>, and its marker
    <prefix>kvbench-<run-id><sep><marker leaf> (Valkey: "kvbench-<run>:<key>"; S3: "<prefix>kvbench-<run>/<key>")."""

    name_prefix, name_sep, marker_leaf = "", "/", MARKER_OBJECT

    def namespace(self, run_id: str) -> str:
        """What every name of the run's namespace starts with."""
        return f"{self.name_prefix}{NAMESPACE}{run_id}{self.name_sep}"

    def object_name(self, run_id: str, key: int) -> str:
        return f"{self.namespace(run_id)}{key:016x}"

    def marker_name(self, run_id: str) -> str:
        return self.namespace(run_id) + self.marker_leaf


class Store(Protocol):
    """One medium's client, as a remote tier uses it: bytes only; every call is bounded by the medium's timeout and
    raises RunFault (during a run) naming the URL, never the client's own exception."""

    url: str          # redacted
    version: str      # the server's name and version, for the output

    def check(self) -> None: ...                       # reachable, credentials and bucket/db good: else UserError
    def capacity_hint(self, slot_bytes: int) -> tuple[int, str]: ...  # (bytes the run may use, why): --remote-gb 0
    def put(self, name: str, data: np.ndarray) -> None: ...
    def get_into(self, name: str, out: np.ndarray) -> None: ...
    def delete(self, names: list[tuple[str, int]]) -> None: ...   # (name, bytes) of objects the run wrote
    def remove(self, names: list[str]) -> None: ...
    def object_name(self, run_id: str, key: int) -> str: ...  # Names gives both
    def marker_name(self, run_id: str) -> str: ...
    def write_small(self, name: str, data: bytes) -> None: ...
    def read_small(self, name: str) -> bytes | None: ...
    def close(self) -> None: ...


@runtime_checkable
class Listing(Protocol):
    """A store that can list its keys (the namespace's bookkeeping, apart from the bytes)."""

    def names(self, run_id: str) -> Iterator[str]: ...  # every name in the run's namespace, the marker's too
    def markers(self) -> Iterator[str]: ...           # the marker names of every run's namespace


class RemoteTier(SlottedTier):
    """A tier whose blocks are objects of a store: one key or object per block, in the run's namespace."""

    def __init__(self, name: str, store: Store, run_id: str, capacity_bytes: int, slot_bytes: int,
                 description: str):
        super().__init__(capacity_bytes // slot_bytes, slot_bytes)
        self.name, self.store, self.run_id = name, store, run_id
        self.flags = frozenset({STORAGE, REMOTE} | ({BATCHES} if hasattr(store, "get_many_into") else set()))
        self.description = description
        self.down = ""  # why the server stopped answering: the run's later calls fail at once, not each after
        self.mark()     # its timeout (a frozen server's stop took 4-5 timeouts of in-flight calls)

    def mark(self) -> None:
        """The namespace's marker: this run's, running (clean finds it if the run is killed)."""
        mark_namespace(self.store, self.run_id)

    def _call(self, op, *args):
        if self.down:
            raise ServerDown(self.down)
        try:
            return op(*args)
        except ServerDown as e:
            self.down = str(e)
            raise

    def put(self, key: int, buf: np.ndarray) -> None:
        self.slots.alloc(key, buf.size)
        try:
            self._call(self.store.put, self.store.object_name(self.run_id, key), buf)
        except BaseException:
            self.slots.release(key)
            raise

    def held_bytes(self, key: int, out: np.ndarray) -> int:
        """The bytes of key's object: those its slots hold (a shared namespace: another run's block is out's size)."""
        return self.slots.lookup(key)[1]

    def get(self, key: int, out: np.ndarray) -> None:
        nbytes = self.held_bytes(key, out)
        self._call(self.store.get_into, self.store.object_name(self.run_id, key), out[:nbytes])

    def batch_path(self) -> str:
        return self.store.batch if BATCHES in self.flags else super().batch_path()

    def put_many(self, items: list[tuple[int, np.ndarray]]) -> list:
        """A store with a batch path (a Valkey pipeline) takes the batch in one round trip; a block's result is
        its reply's arrival, or its error."""
        if BATCHES not in self.flags:
            return super().put_many(items)
        out, sent = [None] * len(items), []
        for n, (key, buf) in enumerate(items):
            try:
                self.slots.alloc(key, buf.size)
                sent.append(n)
            except Exception as e:  # noqa: BLE001 - this block's result
                out[n] = e
        done = self._call(self.store.put_many, [(self.store.object_name(self.run_id, items[n][0]), items[n][1])
                                                for n in sent])
        for n, d in zip(sent, done):
            out[n] = d
            if isinstance(d, BaseException):
                self.slots.release(items[n][0])
        return out

    def get_many(self, items: list[tuple[int, np.ndarray]]) -> list:
        if BATCHES not in self.flags:
            return super().get_many(items)
        out, asked = [None] * len(items), []
        for n, (key, buf) in enumerate(items):
            try:
                asked.append((n, buf[:self.held_bytes(key, buf)]))
            except Exception as e:  # noqa: BLE001 - this block's result
                out[n] = e
        done = self._call(self.store.get_many_into, [(self.store.object_name(self.run_id, items[n][0]), view)
                                                     for n, view in asked])
        for (n, _), d in zip(asked, done):
            out[n] = d
        return out

    def delete(self, key: int) -> None:
        _, nbytes = self.slots.release(key)
        self._call(self.store.delete, [(self.store.object_name(self.run_id, key), nbytes)])

    def close(self, remove: bool = True) -> None:
        """Remove every object of the run's namespace (its marker last), or mark it kept."""
        try:
            if remove:
                remove_run(self.store, self.run_id, self.slots.keys())
            else:
                mark_namespace(self.store, self.run_id, "kept")
        except (RunFault, UserError) as e:  # the server is gone or silent: say what stays there, and how to go
            what = "could not remove this run's objects from" if remove else "could not mark this run's objects kept in"
            runlog.tell(f"{what} {self.store.url} ({str(e).rstrip('.')}); once the server answers, "
                        f"`kv_cache_benchmark.py clean --remote-url {self.store.url}` removes them.")
        finally:
            self.store.close()


def mark_namespace(store: Store, run_id: str, state: str = "running") -> None:
    store.write_small(store.marker_name(run_id), json.dumps(marker_body(run_id, state)).encode())


def remove_run(store: Store, run_id: str, held: Iterable[int] = ()) -> int:
    """Delete every name of a run's namespace, the marker last (a crash midway leaves it findable): those the store
    lists, or, from a store that cannot list, the objects of held (the keys the run's tier holds: its own index)."""
    marker = store.marker_name(run_id)
    if isinstance(store, Listing):
        names = [n for n in store.names(run_id) if n != marker]
    else:
        names = [store.object_name(run_id, k) for k in held]
    for i in range(0, len(names), 1000):
        store.remove(names[i:i + 1000])
    store.remove([marker])
    return len(names)


@dataclass(frozen=True)
class RemoteLeftover:
    run_id: str
    pid: int
    host: str
    started: float
    objects: int
    other_host: bool
    kept: bool = False  # kept on purpose (--keep-data): listed only by clean --kept

    def describe(self, url: str) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started)) if self.started else "?"
        return (f"{url}: {self.objects:,} objects of run {self.run_id} (pid {self.pid} on {self.host}, "
                f"started {when}" + (", kept with --keep-data)" if self.kept else ")"))


def dead_namespaces(store: Store, this_run: str = "", kept: bool = False) -> list[RemoteLeftover]:
    """Namespaces whose marker says running while its run is gone (or on another host); with kept, also those
    kept on purpose (--keep-data). None from a store that cannot list its keys (see the module docstring)."""
    out: list[RemoteLeftover] = []
    if not isinstance(store, Listing):
        return out
    for name in store.markers():
        raw = store.read_small(name)
        try:
            m = json.loads(raw) if raw else None
        except ValueError:
            m = None
        other_host = leftover(m, kept)
        if other_host is None or m.get("run_id") == this_run:
            continue
        objects = sum(1 for _ in store.names(str(m.get("run_id")))) - 1
        out.append(RemoteLeftover(str(m.get("run_id")), int(m.get("pid", -1)), str(m.get("host")),
                                  float(m.get("started") or 0), objects, other_host, m.get("state") == "kept"))
    return out


def dead_namespaces_note(store: Store, run_id: str) -> str:
    dead = [x for x in dead_namespaces(store, run_id) if not x.other_host]
    if not dead:
        return ""
    runs = ", ".join(x.run_id for x in dead[:3]) + (" ..." if len(dead) > 3 else "")
    return (f"{len(dead)} killed run(s) left {sum(x.objects for x in dead):,} objects in {store.url} ({runs}); "
            f"remove them with `kv_cache_benchmark.py clean --remote-url {store.url}`.")


def clean_namespaces(store: Store, other_hosts: bool, dry_run: bool, say, kept: bool = False) -> Swept:
    """Remove the namespaces dead runs left in store (of other hosts too with other_hosts, kept ones too with
    kept); what it removed, and the kept ones it left."""
    if not isinstance(store, Listing):
        say(f"{store.url}: this store cannot list its keys, so no killed run's objects can be found there; its own "
            f"eviction reclaims them.")
        return Swept()
    return sweep(dead_namespaces(store, kept=True), other_hosts, dry_run, say, lambda x: remove_run(store, x.run_id),
                 lambda x: x.describe(store.url), kept)


def build_remote(ctx: StackContext, kind: TierKind, open_store, shared_tier=None) -> tuple[SlottedTier | None, str]:
    """The remote tier a builder makes from --remote-url: its store opened and checked, its size chosen, the
    leftovers of killed runs said. open_store(url, section, lanes) -> Store; shared_tier: the medium's tier for a
    namespace shared with other runs (--remote-namespace; None: it cannot share one)."""
    s, slot, name = ctx.settings, ctx.slot_bytes, kind.name
    if ctx.null_io:
        return NullTier(name, capacity_of(s.remote_gb, slot) or REMOTE_AUTO_MAX, slot), ""
    store = open_store(s.remote_url, ctx.section(kind), ctx.lanes)
    try:
        store.check()
        if s.remote_gb:
            cap, why = capacity_of(s.remote_gb, slot), ""
        else:
            hint, reason = store.capacity_hint(slot)
            cap = hint // slot * slot
            why = (f"{name} tier size chosen: {cap / GiB:.2f} GiB ({reason}); --remote-gb fixes it (settings.yaml "
                   f"records it)")
        if cap < ctx.max_object_bytes:  # a given size is too small, or the server has too little room
            fix = (f"raise --remote-gb to at least {ctx.max_object_bytes / GiB:.3f}" if s.remote_gb else
                   "give the server more memory (its maxmemory); --remote-gb cannot exceed what it has")
            raise UserError(f"--remote-url {store.url}: {cap / GiB:.3f} GiB holds no "
                            f"{ctx.max_object_bytes / 2**20:.1f} MiB object; {fix}.")
        shared = s.remote_namespace
        if shared and (shared_tier is None or not isinstance(store, Listing)):
            raise UserError(f"--remote-namespace needs a store that lists its names (its members are markers "
                            f"there), and {store.url} cannot; use a Valkey or S3 URL, or drop --remote-namespace.")
        tier_class, run_id = (shared_tier, shared_tier.id_for(shared)) if shared else (RemoteTier, ctx.run_id)
        notes = [n for n in (why, getattr(store, "warning", ""), dead_namespaces_note(store, run_id)) if n]
        tier = tier_class(name, store, run_id, cap, slot,
                          f"{store.url} ({store.version}): network + server, not a device; one object per block in "
                          f"namespace {NAMESPACE}{run_id}" + (" (shared with every run naming it)" if shared else "")
                          + f", {slots_of(cap // slot, slot)}")
    except BaseException:
        store.close()
        raise
    return tier, "; ".join(notes)



class Unlisted:
    """A store seen without its listing: how a medium that cannot list its keys (a memcached) runs. The contract
    test runs a real Valkey server so (variant "unlisted"): the tier's own key index must remove every object."""

    def __init__(self, store: Store):
        self._store = store

    def __getattr__(self, name: str):
        if name in ("names", "markers"):
            raise AttributeError(name)
        return getattr(self._store, name)


def contract_tier(name: str, store: Store, variant: str, directory: str, capacity_bytes: int,
                  slot_bytes: int, tier_class: type = RemoteTier) -> RemoteTier:
    """The contract test's tier over a checked store, in a namespace of its own per variant and test folder."""
    store.check()
    run_id = f"contract-{variant}-{abs(hash(directory)) % 10**8}"
    return tier_class(name, store, run_id, capacity_bytes, slot_bytes, f"{store.url} (contract)")


def remote_medium(name: str, schemes: tuple[str, ...], open_store, section: type, shared_tier=None,
                  **hooks) -> TierKind:
    """A remote medium's declaration: the tier of --remote-url when its scheme is one of schemes. Its size is
    --remote-gb (0: chosen from the server, written back into tiers.remote_gb); shared_tier: its tier for a
    namespace shared by several runs (remote_shared.py), if it has one; hooks: contract, make_for_test,
    local_server (see TierKind)."""
    def most_bytes(s) -> int:
        if scheme_of(s.remote_url) not in schemes:
            return 0
        return int(s.remote_gb * GiB) if s.remote_gb else REMOTE_AUTO_MAX

    def resolved(s, tier) -> dict:
        return {} if s.remote_gb else {"tiers.remote_gb": tier.capacity_bytes / GiB}

    def build(ctx: StackContext):
        if scheme_of(ctx.settings.remote_url) not in schemes:
            return None, ""
        return build_remote(ctx, kind, open_store, shared_tier)

    kind = TierKind(name, 3, build, most_bytes=most_bytes, resolved=resolved, schemes=schemes, open_store=open_store,
                    section=section, **hooks)
    return kind
