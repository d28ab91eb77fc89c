"""Issue 18: replay keeps a session's turns in order; a run that cannot measure anything says so."""

import pytest
from conftest import run_cli
from helpers import assert_clean_error
from results_fixture import results

from kv_cache.recorder.sections import Role
from kv_cache.run.describe import nothing_measured, warnings_of


def _sessions_csv(path, sessions=12, turns=4):
    """A BurstGPT v3-style trace (Session ID): each session's turns arrive 2 ms apart, far faster than served."""
    rows = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type,Session ID"]
    for s in range(sessions):
        prompt = 0
        for t in range(turns):
            prompt += 48 + 32  # the previous prompt and its 32-token answer, then 48 new tokens
            rows.append(f"{s * 0.05 + t * 0.002:.3f},ChatGPT,{prompt},32,{prompt + 32},Conversation log,s{s}")
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.mark.slow  # make test-all: two 48-request replays
def test_a_turn_waits_for_its_previous_answer_with_any_worker_count(small_run, tmp_path):
    trace = _sessions_csv(tmp_path / "v3.csv")
    rates = []
    for workers in (1, 8):
        run_id = f"w{workers}-{len(rates)}"
        r = run_cli(small_run(run_id, "--trace", str(trace), "--arrival", "trace", "--workers", str(workers),
                              "--max-requests", "48", "--duration", "600", "--warmup", "0",
                              "--nvme-gb", "1"))
        assert r.returncode == 0, r.stderr
        res = small_run.results(run_id)
        # the trace's 48 requests, however slow the machine: the run ends when the last one is answered
        assert res["run"]["stopped_reason"] in ("trace_end", "max_requests"), res["run"]
        assert res["requests"]["completed"] == 48
        # every later turn found its whole history: turn k's blocks were written before turn k+1 started
        assert res["hit_rate"]["by_source"]["history"] == 1.0, res["hit_rate"]
        assert res["requests"]["held_for_previous_turn"] > 0
        assert res["request_latency_ms"]["turn_wait"]["count"] == res["requests"]["held_for_previous_turn"]
        rates.append(res["hit_rate"])
    assert rates[0] == rates[1]  # the same hits whatever the worker count: turns kept their order


def test_a_trace_used_up_in_the_warmup_is_refused_up_front(small_run, tmp_path):
    trace = tmp_path / "short.csv"
    trace.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                     + "".join(f"{i * 0.1:.1f},ChatGPT,100,20,120,Conversation log\n" for i in range(10)))
    r = run_cli(small_run("short", "--trace", str(trace), "--arrival", "trace", "--warmup", "2"))
    assert_clean_error(r, "arrive over 0.90 s", "inside the 2 s warm-up", "--warmup")


@pytest.mark.parametrize("reason, says", [("trace_end", "the trace ran out"), ("duration", "raise --duration"),
                                          ("max_requests", "raise --max-requests or lower --warmup")])
def test_a_window_without_a_completed_request_is_a_failure(reason, says):
    r = results()
    assert nothing_measured(r) == ""
    r.requests.completed = 0
    r.requests.warmup_completed = r.requests.issued  # --max-requests: every one done before the window opened
    r.run.stopped_reason = reason
    assert nothing_measured(r).startswith("nothing was measured") and says in nothing_measured(r)
    r.run.partial = True
    assert nothing_measured(r) == ""  # an interrupted run is partial, said so already


def test_a_decode_node_whose_prefill_node_ended_in_its_warmup_is_told_what_ended():
    """A decode node's manifest is no trace: 'lower --warmup or --trace-speedup' named a flag it has not."""
    r = results()
    r.requests.completed, r.run.stopped_reason = 0, "trace_end"
    r.role = Role("decode", "nixl://127.0.0.1:7000", "nixl (UCX)")
    why = nothing_measured(r)
    assert "the prefill node ended its manifest" in why and "--trace-speedup" not in why


def test_a_bottom_tier_without_traffic_names_the_flag_of_the_node_that_offers_the_load():
    """A decode node's load is its prefill node's: 'raise --users' named a flag that does nothing there."""
    r = results()
    r.bytes[r.bottom].read = r.bytes[r.bottom].write = 0
    assert any("raise --users or lower --cpu-mem-gb" in w for w in warnings_of(r))
    r.role = Role("decode", "nixl://127.0.0.1:7000", "nixl (UCX)")
    assert any("load the prefill nodes harder (their --users)" in w and "or lower" not in w for w in warnings_of(r))
