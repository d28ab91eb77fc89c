"""--lmcache-config FILE: an LMCache configuration (its YAML) run here as its tiers.

LMCache keeps a request's KV in chunks of `chunk_size` tokens, in CPU memory (`local_cpu`, `max_local_cpu_size`
GiB), on a local disk (`local_disk`, a path, `max_local_disk_size` GiB) and in a remote store (`remote_url`);
`save_decode_cache` also stores the generated tokens' KV. Each maps onto one of our settings (the table in
docs/lmcache.md "LMCache configurations"); a key with no counterpart here is said in one note, never silently
dropped. The result
is `--set` entries below the command line's own flags: a flag given beside the file wins (said too).
"""

from __future__ import annotations

import os
from pathlib import Path

from kv_cache.cli.folders import make_missing
from kv_cache.config.load import read_config_file
from kv_cache.errors import UserError
from kv_cache.tiers.fsinfo import refuse_system_dir

# LMCache key -> our dotted key (what each translation below sets)
MAPPED = {"chunk_size": "model.block_tokens", "local_cpu": "tiers.cpu_mem_gb", "max_local_cpu_size": "tiers.cpu_mem_gb",
          "local_disk": "tiers.cache_dir", "max_local_disk_size": "tiers.nvme_gb", "remote_url": "tiers.remote_url",
          "save_decode_cache": "workload.decode_writes", "cache_policy": "cache.policy"}
# what LMCache only tunes in its own engine (serialisation, its servers, its GPU path): nothing to run here
ENGINE_ONLY = {"remote_serde", "blocking_timeout_secs", "use_layerwise", "enable_blending", "blend_recompute_ratio",
               "blend_min_tokens", "pd_role", "pd_buffer_size", "enable_p2p", "lookup_url", "distributed_url",
               "enable_controller", "lmcache_instance_id", "controller_url", "lmcache_worker_port", "error_handling",
               "enable_async_loading", "internal_api_server_enabled", "extra_config", "save_unfull_chunk",
               "gds_path", "cufile_buffer_size", "local_disk_path_sharding", "numa_mode", "priority_limit"}
POLICY = {"LRU": "lru", "LFU": "lfu", "FIFO": "fifo"}
# our flags a later check may name, for the keys the file sets: what the file said instead, in its own words
FLAG_OF = {"tiers.cpu_mem_gb": ("--cpu-mem-gb", "its max_local_cpu_size (or local_cpu) is --cpu-mem-gb here"),
           "tiers.nvme_gb": ("--nvme-gb", "its max_local_disk_size is --nvme-gb"),
           "tiers.cache_dir": ("--cache-dir", "its local_disk is --cache-dir"),
           "tiers.nvme": ("--nvme off", "it names no local_disk: --nvme off"),
           "model.block_tokens": ("--block-tokens", "its chunk_size is --block-tokens"),
           "tiers.remote_url": ("--remote-url", "its remote_url is --remote-url")}


def blame(e: UserError, path: str, sets: list[str], argv: list[str]) -> UserError:
    """An error a later check raised naming a flag the user never typed, for a value this LMCache file gave: the
    file and its key named first (issue 52: '--nvme off' and '--cpu-mem-gb' were blamed for its keys)."""
    text, set_keys = str(e), {s.split("=", 1)[0] for s in sets}
    typed = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    named = [said for key, (flag, said) in FLAG_OF.items()
             if key in set_keys and flag in text and flag.split()[0] not in typed]
    if not named or text.startswith("--lmcache-config"):
        return e
    return UserError(f"--lmcache-config {path} ({'; '.join(named)}): {text}")


