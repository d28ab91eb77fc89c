"""The files of a reference command line, checked or made before the run: --output and --xlsx-output must be
writable (not found unwritable after the run), and a --cache-dir that does not exist is made, as the reference
makes it (the folders made are removed again when the run is then refused: main.py)."""

from __future__ import annotations

import os
from pathlib import Path

from kv_cache.cli.folders import make_missing
from kv_cache.errors import UserError
from kv_cache.safefiles import refuse_link

MIN_FREE_BYTES = 16 << 20  # --output's JSON is tens of KiB, its spreadsheet a few hundred


def check_output(path: str, flag: str = "--output") -> None:
    """--output FILE (or --xlsx-output), checked before the run (not found unwritable after it)."""
    from kv_cache.tiers.fsinfo import FILES, refuse_system_dir

    target = Path(path)
    refuse_link(target, flag)
    if target.is_dir() or path.endswith(os.sep):
        raise UserError(f"{flag} {path} is a folder; name a file in it (e.g. {target / 'mlperf.json'}).")
    parent = target.parent
    if not parent.is_dir():
        raise UserError(f"{flag} {path}: folder {parent} does not exist; create it or name a file elsewhere.")
    refuse_system_dir(str(parent), flag, FILES)
    if not os.access(parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise UserError(f"{flag} {path} cannot be written (permissions); name a file you may write.")
    st = os.statvfs(parent)
    if st.f_bavail * st.f_frsize < MIN_FREE_BYTES:  # found before the run, not after it
        raise UserError(f"{flag} {path}: its filesystem has {st.f_bavail * st.f_frsize // 1024:,} KiB free, less than "
                        f"the {MIN_FREE_BYTES >> 20} MiB the file may take; free space or name a file elsewhere.")


def check_xlsx(path: str) -> None:
    """--xlsx-output: openpyxl (the xlsx extra) is there and the file can be written, before the run."""
    try:
        import openpyxl  # noqa: F401
    except ImportError:
        raise UserError("--xlsx-output needs openpyxl: pip install -e '.[xlsx]' (make install adds it), or drop "
                        "--xlsx-output (--output's JSON holds the same fields).") from None
    check_output(path, "--xlsx-output")


def make_cache_dir(path: str | None, notes: list[str]) -> list[str]:
    """The reference makes its --cache-dir when it does not exist: so does a reference command line here."""
    made = make_missing(path, "--cache-dir") if path else []
    if made:
        notes.append(f"--cache-dir {path}: made (it did not exist; the reference makes it too); it stays after the "
                     f"run")
    return made


def after_run(reference, settings, say) -> None:
    """After a reference command line's run: its --output file, its console sections, its spreadsheet."""
    from kv_cache.report.mlperf.output import write_output
    from kv_cache.report.mlperf.reference_console import reference_summary

    folder = Path(settings.run.output_dir) / settings.run.run_id
    if not reference.output or not (folder / "results.json").exists():
        return
    path, fields = write_output(reference.output, folder, reference.profile)
    for line in reference_summary(fields):
        say(line)
    say(f"MLPerf fields: {path}")
    if reference.xlsx:
        from kv_cache.report.mlperf.xlsx import write_xlsx

        params = run_params(settings, reference)
        say(f"MLPerf spreadsheet: {write_xlsx(reference.xlsx, fields, params, reference.profile)}")


def run_params(s, reference) -> dict:
    """The reference spreadsheet's 26 run parameters (its Timestamp is added where it is written), in its order:
    what this run ran with (the settings the command line became), and what only the reference's flags hold."""
    t, typed = s.tiers, reference.typed
    return {"Model": s.model.name, "Num Users": s.workload.users, "Duration (s)": s.run.duration_s,
            "GPU Memory per Card (GiB)": t.gpu_mem_gb, "Num GPUs": t.gpus, "Tensor Parallel": s.model.tp,
            "Total GPU Memory (GiB)": t.gpu_mem_gb * t.gpus, "CPU Memory (GiB)": t.cpu_mem_gb,
            "Generation Mode": typed.get("Generation Mode"), "Performance Profile": reference.profile,
            "Multi-turn": typed.get("Multi-turn"), "Prefix Caching": typed.get("Prefix Caching"),
            "RAG Enabled": s.rag.enabled, "Autoscaling": s.autoscale.mode != "off", "Seed": s.run.seed,
            "Max Concurrent Allocs": typed.get("Max Concurrent Allocs"), "Request Rate": s.schedule.request_rate,
            "Max Requests": s.run.max_requests, "Dataset Path": s.trace.path or "N/A",
            "Cache Dir": t.cache_dir or "temp", "Storage Capacity (GiB)": t.nvme_gb,
            "Precondition": t.precondition, "Precondition Size (GiB)": typed.get("Precondition Size (GiB)"),
            "Precondition Threads": "one writer per slab (--precondition-threads is refused here)",
            "Trace Speedup": s.trace.speedup, "Replay Cycles": s.trace.replay_cycles}
