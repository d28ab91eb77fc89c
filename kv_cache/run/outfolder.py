"""The run's report folder: checked and reserved before the run, never a reason to lose results.

Before anything is measured the folder ``<output-dir>/<run-id>`` is created
with a marker (see leftovers.py) and a *reserve* file (reserve_bytes: a longer run's more), so a
read-only, missing-parent, file-in-the-way or full output folder is refused
up front, and the space for results.json, CSVs and plots is held until they
are written. If writing still fails at the end, the results go to a fresh
folder under the system's temporary directory and the run says where.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from kv_cache import runlog, signals
from kv_cache.errors import UserError
from kv_cache.recorder.results_schema import Results
from kv_cache.run.describe import nothing_measured
from kv_cache.run.leftovers import MARKER, describe_dead, write_marker
from kv_cache.safefiles import write_file
from kv_cache.tiers.fsinfo import refuse_system_dir

RESERVE = ".kvbench-reserve"
LOG = "run.log"  # tracebacks of internal errors (runlog.py); written only when one happens
RESERVE_BYTES = 16 << 20  # results.json's fixed sections, summary.md and the plots
# and each second of the window, a tier: its per-second histograms and row in results.json, its row in
# timeseries.csv; a 1,510 s run on two tiers wrote 2.8 MB and 0.2 MB of them, about 1 KiB a tier a second
SECOND_TIER_OUTPUT_BYTES = 2 << 10
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_run_id(run_id: str) -> None:
    """A run id names one folder under --output-dir: no '/', no '..', nothing a shell or a path misreads."""
    if run_id and (not RUN_ID.fullmatch(run_id) or ".." in run_id):
        raise UserError(f"--run-id {run_id!r} must be 1-128 letters, digits, '.', '_' or '-', start with a letter "
                        f"or digit and hold no '..': it names one folder under --output-dir.")


def reserve_bytes(seconds: int, tiers: int, ranks: int = 1) -> int:
    """The room the files of a run of `seconds` seconds of window on `tiers` tiers take: a day's run writes a
    hundred MiB and more, most of it its time series; under MPI, each rank's results file beside the merged one."""
    files = 1 if ranks == 1 else ranks + 1
    return RESERVE_BYTES + files * seconds * tiers * SECOND_TIER_OUTPUT_BYTES


def reserve(folder: Path, run_id: str, nbytes: int = RESERVE_BYTES) -> list[Path]:
    """Create folder with its marker and a reserve file of nbytes, or refuse in one sentence. Returns the folders
    above it that it made (./reports on a first run): a run that writes nothing removes them again (abandon)."""
    refuse_system_dir(str(folder.parent), "--output-dir")
    if folder.exists() or folder.is_symlink():
        why = describe_dead(folder) or "a finished run wrote its results there"
        raise UserError(f"report folder {folder} already exists ({why}); choose another --run-id.")
    made = [p for p in folder.parents if not p.exists() and not p.is_symlink()]
    try:
        folder.mkdir(parents=True)
    except FileExistsError:
        raise UserError(f"--output-dir {folder.parent}: a file is in the way of the report folder {folder}; "
                        f"pass a folder to --output-dir.") from None
    except NotADirectoryError:
        raise UserError(f"--output-dir {folder.parent} is not a folder (a file is in its path); pass a "
                        f"folder to --output-dir.") from None
    except OSError as e:
        raise UserError(f"--output-dir {folder.parent}: cannot create the report folder ({e.strerror}); pass a "
                        f"writable --output-dir.") from None
    try:
        write_marker(folder, run_id)
        _reserve(folder, nbytes)
    except OSError as e:
        shutil.rmtree(folder, ignore_errors=True)
        room = f"less than {nbytes / 2**20:,.0f} MiB free" if e.errno in (errno.ENOSPC, errno.EDQUOT) \
            else e.strerror
        raise UserError(f"--output-dir {folder.parent} cannot hold the run's results ({room}); free space or "
                        f"pass another --output-dir.") from None
    return made


