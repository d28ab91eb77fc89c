"""The fleet's shared-tier log sampled as it is recorded (fleet/shared_log.py): a bounded log whose capacity curve
stays that of the full one."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from kv_cache.fleet.shared_log import SharedLog, rate_for
from kv_cache.recorder.stack_distances import COLUMNS, SAMPLE_ABOVE, capacity_grid, curve

ROW = (16,) + (0,) * (len(COLUMNS) - 1)


def _requests(n: int, seed: int = 3):
    """Chains of a Zipf-popular system prompt, a Zipf-popular conversation's history and new blocks."""
    rng = np.random.default_rng(seed)
    fresh = 1 << 40
    for r in range(n):
        system, convo = int(rng.zipf(1.5)) % 20, int(rng.zipf(1.2)) % 5_000
        keys = [system * 1000 + i + 1 for i in range(8)] + [10**7 + convo * 100 + i for i in range(12)]
        keys += [fresh + 100 * r + i for i in range(int(rng.integers(2, 10)))]
        yield SimpleNamespace(keys=tuple(keys), block_sources=(ROW,) * len(keys), prompt_tokens=16 * len(keys),
                              at_s=r * 0.01)


def _curve(log: SharedLog):
    arrays = log.arrays()
    return curve(arrays, 0, capacity_grid(arrays, 0), rate=log.rate, with_knees=True, sampled_from=log.lookup_tokens)


def test_a_log_sampled_as_recorded_keeps_the_curve_and_a_tenth_of_the_accesses():
    full, sampled = SharedLog(1.0), SharedLog(0.1)
    for p in _requests(20_000):
        reached = list(range(len(p.keys)))
        for log in (full, sampled):
            log.request(p, reached, list(p.keys[-2:]))
    exact, approx = _curve(full), _curve(sampled)
    assert exact.sampled == 1.0 and approx.sampled == 0.1
    assert 0.07 < len(sampled.keys) / len(full.keys) < 0.13
    assert len(sampled.requests) == len(full.requests)  # every request kept, with its prompt tokens
    assert abs(approx.infinite - exact.infinite) < 0.02, (approx.infinite, exact.infinite)
    for mine, true in zip(approx.knees, exact.knees):
        assert abs(mine - true) <= 0.25 * true, (approx.knees, exact.knees)


def test_the_rate_bounds_the_log_past_its_threshold():
    assert rate_for(SAMPLE_ABOVE) == 1.0
    assert rate_for(10 * SAMPLE_ABOVE) * 10 * SAMPLE_ABOVE == SAMPLE_ABOVE
