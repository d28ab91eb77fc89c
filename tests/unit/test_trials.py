"""--trials N: what the run and `report` say of the trials (run/trials.py, report/trials.py)."""

import statistics

from kv_cache.recorder.sections import Spread
from kv_cache.report.trials import spread_warning, table


def _spread(values):
    ok = [v for v in values if v is not None]
    return Spread(values, statistics.median(ok), min(ok), max(ok), None)


def test_a_spread_beyond_a_tenth_of_the_median_is_said():
    """Issue 39, item 3: trials differing by 47 % were reported as one median with no word."""
    (line,) = spread_warning({"requests_per_s": _spread([10.0, 12.0, 14.7])}, "duration")
    assert "1 headline number: requests_per_s by 39% (10.00 to 14.70)" in line  # the table's decimals
    assert spread_warning({"requests_per_s": _spread([10.0, 10.5, 10.2])}, "duration") == []
    assert spread_warning({"requests_per_s": _spread([10.0, None])}, "duration") == []  # nothing to compare


def test_the_trials_disagreeing_is_one_warning_whose_advice_fits_what_bounded_them():
    """Seven headlines apart gave seven warnings, each saying 'lengthen --duration or --warmup' of trials that
    --max-requests bounded."""
    summary = {"requests_per_s": _spread([1.5, 2.5, 2.0]), "token_hit_rate": _spread([0.78, 0.89, 0.87])}
    (line,) = spread_warning(summary, "max_requests")
    assert "2 headline numbers" in line and "raise --max-requests" in line and "--duration" not in line
    assert "token_hit_rate by 13% (78.0% to 89.0%)" in line
    (line,) = spread_warning(summary, "duration")
    assert "lengthen --duration or --warmup" in line


def test_the_hit_rate_reads_as_a_percent_in_the_table():
    """The trials' table gave token_hit_rate as 0.8662 where every other output says 86.6%."""
    (row,) = [r for r in table({"token_hit_rate": _spread([0.78, 0.89, 0.8662])}) if "token_hit_rate" in r]
    assert row.split()[1:4] == ["86.6%", "78.0%", "89.0%"]


def test_an_even_count_of_trials_is_not_said_to_have_a_median_trial(tmp_path):
    """Two trials have no median trial: the lower middle one's results.json was called 'the median trial'."""
    from results_fixture import results

    from kv_cache.run.trials import conclude

    for n, says in ((2, "the lower of the two middle trials"), (3, "the median trial")):
        lines: list[str] = []
        conclude([results() for _ in range(n)], tmp_path, lines.append)
        assert f"results.json = {says} by cached tokens/s" in lines[0]


def test_a_null_tiers_times_are_no_storage_headline():
    """--null-io's trials said storage_read_p99_ms 0.01035 to 0.01342 and warned the trials disagreed on it, and
    compare put its 0.0025 ms beside a real run's: the null tier moves no byte (its GB/s were already left out)."""
    from results_fixture import results

    from kv_cache.run.trials import summarize

    r = results()
    assert r.latency(r.bottom, "read", "max") is not None
    r.run.tiers[r.bottom].null = True
    assert r.latency(r.bottom, "read", "max") is None and r.storage_gbps("read") is None
    assert summarize([r, r])["storage_read_p99_ms"]["median"] is None


def test_a_large_headline_reads_in_whole_units():
    """cached_tokens_per_s read 3.28e+04 in the trials' table."""
    (row,) = [r for r in table({"cached_tokens_per_s": _spread([32_784.0, 32_812.0])}) if "cached" in r]
    assert row.split()[1:4] == ["32,798", "32,784", "32,812"]


def test_a_row_gives_its_min_and_max_the_medians_decimals():
    """A row read 0.8589 0.785 0.8695 and 341 331.6 363.9: each figure with its own significant digits."""
    rows = table({"storage_read_gbps": _spread([0.8589, 0.785, 0.8695]),
                  "storage_read_p99_ms": _spread([341.0, 331.6, 363.9])})
    (gbps,) = [r for r in rows if "gbps" in r]
    (p99,) = [r for r in rows if "p99" in r]
    assert gbps.split()[1:4] == ["0.8589", "0.7850", "0.8695"]
    assert p99.split()[1:4] == ["341.0", "331.6", "363.9"]