def translate(path: str, media) -> tuple[list[str], dict[str, str], list[str], list[str]]:
    """(--set entries, dotted key -> what set it, notes, folders made) for an LMCache YAML file; one sentence for
    what cannot be run here. Its local_disk is made where missing, as LMCache makes it (removed again, where still
    empty, when the run is refused: main.py)."""
    conf = read_config_file(Path(path), "--lmcache-config", "LMCache configuration")
    out: dict[str, object] = {}
    notes: list[str] = []

    def where(key: str) -> str:
        return f"--lmcache-config {path}: {key}"

    if "chunk_size" in conf:
        chunk = conf["chunk_size"]
        if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1:
            raise UserError(f"{where('chunk_size')} is {chunk!r}; LMCache's chunk is a whole number of tokens "
                            f"(256 by default).")
        out["model.block_tokens"] = chunk
    cpu_on = _flag(conf.get("local_cpu", True), where("local_cpu"))
    out["tiers.cpu_mem_gb"] = _gib(conf.get("max_local_cpu_size", 5.0), where("max_local_cpu_size")) if cpu_on else 0
    disk = conf.get("local_disk")
    if disk:
        out["tiers.cache_dir"] = _disk_path(str(disk), where("local_disk"))
        out["tiers.nvme"] = "on"
        if "max_local_disk_size" in conf:
            out["tiers.nvme_gb"] = _gib(conf["max_local_disk_size"], where("max_local_disk_size"))
    else:
        out["tiers.nvme"] = "off"
    remote = conf.get("remote_url")
    if remote:
        if media.remote_kind(str(remote)) is None:  # the registry's media say which schemes are served
            raise UserError(f"{where('remote_url')} is {remote!r}, a store this benchmark has no medium for; it "
                            f"runs {media.schemes_served()} remote tiers (drop remote_url to run the local tiers "
                            f"alone).")
        out["tiers.remote_url"] = str(remote)
    if "save_decode_cache" in conf:
        out["workload.decode_writes"] = _flag(conf["save_decode_cache"], where("save_decode_cache"))
    else:  # LMCache stores the prompt's KV only unless told: so does this translation
        out["workload.decode_writes"] = False
    if "cache_policy" in conf:
        policy = POLICY.get(str(conf["cache_policy"]).upper())
        if policy is None:
            raise UserError(f"{where('cache_policy')} is {conf['cache_policy']!r}; here: {', '.join(POLICY)}.")
        out["cache.policy"] = policy
    ignored = sorted(k for k in conf if k not in MAPPED and k not in ENGINE_ONLY)
    engine = sorted(k for k in conf if k in ENGINE_ONLY)
    if engine:
        notes.append(f"LMCache engine settings with nothing to run here (its serialisation, servers, GPU path): "
                     f"{', '.join(engine)}")
    if ignored:
        raise UserError(f"--lmcache-config {path}: {', '.join(ignored)} {'is' if len(ignored) == 1 else 'are'} "
                        f"not LMCache keys this benchmark knows; check the spelling (docs/lmcache.md's table "
                        f"lists those it runs).")
    sets = [f"{k}={_yaml(v)}" for k, v in out.items()]
    origins = {k: where(next((lk for lk, ours in MAPPED.items() if ours == k and lk in conf), k)) for k in out}
    made = make_missing(out["tiers.cache_dir"], where("local_disk")) if "tiers.cache_dir" in out else []
    if made:  # LMCache makes it ("this directory does NOT need to exist beforehand", its local storage docs)
        notes.append(f"{where('local_disk')} {out['tiers.cache_dir']}: made (it did not exist; LMCache makes it too); "
                     f"it stays after the run")
    return sets, origins, notes, made


def _gib(value, where: str) -> float:
    """LMCache's sizes are GiB (its max_local_*_size): a number > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise UserError(f"{where} is {value!r}; LMCache's sizes are GiB, a number >= 0.")
    return float(value)


def _flag(value, where: str) -> bool:
    """An LMCache switch: YAML's true or false. A string ('no', 'false') is not one: bool('no') is True."""
    if not isinstance(value, bool):
        raise UserError(f"{where} is {value!r}; LMCache's switches are true or false (unquoted).")
    return value


def _disk_path(value: str, where: str) -> str:
    """LMCache's local_disk: a path, or file://PATH; several (comma-separated) are one folder each here."""
    if "," in value:
        raise UserError(f"{where} names several folders ({value}); this benchmark's disk tier is one folder: give "
                        f"one (run one benchmark per disk, or --processes N, to load several).")
    path = value.removeprefix("file://")
    if not path.strip():
        raise UserError(f"{where} is {value!r}, which names no folder; give the disk tier's folder "
                        f"(file:///mnt/nvme/lmcache or a path).")
    refuse_system_dir(path, where)  # the culprit is the LMCache file's key, not --cache-dir
    if os.path.lexists(path) and not os.path.isdir(path):
        what = "a file" if os.path.exists(path) else "a link to nothing"
        raise UserError(f"{where} is {value!r}, {what}: the disk tier's folder must be a folder; name another.")
    return path


def _yaml(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v) if not isinstance(v, str) else f"'{v}'"
