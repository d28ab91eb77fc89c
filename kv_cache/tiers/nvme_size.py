"""The NVMe tier's size: --nvme-gb, or the automatic rule of fixed facts of the machine (a power of two GiB within
a quarter of the filesystem, 64 GiB and half its free space), agreed by rank 0 under MPI; a part of the disk medium
(nvme.py declares it)."""

from __future__ import annotations

import math
import os
import shutil

from kv_cache.errors import UserError
from kv_cache.tiers.kinds import GiB, StorageSite

NVME_AUTO_FRACTION, NVME_AUTO_MAX = 0.25, 64 * GiB  # --nvme-gb 0: within a quarter of the filesystem, at most 64 GiB
FREE_SHARE = 0.5  # ... and within half of what is free


def auto_bytes(where: str, ranks: int = 1) -> tuple[int, str]:
    """--nvme-gb 0: (bytes per rank, the rule as said): the largest power of two GiB within a quarter of the
    filesystem's size (a fixed fact of the machine), 64 GiB and half its free space. A power of two, so that what a
    neighbour writes or deletes does not change the choice short of halving or doubling the free space."""
    usage = shutil.disk_usage(where)
    bound = min(usage.total * NVME_AUTO_FRACTION, NVME_AUTO_MAX, usage.free * FREE_SHARE)
    size = GiB
    while size * 2 <= bound:
        size *= 2
    if size > bound:  # under 1 GiB: a small disk or a nearly full one
        size = int(bound)
    return size // ranks, (f"the largest power of two GiB within {NVME_AUTO_FRACTION:.0%} of the "
                           f"{usage.total / GiB:.0f} GiB filesystem of {where}, {NVME_AUTO_MAX / GiB:.0f} GiB and half "
                           f"its {usage.free / GiB:.0f} GiB free")


def capacity(s, site: StorageSite, slot: int, max_object_bytes: int, free: int) -> tuple[int, str]:
    """(The tier's bytes: --nvme-gb, or auto_bytes; the rule said for auto). Refused when it holds no object."""
    said = ""
    if s.nvme_gb:
        want = int(s.nvme_gb * GiB)
        if want > free:
            raise UserError(f"--nvme-gb {s.nvme_gb:g} asks for {want / GiB:.2f} GiB but {site.cache_dir} "
                            f"has {free / GiB:.2f} GiB free; lower --nvme-gb or free space.")
    else:
        want, said = auto_bytes(site.cache_dir)
    if want // slot * slot < max_object_bytes:
        if s.nvme_gb:  # the size asked for is short, not the disk
            need = -(-max_object_bytes // slot) * slot / GiB
            raise UserError(f"--nvme-gb {s.nvme_gb:g} holds no {max_object_bytes / 2**20:.1f} MiB object, the "
                            f"largest this run stores; pass --nvme-gb {math.ceil(need * 100) / 100:g} or more"
                            + (f" (and free space: {site.cache_dir} has {free / GiB:.2f} GiB free)"
                               if need * GiB > free else "") + ".")
        raise UserError(f"{site.cache_dir} has too little space for the NVMe tier: {want / GiB:.3f} GiB holds no "
                        f"{max_object_bytes / 2**20:.1f} MiB object ({free / GiB:.2f} GiB free); free space, "
                        f"pass a larger --nvme-gb or another --cache-dir.")
    return want // slot * slot, said


def _most_bytes(s) -> int:
    if s.nvme == "off":
        return 0
    return int(s.nvme_gb * GiB) if s.nvme_gb else NVME_AUTO_MAX


def _resolved(s, tier) -> dict:
    """--nvme-gb 0 chose a size: a whole number of slots (GiB as a float is exact here, a power of 2)."""
    return {} if s.nvme_gb else {"tiers.nvme_gb": tier.capacity_bytes / GiB}


def _agree(s, ranks: int, cache_dir: str) -> tuple[dict, str]:
    """--nvme-gb 0 under MPI: one size for every rank, the automatic share of the free space split over the ranks
    (deciding alone, two ranks on one disk chose 17.50 and 13.12 GiB: the second saw the first's slabs)."""
    if s.nvme == "off" or s.nvme_gb or s.shared_storage or s.null_io:
        return {}, ""
    where = cache_dir
    while not os.path.isdir(where) and os.path.dirname(where) != where:  # the default folder is made later
        where = os.path.dirname(where)
    each, said = auto_bytes(where, ranks)
    return {"tiers.nvme_gb": each / GiB}, (
        f"nvme tier size chosen by rank 0 for every rank: {each / GiB:.2f} GiB each, {each * ranks / GiB:.2f} GiB in "
        f"all = {said}, over {ranks} ranks; --nvme-gb fixes it (per rank)")