def _reserve(folder: Path, nbytes: int) -> None:
    fd = os.open(folder / RESERVE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        try:
            os.posix_fallocate(fd, 0, nbytes)
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            chunk = bytes(min(nbytes, RESERVE_BYTES))  # a filesystem without fallocate: real bytes
            for at in range(0, nbytes, len(chunk)):
                os.pwrite(fd, chunk[:nbytes - at], at)
            os.fsync(fd)
    finally:
        os.close(fd)


def spend_reserve(folder: Path) -> None:
    """Give the reserved space back right before the results are written into it."""
    try:
        os.unlink(folder / RESERVE)
    except OSError:
        pass


def finish(folder: Path) -> None:
    """The results are written: the folder no longer needs its marker nor its reserve."""
    for name in (MARKER, RESERVE):
        try:
            os.unlink(folder / name)
        except OSError:
            pass


def abandon(folder: Path, made: list[Path] = ()) -> None:
    """A run that wrote nothing into its reserved folder removes it (only what we put there), and the folders
    above it that reserve made, where they are still empty (a refused first run left an empty ./reports)."""
    try:
        names = set(os.listdir(folder))
    except OSError:
        return
    if names <= {MARKER, RESERVE, MARKER + ".tmp"}:
        shutil.rmtree(folder, ignore_errors=True)
        for parent in made:  # innermost first; rmdir removes only an empty folder
            try:
                parent.rmdir()
            except OSError:
                break
    else:
        finish(folder)


def fallback_folder(run_id: str) -> Path:
    """A fresh folder for results that could not be written where they were due."""
    return Path(tempfile.mkdtemp(prefix=f"kvbench-{run_id or 'run'}-results-"))


def write_json(path: Path, data: dict) -> None:
    """Write atomically: a reader never sees half a file."""
    try:
        write_file(path, json.dumps(data, indent=1, default=str), "results")
    except UserError as e:  # the caller falls back to another folder on an OSError
        raise OSError(str(e)) from None


def write_results(merged: Results, report_dir: Path, extra: dict) -> tuple[Path, bool]:
    """Write results.json and the report files; if that fails, write them elsewhere and say where.

    Returns (the folder written, whether the promised folder failed).
    """
    top = report_dir if (report_dir / RESERVE).exists() else report_dir.parent
    spend_reserve(top)  # the space held since the start is for these files
    try:
        report_dir.mkdir(parents=True, exist_ok=True)
        _write_files(merged, report_dir, extra)
        return report_dir, False
    except OSError as e:
        where = fallback_folder(merged.run.run_id)
        _write_files(merged, where, extra)
        runlog.tell(f"could not write the results into {report_dir} ({e.strerror or e}); they are in {where} "
                    f"instead.")
        return where, True


def _write_files(merged: Results, folder: Path, extra: dict) -> None:
    from kv_cache.report.files import write_report  # matplotlib: only when there is something to draw

    write_json(folder / "results.json", merged.to_json())
    write_report(merged, folder)
    for name, data in extra.items():
        write_json(folder / name, data.to_json())


def tell_faults(results: Results, where: Path) -> None:
    """A stop by a signal, a fault or a wrong block is said on stderr too: --quiet or a redirected stdout must not
    hide it."""
    if signals.received() is not None:
        how = (f"the run stopped {results.run.duration_s:.1f} s into the measurement: partial results"
               if results.run.stopped_reason == "interrupted" else
               "after the measurement had ended: the results are complete")
        runlog.tell(f"{signals.name()} received; {how}, in {where / 'results.json'}.")
    if results.run.fault:
        runlog.tell(f"run fault: {results.run.fault}")
    elif why := nothing_measured(results):  # exit 1: --quiet must still say why
        runlog.tell(f"{why}.")
    failures = results.verification.failures
    if failures:
        runlog.tell(f"{failures} blocks read back wrong (verification); see results.json.")
