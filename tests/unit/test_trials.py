"""--trials N: the warning when the trials disagree (run/trials.py)."""

import statistics

from kv_cache.run.trials import spread_warnings


def _summary(values):
    ok = [v for v in values if v is not None]
    return {"requests_per_s": {"values": values, "median": statistics.median(ok), "min": min(ok), "max": max(ok),
                               "cv": None}}


def test_a_spread_beyond_a_tenth_of_the_median_is_said():
    """Issue 39, item 3: trials differing by 47 % were reported as one median with no word."""
    (line,) = spread_warnings(_summary([10.0, 12.0, 14.7]))
    assert line.startswith("warning: requests_per_s differs by 39% of its median") and "10 to 14.7" in line
    assert spread_warnings(_summary([10.0, 10.5, 10.2])) == []
    assert spread_warnings(_summary([10.0, None])) == []  # one trial's figure: nothing to compare


def test_an_even_count_of_trials_is_not_said_to_have_a_median_trial(tmp_path):
    """Two trials have no median trial: the lower middle one's results.json was called 'the median trial'."""
    from results_fixture import results

    from kv_cache.run.trials import conclude

    for n, says in ((2, "the lower of the two middle trials"), (3, "the median trial")):
        lines: list[str] = []
        conclude([results() for _ in range(n)], tmp_path, lines.append)
        assert f"results.json = {says} by cached tokens/s" in lines[0]
