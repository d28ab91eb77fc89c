"""The disaggregated roles, composed from settings: which handoff transport (a folder, or NIXL), its sides for
a prefill and a decode node, the decode node's traffic, and the role's end (part of the composition root)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import psutil

from kv_cache.config import Settings
from kv_cache.errors import UserError
from kv_cache.lifecycle.handoff import Loader, Publisher, check_header
from kv_cache.lifecycle.handoff.agent import parse_url
from kv_cache.lifecycle.handoff.folder import FOLDER, MANIFEST, FolderLoader, FolderPublisher, mark_reading
from kv_cache.lifecycle.handoff.nixl import NixlLoader, NixlPublisher
from kv_cache.run.budget import HEADROOM
from kv_cache.sources.decode_arrivals import ManifestFollower, RecordFollower, wait_for_manifest
from kv_cache.tiers.fsinfo import probe_direct


def handoff_identity(s: Settings, model_name: str) -> dict:
    return {"model": model_name, "kv_dtype": s.model.kv_dtype, "tp": s.model.tp,
            "block_tokens": s.model.block_tokens, "seed": s.run.seed}


def handoff_target(s: Settings, transports: dict) -> tuple[str, str]:
    """("file", DIR), ("nixl", URL) or ("", ""): --handoff-dir DIR and --handoff file://DIR are one thing.
    transports: the registry's, by name."""
    d = s.disagg
    if d.handoff and d.handoff_dir:
        raise UserError("--handoff and --handoff-dir name the same thing; give one of them.")
    t = next((t for t in transports.values() if d.handoff.startswith(t.scheme)), None)
    if t is not None and t.name == "file":
        return "file", t.address(d.handoff)
    if t is not None:
        parse_url(d.handoff)
        return t.name, d.handoff
    if d.handoff:
        raise UserError(f"--handoff {d.handoff}: expected " + " or ".join(t.form for t in transports.values()) + ".")
    return ("file", d.handoff_dir) if d.handoff_dir else ("", "")


def nixl_region_bytes(s: Settings, transports: dict) -> int:
    """The host memory a NIXL prefill node registers as its handoff space (--disagg-handoff-gb, sized by
    size_handoff first); 0 for any other node (a decode node reads into its workers' buffers; a folder's handoff is
    files; a region in GPU memory is not host memory)."""
    if s.disagg.role != "prefill" or handoff_target(s, transports)[0] != "nixl" or s.disagg.handoff_memory == "gpu":
        return 0
    return int(s.disagg.handoff_gb * 2**30)


AUTO_MEMORY_SHARE = 0.5  # auto: a NIXL host region takes at most half the machine's memory, less the rest
AUTO_DISK_SHARE = 0.25   # auto: a handoff folder takes at most a quarter of its filesystem
AUTO_HBM_SHARE = 0.25    # auto: a NIXL region in HBM takes at most a quarter of GPU 0's (the GPU tier has its own)
AUTO_MAX_BYTES = 64 << 30
UNKNOWN_LONGEST = 32768  # a trace's longest prompt before it is read, unless --max-prompt-tokens bounds it


def longest_prompt(s: Settings) -> tuple[int, str]:
    """(tokens, where the figure comes from) of the longest prompt one worker may publish at once."""
    if s.trace.path:
        if s.trace.max_prompt_tokens:
            return s.trace.max_prompt_tokens, "--max-prompt-tokens"
        return UNKNOWN_LONGEST, "a trace's prompts assumed at most"
    return max(getattr(s.profiles, n).max_context_tokens for n in s.profiles.__dataclass_fields__), "the profiles'"


def _auto_cap(s: Settings, transports: dict, rest_of_budget: int, per: int, gpu=None) -> tuple[int, str]:
    """(bytes, what bounds it) of an auto handoff space: fixed facts of the host (its memory, the filesystem's
    size), never what is free right now, so a neighbour's load does not change the choice. per: one request's
    blocks: a NIXL region that half the memory cannot hold takes one request's room where the budget can."""
    kind = handoff_target(s, transports)[0]
    if kind == "nixl" and s.disagg.handoff_memory == "host":
        total = psutil.virtual_memory().total
        half = max(0, int(total * AUTO_MEMORY_SHARE) - rest_of_budget)
        if half < per <= int(total * HEADROOM) - rest_of_budget:
            return per, (f"one request's room: half of this machine's {total / 2**30:.1f} GiB of memory less the "
                         f"rest of the budget cannot hold it")
        return half, f"half of this machine's {total / 2**30:.1f} GiB of memory less the rest of the budget"
    if kind == "nixl":  # in HBM: a quarter of the first device's, at most 64 GiB (the GPU tier takes its own part)
        hbm = gpu.total_bytes(0) if gpu is not None else 0
        return min(AUTO_MAX_BYTES, int(hbm * AUTO_HBM_SHARE)), f"a quarter of GPU 0's {hbm / 2**30:.0f} GiB of HBM"
    st = os.statvfs(os.path.abspath(handoff_target(s, transports)[1]))
    disk = st.f_blocks * st.f_frsize
    return min(AUTO_MAX_BYTES, int(disk * AUTO_DISK_SHARE)), f"a quarter of the folder's {disk / 2**30:.1f} GiB"


