"""The directory under test: the cache directory checked, the run's data directory made, the disk engine that
will really run there (O_DIRECT probed), and what fio runs for it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from kv_cache.config import Settings
from kv_cache.errors import UserError
from kv_cache.run.leftovers import DATA_PREFIX, describe_dead, leftovers_note, write_marker
from kv_cache.tiers.fsinfo import RAM_FILESYSTEMS, mount_of, probe_direct, refuse_system_dir
from kv_cache.tiers.kinds import StorageSite


def check_dir(path: str) -> None:
    refuse_system_dir(path)
    if not os.path.exists(path):
        raise UserError(f"cache directory {path} does not exist; create it or pass another --cache-dir.")
    if not os.path.isdir(path):
        raise UserError(f"cache directory {path} is not a directory; pass a directory to --cache-dir.")
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"cache directory {path} is not writable; fix its permissions or pass another --cache-dir.")


def storage_site(s: Settings, run_id: str, engines: dict, join: bool = False) -> StorageSite:
    """Check the cache directory, make the run's data directory and choose the engine.

    join: the directory is a shared namespace another rank already made (--shared-storage).
    """
    cache_dir, made = s.tiers.cache_dir, []
    if not cache_dir:
        cache_dir = os.path.join(s.run.output_dir, "cache")
        refuse_system_dir(cache_dir, "--output-dir")
        made = [p for p in (cache_dir, *map(str, Path(cache_dir).parents)) if not os.path.lexists(p)]
        try:
            os.makedirs(cache_dir, exist_ok=True)
        except OSError as e:
            raise UserError(f"cannot create the default cache directory {cache_dir}: {e.strerror}; pass "
                            f"--cache-dir or another --output-dir.") from None
    cache_dir = os.path.abspath(cache_dir)
    check_dir(cache_dir)
    mount = mount_of(cache_dir)
    warnings = []
    if mount.fs_type in RAM_FILESYSTEMS:
        if not s.tiers.allow_tmpfs:
            raise UserError(f"cache directory {cache_dir} is on {mount.fs_type} (RAM), so the NVMe tier would "
                            f"measure memory; pass a directory on the device under test, or --allow-tmpfs.")
        warnings.append(f"the NVMe tier is on {mount.fs_type}: its numbers are RAM, not a storage device.")
    data_dir = os.path.join(cache_dir, f"{DATA_PREFIX}{run_id}")
    if not join:
        note = leftovers_note(cache_dir)
        if note:
            warnings.append(note)
    try:
        os.makedirs(data_dir, exist_ok=join)
    except FileExistsError:
        why = describe_dead(data_dir) or "a run with the same --run-id kept its data (--keep-data)"
        raise UserError(f"{data_dir} already exists: {why}; remove it (`kv_cache_benchmark.py clean --cache-dir "
                        f"{cache_dir}` removes what killed runs left) or choose another --run-id.") from None
    except OSError as e:
        raise UserError(f"cannot create {data_dir}: {e.strerror}; pass a writable --cache-dir with free "
                        f"space.") from None
    try:  # from here until the caller holds the site, anything that stops the run (a signal too) removes it
        if not join:
            write_marker(data_dir, run_id)
        engine, note = _engine(engines[s.tiers.io_engine], data_dir, cache_dir, mount.fs_type, warnings)
    except BaseException as e:
        if not join:  # an empty folder, or one holding only its marker: a start-up signal left it (issue 37)
            shutil.rmtree(data_dir, ignore_errors=True)
        if isinstance(e, (OSError, UserError)):
            raise UserError(f"cannot create {data_dir}: {getattr(e, 'strerror', None) or e}; pass a writable "
                            f"--cache-dir with free space.") from None
        raise
    return StorageSite(cache_dir, data_dir, mount.fs_type, mount.mount_point, engine, note, warnings,
                       [os.path.abspath(p) for p in made])


def _engine(engine, data_dir: str, cache_dir: str, fs_type: str, warnings: list[str]) -> tuple[str, str]:
    """The NVMe engine that will run (by name), and the note saying why when it is not the one asked for."""
    if not engine.direct:
        return engine.name, ""
    why = probe_direct(data_dir)
    if not why:
        return engine.name, ""
    warnings.append(f"O_DIRECT is not available in {cache_dir} ({why}); the buffered engine (write + fsync, page "
                    f"cache dropped before reads) runs instead.")
    return "buffered", f"fallback: {fs_type} refused O_DIRECT ({why})"


def fio_of(site, engines: dict) -> tuple[str, int, bool]:
    """What fio runs for the site's engine (its table's entry); fio's null engine without a site."""
    return engines[site.engine].fio if site else ("null", 0, False)
