"""Submission packages: runs under fixed rules, a system description, checksums, and `validate`.

``--submission v1`` refuses settings that break the rules before anything runs, then runs the trials
and writes, into reports/<run-id>/, the results of every trial and their median (trial-<k>/,
results.json, trials.json), the settings (settings.yaml), ``system.json`` (CPU, memory, kernel,
filesystem type and mount options of the cache directory, block device, GPUs, package versions)
and ``manifest.json`` (rules, and a sha256 of every file). ``validate DIR`` checks a package
against its rules and its checksums and lists exactly what fails.

``smoke`` rules exist to exercise the machinery in seconds; a smoke package is never valid for
submission, and validate says so.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import psutil
import yaml

from kv_cache import __version__
from kv_cache.config import Settings, flag_name, iter_keys, replace
from kv_cache.recorder.results_schema import Results
from kv_cache.recorder.typed import SchemaError
from kv_cache.safefiles import write_file
from kv_cache.tiers.fsinfo import mount_of


@dataclass(frozen=True)
class Rules:
    name: str
    min_duration_s: float
    min_warmup_s: float
    min_trials: int
    min_precondition_passes: int
    for_submission: bool
    seed: int = 42
    direct_io: bool = True  # an engine that bypasses the page cache (O_DIRECT: direct, io_uring)
    defaults: tuple = ()  # (key, value): what a setting left at the schema's default takes under these rules


_V1 = (("run.duration_s", 300.0), ("run.warmup_s", 30.0), ("run.trials", 3), ("tiers.precondition", True))
RULES = {
    "v1": Rules("v1", min_duration_s=300, min_warmup_s=30, min_trials=3, min_precondition_passes=2,
                for_submission=True, defaults=_V1),
    # seconds, as it promises: a short window, one precondition pass over a 1 GiB tier
    "smoke": Rules("smoke", min_duration_s=1, min_warmup_s=0, min_trials=2, min_precondition_passes=1,
                   for_submission=False, defaults=(("run.duration_s", 2.0), ("run.warmup_s", 0.5), ("run.trials", 2),
                                                   ("tiers.precondition", True), ("tiers.precondition_passes", 1),
                                                   ("tiers.nvme_gb", 1.0))),
}
PACKAGE_FILES_SKIPPED = {"manifest.json"}


def with_rule_defaults(s: Settings, rules: Rules) -> tuple[Settings, list[str]]:
    """The rules' own values for the settings left at the schema's defaults (--submission smoke alone runs);
    (settings, the flags set, as `--flag value`)."""
    fields = {dotted: f for dotted, f, _ in iter_keys(Settings)}
    said = []
    for dotted, value in rules.defaults:
        section, leaf = dotted.split(".")
        if section == "tiers" and s.tiers.nvme != "on":  # no disk tier: nothing to precondition or size
            continue
        if getattr(getattr(s, section), leaf) == fields[dotted].default != value:
            s = replace(s, dotted, value)
            flag = flag_name(dotted, fields[dotted])
            said.append(flag if value is True else f"{flag} {value:g}")
    return s, said


def _direct(engine: str, engines: dict) -> bool:
    e = engines.get(engine)
    return e is not None and e.direct


def _directs(engines: dict) -> list[str]:
    return sorted(n for n, e in engines.items() if e.direct)


def rule_violations(settings: dict, rules: Rules, engines: dict) -> list[str]:
    """What in these settings breaks the rules (empty: nothing), each naming its flag; engines: the registry's."""
    run, tiers = settings["run"], settings["tiers"]
    checks = [
        (run["duration_s"] >= rules.min_duration_s, f"--duration must be >= {rules.min_duration_s:g} "
                                                    f"(is {run['duration_s']:g})"),
        (run["warmup_s"] >= rules.min_warmup_s, f"--warmup must be >= {rules.min_warmup_s:g} "
                                                f"(is {run['warmup_s']:g})"),
        (run["trials"] >= rules.min_trials, f"--trials must be >= {rules.min_trials} (is {run['trials']})"),
        (run["seed"] == rules.seed, f"--seed must be {rules.seed} (is {run['seed']})"),
        (run["max_requests"] == 0, "--max-requests must be 0 (runs are time-based)"),
        (run["verify"] in ("checksum", "full"), f"--verify must be checksum or full (is {run['verify']})"),
        (tiers["precondition"], "--precondition must be on"),
        (tiers["precondition_passes"] >= rules.min_precondition_passes,
         f"--precondition-passes must be >= {rules.min_precondition_passes} (is {tiers['precondition_passes']})"),
        (not rules.direct_io or _direct(tiers["io_engine"], engines),
         f"--io-engine must be an O_DIRECT engine ({', '.join(_directs(engines))}; is {tiers['io_engine']})"),
        (not tiers["null_io"], "--null-io must be off (a submission moves real bytes)"),
        (tiers["gpu"] != "simulated", "--gpu must not be simulated (modelled numbers are not measurements)"),
        (not tiers["allow_tmpfs"], "--allow-tmpfs must be off (the NVMe tier must be a device)"),
    ]
    return [message for ok, message in checks if not ok]


