"""A complete Results from a real Recorder, without a run: what the schema and report tests read."""

from kv_cache.config import Settings
from kv_cache.recorder.recorder import Recorder
from kv_cache.recorder.results import RunFacts, build_results
from kv_cache.types import RequestOutcome

S = 1_000_000_000


def run_info(tiers=("cpu", "nvme")) -> dict:
    return {"rank": 0, "ranks": 1, "hosts": ["h"], "wall_offset_ns": 0, "tool_version": "0", "run_id": "r",
            "host": "h", "started_utc": "2026-01-01T00:00:00Z", "model": "llama8b", "kv_dtype": "fp16", "tp": 1,
            "bytes_per_token": 131072, "block_tokens": 16, "block_bytes": 2 << 20, "slot_bytes": 2 << 20,
            "users": 1, "workers": 1, "workers_probe": None, "seed": 1, "warmup_s": 0.0, "io_engine": "direct",
            "io_engine_requested": "direct", "io_engine_note": "", "nvme_layout": "slab", "cache_dir": "/x",
            "fs_type": "ext4", "tiers": {t: {"capacity_bytes": 8 << 20, "description": t} for t in tiers},
            "bottom_tier": tiers[-1], "gds": None, "notes": [], "partial": False, "stopped_reason": "duration",
            "fault": ""}


WORKLOAD = {"source": "synthetic", "arrival": "closed", "notes": [], "trace": None, "tokenizer": None,
            "requests_analysed": 0, "requests_total": 0, "prompt_tokens": {"count": 0}, "output_tokens": {"count": 0},
            "counts": {"cached": 0, "prompt": 0, "cached_by_source": {}, "prompt_by_source": {}},
            "theoretical_hit_rate": {"tokens": None, "by_source": {}}}
def facts() -> RunFacts:
    return RunFacts(WORKLOAD, {"peak_rss_bytes": 1, "budget_bytes": 2}, {})


def results(recorder: Recorder | None = None, tiers=("cpu", "nvme")):
    r = recorder
    if r is None:
        r = Recorder()
        r.start_measuring(1)
        r.op(tiers[-1], "read", "load", 2 * S // 10, 1000, 2 << 20)
        r.request(S // 10, S // 10 + 500, 3 * S // 10, 1000, RequestOutcome(32, 0, cached_tokens=16))
        r.stop_measuring(2 * S)
    return build_results(r.snapshot(), run_info(tiers), Settings().to_dict(), facts())
