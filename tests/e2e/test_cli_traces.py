"""Traces through the real CLI: exact theoretical hit rate, history hits, open loop, bad input."""

import pytest
from conftest import REPO, SHARED_TRACES, bounded, needs_shared_traces, run_cli
from helpers import assert_clean_error

pytestmark = pytest.mark.slow  # make test-all (CI); make test stays quick

MOON = str(REPO / "traces" / "mooncake_conversation_sample.jsonl")
TINY = ["--set", "models.tiny={layers: 1, kv_heads: 1, head_dim: 8}", "--model", "tiny"]


@pytest.mark.parametrize("bt", ["16", "100", "512"])
def test_mooncake_achieved_hit_rate_equals_theoretical_with_room_for_everything(small_run, bt):
    r = run_cli(small_run("m", "--trace", MOON, *TINY, "--block-tokens", bt, "--arrival", "closed", "--users", "1",
                          "--think-time-s", "0,0", "--workers", "1", "--warmup", "0", "--duration", "600",
                          "--cpu-mem-gb", "1", "--nvme-gb", "0.2"))
    assert r.returncode == 0, r.stderr
    res = small_run.results("m")
    assert res["run"]["stopped_reason"] == "trace_end" and res["requests"]["completed"] == 200
    assert res["workload"]["source"] == "mooncake"
    assert res["hit_rate"]["tokens"] == res["workload"]["theoretical_hit_rate"]["tokens"] > 0.03
    assert res["verification"]["failures"] == 0 and res["verification"]["blocks_checked"] > 0


@needs_shared_traces
def test_sharegpt_multi_turn_history_gives_prefix_hits(small_run):
    trace = str(SHARED_TRACES / "sharegpt" / "sharegpt_zh_1K.first600.jsonl")
    r = run_cli(small_run("s", "--trace", trace, *TINY, "--block-tokens", "16", "--max-conversations", "40",
                          "--users", "4", "--think-time-s", "0,0", "--warmup", "0", "--duration", "600",
                          "--cpu-mem-gb", "0.5", quiet=False))
    assert r.returncode == 0, r.stderr
    assert "traffic: sharegpt trace, arrival closed" in r.stdout and "tokenizer:" in r.stdout
    res = small_run.results("s")
    assert res["run"]["stopped_reason"] == "trace_end"
    assert res["hit_rate"]["by_source"]["history"] > 0.5
    assert res["workload"]["theoretical_hit_rate"]["by_source"]["history"] > 0.5


def test_a_traces_closed_loop_users_are_its_conversations_at_most(small_run, tmp_path):
    """Three conversations and --users 50: three users replay them, and the summary said 50 users (and would have
    said 47 of them never started)."""
    chat = tmp_path / "chat.jsonl"
    chat.write_text("".join(f'{{"id": "{i}", "conversations": [{{"from": "human", "value": "question {i}"}}, '
                            f'{{"from": "gpt", "value": "answer {i}"}}]}}\n' for i in range(3)))
    r = run_cli(small_run("c", "--trace", str(chat), *TINY, "--users", "50", "--think-time-s", "0,0", "--warmup", "0",
                          "--duration", "600", quiet=False))
    assert r.returncode == 0, r.stderr
    assert small_run.results("c")["run"]["users"] == 3 and "; 3 users, " in r.stdout
    # a large text trace is tokenized before anything is said: 35 s of silence for 216 MB
    assert r.stdout.startswith("  reading the trace: ") and "KiB of sharegpt, tokenized now" in r.stdout.split("\n")[0]


def test_burstgpt_sample_open_loop_at_trace_time(small_run):
    """Its requests come at their timestamps, from no user: --users 7 did nothing, silently, and results.json said
    7 users."""
    r = run_cli(small_run("b", "--trace", str(REPO / "traces" / "burstgpt_sample.csv"), *TINY, "--users", "7",
                          "--trace-speedup", "2000", "--warmup", "0", "--duration", "600", quiet=False))
    assert r.returncode == 0, r.stderr
    res = small_run.results("b")
    assert res["workload"]["arrival"] == "trace" and res["workload"]["trace"]["skipped"] == {"failed_rows": 5}
    assert res["run"]["users"] == 0 and "open loop at the trace's times" in r.stdout
    assert "note: --users 7 makes no user here: requests come at the trace's times" in " ".join(r.stdout.split())
    assert res["requests"]["completed"] == 95 and res["run"]["stopped_reason"] == "trace_end"
    assert res["request_latency_ms"]["queue"]["count"] == 95