def result_violations(folder: Path, rules: Rules, engines: dict) -> list[str]:
    """What in the measured trials breaks the rules."""
    out = []
    trials = sorted(folder.glob("trial-*/results.json"))
    if len(trials) < rules.min_trials:
        out.append(f"{len(trials)} trial results found, {rules.min_trials} required")
    for path in trials:
        name = path.parent.name
        try:
            r = Results.from_dict(json.loads(path.read_text()), str(path))
        except (ValueError, SchemaError) as e:
            out.append(f"{name}: {e}")
            continue
        if r.run.partial:
            out.append(f"{name} is partial ({r.run.stopped_reason})")
        if r.verification.failures:
            out.append(f"{name} read {r.verification.failures} blocks back wrong")
        if rules.direct_io and not _direct(r.run.io_engine, engines):
            out.append(f"{name} ran the {r.run.io_engine} engine ({r.run.io_engine_note}), an O_DIRECT engine "
                       f"({', '.join(_directs(engines))}) required")
        if r.run.duration_s < rules.min_duration_s:
            out.append(f"{name} measured {r.run.duration_s:.1f} s, {rules.min_duration_s:g} s required")
        passes = r.precondition.passes if r.precondition is not None else 0
        if passes < rules.min_precondition_passes:
            out.append(f"{name} was preconditioned {passes} passes, {rules.min_precondition_passes} required")
    return out


# ------------------------------------------------------------------------------ system description

def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _block_device(source: str) -> dict:
    name = os.path.basename(os.path.realpath(source)) if source.startswith("/dev/") else ""
    if not name:
        return {"source": source}
    base = name
    if not os.path.isdir(f"/sys/block/{name}"):  # a partition: find its disk
        base = next((d for d in os.listdir("/sys/block") if os.path.isdir(f"/sys/block/{d}/{name}")), name)
    q = f"/sys/block/{base}/queue"
    return {"source": source, "disk": base, "model": _read(f"/sys/block/{base}/device/model"),
            "vendor": _read(f"/sys/block/{base}/device/vendor"), "rotational": _read(f"{q}/rotational"),
            "logical_block_size": _read(f"{q}/logical_block_size"), "scheduler": _read(f"{q}/scheduler"),
            "size_sectors": _read(f"/sys/block/{base}/size")}


def _gpus() -> list | str:
    try:
        import pynvml

        pynvml.nvmlInit()
        out = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
               for i in range(pynvml.nvmlDeviceGetCount())]
        pynvml.nvmlShutdown()
        return [g.decode() if isinstance(g, bytes) else g for g in out]
    except Exception as e:  # noqa: BLE001 - any NVML failure means: no GPU described
        return f"none found ({type(e).__name__})"


def _versions() -> dict:
    names = ("kv-cache-bench", "numpy", "hdrhistogram", "psutil", "pyyaml", "matplotlib", "zstandard", "mpi4py",
             "tiktoken", "cupy-cuda12x", "nvidia-ml-py")
    out = {"python": platform.python_version()}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            out[n] = None
    return out


def system_description(cache_dir: str) -> dict:
    cpu_model = next((line.split(":", 1)[1].strip() for line in (_read("/proc/cpuinfo") or "").splitlines()
                      if line.startswith("model name")), platform.processor())
    mount = mount_of(cache_dir)
    return {"tool_version": __version__, "hostname": platform.node(),
            "cpu": {"model": cpu_model, "logical_cores": os.cpu_count(),
                    "physical_cores": psutil.cpu_count(logical=False)},
            "memory_bytes": psutil.virtual_memory().total,
            "kernel": {"release": platform.release(), "version": platform.version(), "machine": platform.machine()},
            "cache_dir": {"path": cache_dir, "mount_point": mount.mount_point, "fs_type": mount.fs_type,
                          "mount_options": mount.options, "device": _block_device(mount.source)},
            "gpus": _gpus(), "packages": _versions()}


# ------------------------------------------------------------------------------ package and validation

def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name not in PACKAGE_FILES_SKIPPED)


def write_package(folder: Path, settings: dict, rules: Rules, cache_dir: str) -> Path:
    write_file(folder / "system.json", json.dumps(system_description(cache_dir), indent=1), "--submission")
    write_file(folder / "settings.yaml", yaml.safe_dump(settings, sort_keys=False), "--submission")
    manifest = {"rules": rules.name, "for_submission": rules.for_submission, "tool_version": __version__,
                "files": {str(p.relative_to(folder)): _sha256(p) for p in _files(folder)}}
    return write_file(folder / "manifest.json", json.dumps(manifest, indent=1), "--submission")


def validate(folder: Path, engines: dict) -> tuple[list[str], str]:
    """(failures, rules name) of a package; no failure means it conforms to its rules."""
    if not (folder / "manifest.json").exists():
        return ["no manifest.json: this is not a submission package (a run with --submission v1 writes one, with "
                "its rules and every file's checksum)"], ""
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        return [f"manifest.json is unreadable ({e})"], ""
    rules = RULES.get(manifest.get("rules"))
    if rules is None:
        return [f"unknown rules {manifest.get('rules')!r}"], str(manifest.get("rules"))
    failures = []
    listed = manifest.get("files", {})
    present = {str(p.relative_to(folder)) for p in _files(folder)}
    for name, digest in sorted(listed.items()):
        if name not in present:
            failures.append(f"{name}: listed in the manifest but missing")
        elif _sha256(folder / name) != digest:
            failures.append(f"{name}: checksum differs from the manifest (modified after packaging)")
    failures += [f"{name}: not in the manifest (added after packaging)" for name in sorted(present - set(listed))]
    try:
        settings = yaml.safe_load((folder / "settings.yaml").read_text())
        failures += [f"rule: {v}" for v in rule_violations(settings, rules, engines)]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as e:
        failures.append(f"settings.yaml is missing or unreadable ({e})")
    failures += [f"rule: {v}" for v in result_violations(folder, rules, engines)]
    if not rules.for_submission:
        failures.append(f"rules {rules.name!r} are for trying the machinery: this package is not a valid submission")
    return failures, rules.name
