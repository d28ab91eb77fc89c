"""QoS classes, the priority queue and steady-state detection."""

from __future__ import annotations

from collections import Counter

from kv_cache.config import QosSettings
from kv_cache.recorder.results import steady_state
from kv_cache.scheduler.qos import PriorityRequests, QosPolicy
from kv_cache.types import Request


def _req(qos: str, intended: int) -> Request:
    r = Request(0, 0, 0, None, None, (), qos=qos)
    r.intended_ns = intended
    return r


def test_classes_follow_the_mix_and_the_seed():
    p = QosPolicy(QosSettings(mix="interactive=1,responsive=1,batch=2", assign="request"), seed=3)
    drawn = Counter(p.classify(u, s) for u in range(100) for s in range(40))
    assert abs(drawn["batch"] / 4000 - 0.5) < 0.03 and abs(drawn["interactive"] / 4000 - 0.25) < 0.03
    again = QosPolicy(QosSettings(mix="interactive=1,responsive=1,batch=2", assign="request"), seed=3)
    assert [p.classify(u, 1) for u in range(50)] == [again.classify(u, 1) for u in range(50)]
    per_user = QosPolicy(QosSettings(assign="user"), seed=3)
    assert all(len({per_user.classify(u, s) for s in range(20)}) == 1 for u in range(20))


def test_the_queue_serves_priority_first_then_intended_start():
    q = PriorityRequests({"interactive": 3, "responsive": 2, "batch": 1})
    for qos, t in (("batch", 1), ("responsive", 5), ("interactive", 9), ("batch", 0), ("interactive", 2)):
        q.put(_req(qos, t))
    q.put(None)
    got = [q.get() for _ in range(6)]
    assert [(r.qos, r.intended_ns) for r in got[:5]] == [("interactive", 2), ("interactive", 9), ("responsive", 5),
                                                         ("batch", 0), ("batch", 1)]
    assert got[5] is None


def _rows(values):
    return [{"t_s": i, "requests": v, "tokens_prompt": 10 * v} for i, v in enumerate(values)] + [{"t_s": 99,
                                                                                                "requests": 0,
                                                                                                "tokens_prompt": 0}]


def test_steady_state_is_found_after_a_ramp_and_not_in_noise():
    st = steady_state(_rows([1, 5, 20, 50, 98, 100, 101, 99, 100, 102]), 0.05, 4)
    assert st["detected"] and st["from_s"] == 4 and abs(st["requests_per_s"] - 100) < 1.5
    assert not steady_state(_rows([10, 100, 10, 100, 10, 100]), 0.05, 3)["detected"]
    assert steady_state(_rows([1, 2, 3]), 0.0, 3) is None


def test_a_tolerance_the_rates_counting_noise_cannot_meet_is_said():
    """A flat run of 5.2 requests/s said "Steady not reached" at 10 % and nothing more: a second's count of 5
    varies by 44 % by chance alone, so no window of it could be found (every --steady-state below about 0.9)."""
    from results_fixture import results

    from kv_cache.recorder.sections import SteadyState
    from kv_cache.report.load_lines import steady_section

    r = results()
    r.requests.per_s = 5.2
    r.steady_state = SteadyState(0.1, 10, False, None, None, None)
    (line,) = steady_section(r)
    assert "at 5.2 requests a second, a second's count varies by about 44% by chance alone" in line
    assert "--steady-state 0.9 or more" in line
    r.requests.per_s = 900.0  # 3 % by chance: a 10 % tolerance can be met, and not meeting it says something
    assert steady_section(r) == ["Steady     not reached: no 10 s window of requests/s within 10% of its mean"]


def test_the_capacity_answer_is_called_what_it_is():
    """'peak throughput: 20 users (22,982 tokens/s)' above a table whose 30-user step served 24,002: the answer is
    the fewest users within --autoscale-min-gain of the peak, not the peak."""
    from results_fixture import results

    from kv_cache.recorder.sections import Autoscale, AutoscaleStep
    from kv_cache.report.load_lines import autoscale_section

    steps = [AutoscaleStep(u, 10.0, 3.0, 3.0, tps, None, None, None, {}) for u, tps in
             ((10, 19_115.0), (20, 22_982.0), (30, 24_002.0), (40, 19_377.0))]
    r = results()
    r.autoscale = Autoscale("capacity", 200, steps, AutoscaleStep(20, 10.0, 3.0, 3.0, 22_982.0, None, None, None, {}),
                            "throughput did not grow by 5% in 2 steps", {"min_gain": 0.05})
    said = " ".join(" ".join(autoscale_section(r)).split())
    assert ("Autoscaler (capacity): the fewest users within 5% of the peak throughput (24,002 tokens/s at 30 users): "
            "20 users (22,982 tokens/s") in said, said
    r.autoscale.curve = steps[:2]  # the answer is the peak: called so
    assert "Autoscaler (capacity): peak throughput: 20 users" in " ".join(autoscale_section(r))