def test_poisson_arrivals_with_synthetic_users(small_run):
    r = run_cli(small_run("p", "--arrival", "poisson", "--request-rate", "40", *bounded(60), "--null-io"))
    assert r.returncode == 0, r.stderr
    res = small_run.results("p")
    assert res["workload"]["arrival"] == "poisson" and res["run"]["stopped_reason"] == "max_requests"
    assert res["requests"]["issued"] == res["requests"]["completed"] == 60


@pytest.mark.parametrize("extra,fragments", [
    (["--arrival", "poisson"], ["needs --request-rate"]),
    (["--arrival", "trace"], ["needs --trace with timestamps"]),
    (["--trace", "/nonexistent/x.jsonl"], ["matches no file"]),
    (["--trace", str(REPO / "README.md")], ["cannot tell the format"]),
    # its timestamps unused: the run went on at the rate given, the speed-up silently dropped
    (["--trace", MOON, "--arrival", "poisson", "--request-rate", "5", "--trace-speedup", "20"],
     ["--trace-speedup scales the timestamps", "arrival is poisson", "drop --trace-speedup"]),
    (["--trace", MOON, "--think-time-s", "0,0"],
     ["--think-time-s is the pause", "arrival is trace", "--arrival closed"]),
])
def test_bad_traffic_settings(small_run, extra, fragments):
    assert_clean_error(run_cli(small_run("x", *extra)), *fragments)