@dataclass(frozen=True)
class HandoffSize:
    """A prefill node's handoff space and the publishing workers it holds whole."""

    space_bytes: int
    workers: int  # at most this many workers publish at once (each one request's blocks, held until loaded)
    note: str     # what the space holds, said where it lowers the workers


def size_handoff(s: Settings, transports: dict, slot_bytes: int, workers: int, rest_of_budget: int,
                 gpu=None) -> HandoffSize | None:
    """A prefill node's space (auto or --disagg-handoff-gb) and how many workers it holds: each worker publishes
    one request at a time and its blocks are held until a decode node loads them, so a space smaller than the
    workers' longest prompts runs fewer workers (said in one line); one that holds no request whole is refused.
    workers: the most the run may have; rest_of_budget: the memory budget without the space; gpu: the real GPU
    tier's backend (a region in HBM is sized from it). None: no prefill node, or a settings' check refuses the
    transport later."""
    if s.disagg.role != "prefill" or not s.model.block_tokens or not handoff_target(s, transports)[0]:
        return None
    if handoff_target(s, transports)[0] == "file":
        _handoff_root(s, transports)
    longest, source = longest_prompt(s)
    per = -(-longest // s.model.block_tokens) * slot_bytes
    given = int(s.disagg.handoff_gb * 2**30)
    if given and s.trace.path and not s.trace.max_prompt_tokens:  # a trace's longest is not known: taken as given
        return HandoffSize(given, workers, "")
    cap, bound = (given, "--disagg-handoff-gb") if given else _auto_cap(s, transports, rest_of_budget, per, gpu)
    fit = cap // per
    if fit < 1:
        folder = handoff_target(s, transports)[0] == "file"
        fix = (f"give --disagg-handoff-gb {per / 2**30:.2f} or more" if given or folder else
               f"the rest of the budget takes {rest_of_budget / 2**30:.2f} GiB: lower --cpu-mem-gb, or use a smaller "
               f"model")
        raise UserError(f"the handoff space ({bound}: {cap / 2**30:.2f} GiB) cannot hold one request's blocks "
                        f"({source} longest prompt, {longest:,} tokens = {per / 2**30:.2f} GiB), held until a "
                        f"decode node loads them; {fix}, or lower the prompts' limit.")
    n = min(workers, fit)
    space = given or n * per
    note = (f"handoff: {space / 2**30:.2f} GiB ({bound}) holds the longest prompts ({longest:,} tokens, {source}) "
            f"of {n} publishing workers")
    return HandoffSize(space, n, note)


def _handoff_root(s: Settings, transports: dict) -> str:
    root = os.path.abspath(handoff_target(s, transports)[1])
    if not os.path.isdir(root) or not os.access(root, os.W_OK | os.X_OK):
        raise UserError(f"--handoff-dir {root} is not a writable directory; create it (on the storage both "
                        f"nodes share) or pass another.")
    return root


def decode_traffic(s: Settings, model_name: str,
                   transports: dict) -> tuple[ManifestFollower | RecordFollower, NixlLoader | None]:
    """A decode node's arrivals: wait for a prefill node's manifest, check it matches, follow it; (arrivals, the
    NIXL link that also loads the blocks, or None for a folder)."""
    kind, url = handoff_target(s, transports)
    if kind == "nixl":  # its side channel carries the manifest; the same link then loads the blocks
        say = (lambda m: None) if s.run.quiet else (lambda m: print(m, flush=True))
        link = NixlLoader(url, handoff_identity(s, model_name), s.disagg.wait_s, say, s.disagg.peer_timeout_s)
        return RecordFollower(link.next_record, s.disagg.wait_s), link
    path = os.path.join(_handoff_root(s, transports), FOLDER, MANIFEST)
    if not os.path.exists(path) and not s.run.quiet:  # started first: say what it waits for, and how long
        print(f"  waiting for a prefill node to publish into {os.path.dirname(path)} (up to {s.disagg.wait_s:g} s, "
              f"--disagg-wait-s)", flush=True)
    header = wait_for_manifest(path, s.disagg.wait_s)
    check_header(header, handoff_identity(s, model_name), path)
    # NOTE: attached as soon as the manifest is found, before this node builds its tiers (seconds): the prefill
    # node waits at its end for the decode nodes attached, and a short run ended before this one had
    mark_reading(os.path.dirname(path))
    return ManifestFollower(path, s.disagg.wait_s), None


def _gpu_region(s: Settings, gpu) -> tuple[object, int] | None:
    """(device backend, GPU) for --disagg-handoff-memory gpu, or None for host memory."""
    if s.disagg.handoff_memory != "gpu":
        return None
    if gpu is None:
        raise UserError("--disagg-handoff-memory gpu puts the NIXL handoff region in GPU memory, and this run has "
                        "no real GPU tier; add --gpu real (a CUDA device and CuPy), or drop the flag.")
    return gpu, 0  # the GPU tier's first device (tiers.gpus is how many it spreads over, not which)


def open_handoff(s: Settings, reg, model_name: str, slot_bytes: int, link: NixlLoader | None = None,
                 gpu=None) -> tuple[Publisher | Loader | None, str]:
    """The prefill node's side of the handoff, or the decode node's; (side, engine note). Its space is sized
    (size_handoff) into s before; link: a NIXL decode node's link to its prefill node, made with its traffic
    (decode_traffic); gpu: the real GPU tier's backend."""
    if s.disagg.role == "both":
        return None, ""
    kind, url = handoff_target(s, reg.transports)
    if s.disagg.handoff_memory == "gpu" and (kind != "nixl" or s.disagg.role != "prefill"):
        raise UserError("--disagg-handoff-memory gpu is the NIXL prefill node's region (--role prefill --handoff "
                        "nixl://HOST:PORT); drop it here.")
    if kind == "nixl":
        tls = os.environ.get("UCX_TLS", "UCX's own choice")
        note = f"the handoff moves blocks with NIXL READs over UCX (transports: {tls}) through {url}"
        if s.disagg.role == "decode":
            return link, note
        ident = handoff_identity(s, model_name)  # its region is a part of the memory budget, checked before
        side = NixlPublisher.create(url, slot_bytes, int(s.disagg.handoff_gb * 2**30), ident, _gpu_region(s, gpu))
        side.space.wait_s, side.channel.peer_timeout_s = s.disagg.wait_s, s.disagg.peer_timeout_s
        return side, note
    root = _handoff_root(s, reg.transports)
    engines = reg.engines
    engine, note = s.tiers.io_engine, ""
    if engines[engine].maps:  # blocks are files found by name: no mapping
        engine, note = "buffered", f"the handoff folder uses the buffered engine ({engine} maps slabs)"
    elif engines[engine].direct and (why := probe_direct(root)):
        engine, note = "buffered", f"O_DIRECT refused in {root} ({why}): the handoff folder runs buffered"
    blocks = reg.media.shared_files(engine, slot_bytes)
    if s.disagg.role == "decode":
        return FolderLoader(root, blocks), note
    side = FolderPublisher(root, blocks, engine, int(s.disagg.handoff_gb * 2**30), handoff_identity(s, model_name))
    side.space.wait_s = s.disagg.wait_s
    return side, note


def clock_started(side: Publisher | Loader | None) -> None:
    """A decode node's clock runs: it says so to the prefill node waiting for it (wait_for_decode)."""
    if side is not None and side.role == "decode":
        side.ready()


def wait_for_decode(side: Publisher | Loader | None, wait_s: float, say) -> None:
    """Before a prefill node's clock: wait (at most wait_s) for a decode node whose clock runs. A decode node
    attaches, then builds its tiers (seconds to tens of seconds): a prefill node that started its clock at once
    filled its space and waited for acknowledgements through its window (the README's two nodes on their
    defaults: one request in a 20 s window), and the decode node's warm-up then took all it handed over."""
    if side is None or side.role != "prefill" or side.ready_nodes():
        return
    say(f"  handoff: waiting up to {wait_s:g} s for a decode node to be ready (--disagg-wait-s); the clock starts "
        f"then")
    deadline = time.monotonic() + wait_s
    while not (ready := side.ready_nodes()) and time.monotonic() < deadline:
        time.sleep(0.05)
    if ready:
        say(f"  handoff: decode node(s) {', '.join(sorted(ready))} ready")
    elif attached := side.attached():
        say(f"  handoff: decode node(s) {', '.join(sorted(attached))} attached but not ready within {wait_s:g} s; "
            f"the clock starts without them")
    else:
        side.run_alone()
        say(f"  handoff: no decode node within {wait_s:g} s; this prefill node runs alone (a full handoff space "
            f"drops its oldest unread blocks, counted)")


def finish_role(side: Publisher | Loader | None, s: Settings, say) -> dict | None:
    """After the load phase: the prefill node ends the manifest and waits for decode nodes; the decode
    node says it is done. Returns what the results' role section needs beyond the recorder's numbers."""
    if side is None:
        return None
    out = {"role": s.disagg.role, "handoff_dir": side.where, "engine": side.engine}
    if side.role == "prefill":
        say(f"  handoff: end of manifest written; waiting up to {s.disagg.wait_s:g} s for decode nodes")
        return {**out, **side.finish(s.disagg.wait_s, not s.run.keep_data, say)}
    side.detach()
    return out


def abandon_role(side: Publisher | Loader | None, remove: bool) -> None:
    """The run failed: a prefill node ends its manifest (decode nodes stop) and removes its space (remove); a
    decode node says it is done."""
    if side is None:
        return
    if side.role == "prefill":
        side.abandon(remove)
    else:
        side.detach()
