"""Folders a tool whose configuration runs here would make when missing (the MLPerf reference's --cache-dir,
LMCache's local_disk): made here too, said, and removed again, where still empty, when the run is then refused."""

from __future__ import annotations

import os

from kv_cache.errors import UserError


def make_missing(path: str, where: str) -> list[str]:
    """Make the folder path (and its missing parents) unless it exists; the folders made, deepest first. where:
    what named it (a flag, a file's key), for the refusals."""
    from kv_cache.tiers.fsinfo import refuse_system_dir

    if os.path.exists(path):
        return []
    refuse_system_dir(os.path.abspath(path), where)
    missing, at = [], os.path.abspath(path)
    while not os.path.exists(at):
        missing.append(at)
        at = os.path.dirname(at)
    try:
        os.makedirs(path)
    except OSError as e:
        raise UserError(f"{where} {path} does not exist and cannot be made ({e.strerror}); name a folder you may "
                        f"write.") from None
    return missing


def remove_if_empty(made: list[str]) -> None:
    """The run was refused before anything ran: the folders made for it go again (deepest first, empty only)."""
    for folder in made:
        if os.path.isdir(folder) and not os.listdir(folder):
            os.rmdir(folder)