def test_strict_and_undetectable_traces(small_run, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n{oops\n')
    assert_clean_error(run_cli(small_run("x", "--trace", str(bad), "--strict")), f"{bad}:2: not valid JSON")
    odd = tmp_path / "odd.csv"
    odd.write_text("a,b\n1,2\n")
    assert_clean_error(run_cli(small_run("x", "--trace", str(odd))), "cannot tell the format")
    chat = tmp_path / "chat.json"
    chat.write_text('[{"id": "a", "conversations": [{"from": "human", "value": "hello there"}, '
                    '{"from": "gpt", "value": "hi"}]}]')
    assert_clean_error(run_cli(small_run("x", "--trace", str(chat), "--arrival", "trace")), "needs timestamps")


def test_a_folder_of_traces_of_several_formats_is_named_as_such(small_run):
    """--trace traces (the shipped samples: Azure, BurstGPT, Mooncake) took the first file's format for all and said
    "traces/burstgpt_sample.csv: missing column 'TIMESTAMP'", as if that file were broken."""
    assert_clean_error(run_cli(small_run("x", "--trace", str(REPO / "traces"))), "holds files of 3 formats",
                       "azure_conv_sample.csv is azure", "burstgpt_sample.csv is burstgpt",
                       "mooncake_conversation_sample.jsonl is mooncake", "pass the files of one")


@pytest.mark.parametrize("mode,label", [("prefix", "rag"), ("chunk", "rag_chunk")])
def test_rag_reuse_modes_and_exact_theoretical_hit_rate(small_run, mode, label):
    no_think = [x for p in ("chatbot", "coding", "document") for x in ("--set", f"profiles.{p}.think_time_s=0,0")]
    r = run_cli(small_run("r", "--rag", "--rag-reuse", mode, "--request-probability", "1", "--num-documents", "20",
                          "--document-tokens", "16,64", "--rag-top-k", "3", "--users", "1", "--workers", "1",
                          "--warmup", "0", "--duration", "600", "--max-requests", "20", "--cpu-mem-gb", "1",
                          *no_think))
    assert r.returncode == 0, r.stderr
    res = small_run.results("r")
    assert res["hit_rate"]["tokens"] == res["workload"]["theoretical_hit_rate"]["tokens"]
    assert res["tokens"]["cached_by_source"].get(label, 0) > 0
    assert res["hit_rate"]["by_source"][label] > 0
    other = {"rag": "rag_chunk", "rag_chunk": "rag"}[label]
    assert res["tokens"]["cached_by_source"].get(other, 0) == 0


def test_a_burstgpt_run_says_it_replays_a_sliver_and_can_reuse_nothing(small_run):
    """Issue 39, item 7: the obvious BurstGPT command measured nothing (its rows span hours) and nothing suggested
    --trace-speedup, nor said that a length-only trace's possible hit rate is 0 %."""
    r = run_cli(small_run("b", "--trace", str(REPO / "traces" / "burstgpt_sample.csv"), *TINY, "--null-io",
                          "--warmup", "0", "--duration", "2", quiet=False))
    assert r.returncode == 0, r.stderr
    assert "no two requests of this traffic share a prefix" in r.stdout
    assert "arrive over 28,566 s at --trace-speedup 1" in r.stdout and "--trace-speedup 14,283 plays" in r.stdout


def _conversations(path, n: int) -> None:
    """n single-turn conversations of our own words; the first opens with its own system turn."""
    import json

    rows = []
    for i in range(n):
        turns = [{"from": "system", "value": "You answer briefly. " * 20}] if i == 0 else []
        turns += [{"from": "human", "value": f"Question {i}: how many blocks hold {i} tokens? " * 6},
                  {"from": "gpt", "value": f"Answer {i}: " + "one block. " * 10}]
        rows.append({"id": str(i), "conversations": turns})
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_a_replay_says_how_much_of_its_prompt_and_hit_rate_the_benchmark_injected(small_run, tmp_path):
    """Issue 50, point 6: a ShareGPT replay's hit rate came all from the system prompts the benchmark put before
    conversations that had none, unsaid. The summary's first lines say their share of the prompt and of the hit
    rate; they are a source of their own (a conversation's own system turn stays "system"); without them the trace
    replays as it is."""
    trace = tmp_path / "ours.jsonl"
    _conversations(trace, 30)
    args = ("--trace", str(trace), *TINY, "--block-tokens", "16", "--users", "2", "--think-time-s", "0,0",
            "--warmup", "0", "--duration", "600", "--null-io")
    r = run_cli(small_run("inj", *args, quiet=False))
    assert r.returncode == 0, r.stderr
    head = " ".join(r.stdout.split("Latency")[0].split())
    res = small_run.results("inj")
    tok = res["tokens"]
    assert tok["prompt_by_source"]["system_injected"] > 0 and tok["prompt_by_source"]["system"] > 0
    assert "injected: a shared system prompt the benchmark put before" in head, head
    share = tok["cached_by_source"]["system_injected"] / tok["prompt"]
    assert share > 0.5 * res["hit_rate"]["tokens"] and f"{share:.1%} of the" in head  # most of the hits: injected
    r = run_cli(small_run("as-is", *args, "--set", "workload.num_system_prompts=0", quiet=False))
    assert r.returncode == 0, r.stderr
    plain = small_run.results("as-is")["tokens"]
    assert "system_injected" not in plain["prompt_by_source"] and "injected:" not in r.stdout


def test_sharegpt_turns_kept_with_a_changed_answer_are_not_said_skipped(small_run, tmp_path):
    """A ShareGPT file whose messages had no answer ran every one of them with a 128-token answer, and the run said
    "trace records skipped: answers_missing_fixed_length 1000": none was skipped."""
    import json

    trace = tmp_path / "conv.jsonl"
    convs = [[{"from": "human", "value": f"question {k} " * 40}] for k in range(3)]  # no answer: given one
    convs.append([{"from": "human", "value": "short question " * 30}, {"from": "gpt", "value": "long answer " * 120}])
    trace.write_text("".join(json.dumps({"id": str(k), "conversations": c}) + "\n" for k, c in enumerate(convs)))
    r = run_cli(small_run("a", "--trace", str(trace), *TINY, "--block-tokens", "16", "--set",
                          "trace.max_output_tokens=150", "--set", "trace.min_prompt_tokens=1", "--warmup", "0",
                          "--duration", "600", quiet=False))
    assert r.returncode == 0, r.stderr
    assert "skipped" not in r.stdout and "trace turns kept with a change: answers_given_fixed_length 3" in r.stdout
    trace_log = small_run.results("a")["workload"]["trace"]
    assert trace_log["skipped"] == {} and trace_log["changed"] == {"answers_given_fixed_length": 3, "answers_cut": 1}
    assert small_run.results("a")["requests"]["completed"] == 4
