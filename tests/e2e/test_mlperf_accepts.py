"""Issue 27 (parts 2 and 3): a reference command line runs the reference's load model and says how to get ours;
what the MLPerf reference accepts is accepted here — its "no delay", its saturation target,
--max-conversations without a dataset, prefixes of its flags, its model_configs — and what it refuses (a key
outside its strict config schema, an --output that cannot be written) is refused, before the run."""

import pytest
from conftest import REPO, SMALL, bounded, run_cli
from found import SECTIONS
from helpers import assert_clean_error

from kv_cache.cli.mlperf import expand_prefixes, translate
from kv_cache.config import Settings, resolve
from kv_cache.errors import UserError
from kv_cache.model import find_model

MOONCAKE = REPO / "traces" / "mooncake_conversation_sample.jsonl"
OURS = {"--users", "--duration", "--model", "--output-dir", "--max-requests", "--seed", "--cache-dir"}


def settings_of(*argv):
    t = translate(list(argv))
    sets = [t.argv[i + 1] for i, a in enumerate(t.argv) if a == "--set"]
    return resolve(None, sets, {}, media_sections=SECTIONS), t


def test_trace_speedup_zero_is_no_delay_back_to_back(tmp_path):
    trace = tmp_path / "burst.csv"
    trace.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                     + "".join(f"{i * 5.0:.1f},ChatGPT,100,20,120,Conversation log\n" for i in range(10)))
    s, t = settings_of("--use-burst-trace", "--burst-trace-path", str(trace), "--trace-speedup", "0")
    assert s.schedule.arrival == "closed" and s.schedule.think_time_s == (0.0, 0.0)
    assert "--trace-speedup" not in t.argv and any("no delay" in n for n in t.notes)
    _, alone = settings_of("--num-users", "4", "--trace-speedup", "0")  # no trace: nothing to speed up
    assert any("--trace-speedup 0: not applied" in n for n in alone.notes)
    # the reference times its BurstGPT trace alone: ours refuses a speed-up no timestamp uses
    _, chats = settings_of("--dataset-path", str(trace), "--trace-speedup", "4")
    assert "--trace-speedup" not in chats.argv and any("--trace-speedup 4: not applied" in n for n in chats.notes)
    _, timed = settings_of("--use-burst-trace", "--burst-trace-path", str(trace), "--trace-speedup", "4")
    assert "--trace-speedup" in timed.argv and not any("--trace-speedup" in n for n in timed.notes)


def test_the_burst_trace_at_its_timestamps_makes_no_user_so_the_user_count_is_not_applied():
    """Its requests come at their timestamps, from no user: --num-users (or the reference's 100) would be a --users
    our run ignores; it is said and not passed on. Back to back (--trace-speedup 0) its requests come by users."""
    s, t = settings_of("--num-users", "4", "--use-burst-trace")
    assert s.workload.users == Settings().workload.users and "workload.users" not in " ".join(t.argv)
    assert any(n.startswith("--num-users: 4 users not applied, the trace's requests") for n in t.notes)
    s, t = settings_of("--use-burst-trace")  # the reference's default of 100 is not put either
    assert "workload.users" not in " ".join(t.argv) and not any("users not applied" in n for n in t.notes)
    s, _ = settings_of("--num-users", "4", "--use-burst-trace", "--trace-speedup", "0")
    assert s.workload.users == 4
    s, _ = settings_of("--num-users", "4", "--use-burst-trace", "--arrival", "closed")  # ours, typed: users ask
    assert s.workload.users == 4


def test_our_trace_beside_a_reference_flag_keeps_its_times_its_speed_up_and_our_admission(tmp_path):
    """Our --trace of a timestamped trace beside a reference flag (--output): its requests come at their times,
    from no user, so the reference's all-at-once admission and its 100 users are not put (the run refused
    "--admission all", a flag never typed), and --trace-speedup is ours (it was dropped as the burst trace's).
    A ShareGPT file has no times: its conversations are users, admitted all at once as the reference does."""
    out = str(tmp_path / "out.json")
    s, t = settings_of("--output", out, "--trace", str(MOONCAKE), "--trace-speedup", "1000")
    assert s.schedule.admission == Settings().schedule.admission and "--trace-speedup" in t.argv
    assert "workload.users" not in " ".join(t.argv) and not any("--trace-speedup" in n for n in t.notes)
    chats = tmp_path / "chats.json"
    chats.write_text('[{"id": "a", "conversations": [{"from": "human", "value": "1 2 3"}, '
                     '{"from": "gpt", "value": "4 5"}]}]')
    s, _ = settings_of("--output", out, "--trace", str(chats))
    assert s.schedule.admission == "all"
    s, _ = settings_of("--output", out, "--trace", str(MOONCAKE), "--arrival", "closed")  # ours, typed: users
    assert s.schedule.admission == "all"


@pytest.mark.slow
def test_our_trace_beside_a_reference_flag_runs(tmp_path):
    r = run_cli(["--output", str(tmp_path / "out.json"), "--trace", str(MOONCAKE), "--trace-speedup", "1000",
                 "--block-tokens", "512", "--null-io", "--generation-mode", "none", "--gpu-mem-gb", "0",
                 "--cache-dir", str(tmp_path), "--output-dir", str(tmp_path / "o"), *bounded(5)], timeout=120)
    assert r.returncode == 0, r.stderr
    assert "arrival trace" in r.stdout and "users not applied" not in r.stdout


def test_a_node_of_a_handoff_keeps_blocks_not_one_object_per_request(tmp_path):
    """--decode-only's refusal says: run a --prefill-only node with --handoff-dir; doing so was refused in turn
    (the reference's one object per request, 4,196 MiB here, is past the handoff's --io-chunk-mb 64). A node of a
    handoff keeps our blocks, said in a note; --block-tokens typed stays; a single node keeps the reference's."""
    for role in ("--prefill-only", "--decode-only"):
        s, t = settings_of(role, "--handoff-dir", str(tmp_path))
        assert s.model.block_tokens == Settings().model.block_tokens > 0, role
        assert any("one object per request (the reference's): not applied" in n for n in t.notes), t.notes
    _, t = settings_of("--prefill-only", "--handoff-dir", str(tmp_path), "--block-tokens", "16")
    assert "--block-tokens" in t.argv and not any("not applied, a prefill node" in n for n in t.notes)
    s, _ = settings_of("--prefill-only")  # no handoff: one node, the reference's objects
    assert s.model.block_tokens == 0


def test_target_saturation_and_max_conversations_alone_are_accepted_with_a_note():
    _, t = settings_of("--num-users", "4", "--target-saturation", "0.8", "--max-conversations", "50")
    assert any(n.startswith("--target-saturation 0.8: accepted, not used") for n in t.notes)
    assert any(n.startswith("--max-conversations 50: not applied, no --dataset-path") for n in t.notes)
    assert not any("--set trace.max_conversations" in a for a in t.argv)


def test_an_unambiguous_prefix_of_their_flags_is_taken_and_said():
    argv, notes = expand_prefixes(["--num-user", "6", "--dur", "5", "--users-typo", "3"], OURS)
    assert argv[:4] == ["--num-users", "6", "--duration", "5"] and argv[4] == "--users-typo"
    assert "--num-user: taken as --num-users" in notes[0] and "--dur: taken as --duration" in notes[1]
    # our own command line keeps refusing prefixes: --dur alone is not a reference command line
    assert expand_prefixes(["--dur", "5"], OURS) == (["--dur", "5"], [])
    with pytest.raises(UserError, match="prefix of several MLPerf reference flags"):
        expand_prefixes(["--num-users", "2", "--enable", "x"], OURS)  # --enable-rag, --enable-autoscaling, ...


@pytest.mark.slow
def test_a_prefix_runs_end_to_end(tmp_path):
    r = run_cli(["--num-user", "2", "--gpu-mem-gb", "0", "--cpu-mem-gb", "0", "--config", str(SMALL),
                 "--storage-capacity-gb", "0.25", "--cache-dir", str(tmp_path), "--output-dir", str(tmp_path / "o"),
                 *bounded(2)], timeout=120, cwd=tmp_path)  # its benchmark_results_<time>.json goes there
    assert r.returncode == 0, r.stderr
    assert "--num-user: taken as --num-users" in r.stdout


def test_a_key_outside_their_strict_schema_is_refused_by_name(tmp_path):
    cfg = tmp_path / "ref.yaml"
    cfg.write_text("user_templates:\n  chatbot: {context_rnage: [100, 200]}\n")
    with pytest.raises(UserError, match=r"user_templates\.chatbot\.context_rnage .*did you mean context_range"):
        translate(["--config", str(cfg)])
    cfg.write_text("eviction: {target_usage: 0.8}\nuser_templates: {}\n")
    with pytest.raises(UserError, match=r"eviction\.target_usage is not in the MLPerf reference's schema"):
        translate(["--config", str(cfg)])


def test_their_model_configs_are_applied(tmp_path):
    cfg = tmp_path / "ref.yaml"
    cfg.write_text("model_configs:\n"
                   "  my-model: {name: Mine, num_layers: 10, hidden_dim: 2048, num_heads: 16, kv_heads: 4,"
                   " dtype: float32}\n"
                   "  llama3.1-8b: {num_layers: 16, hidden_dim: 4096, num_heads: 32, kv_heads: 8, dtype: float16}\n"
                   "  half: {num_layers: 4}\n")
    s, t = settings_of("--config", str(cfg), "--model", "my-model")
    mine = find_model("my-model", s.models)
    assert mine.bytes_per_token(s.model.kv_dtype) == 10 * 4 * 128 * 2 * 4  # float32: as the reference sizes it
    assert find_model("llama3.1-8b", s.models).bytes_per_token("fp16") == 16 * 8 * 128 * 2 * 2  # replaced
    assert any(n.startswith("model_configs.half: not applied") for n in t.notes)


@pytest.mark.parametrize("where, says", [("folder", "is a folder"), ("missing/x.json", "does not exist")])
def test_an_output_that_cannot_be_written_is_refused_before_the_run(tmp_path, where, says):
    (tmp_path / "folder").mkdir()
    r = run_cli(["--num-users", "2", "--output", str(tmp_path / where), "--output-dir", str(tmp_path / "o"),
                 "--cache-dir", str(tmp_path)], timeout=60)
    assert_clean_error(r, "--output", says)
    assert not (tmp_path / "o").exists()  # refused before anything was reserved


def test_a_reference_command_line_runs_its_load_model_and_says_how_to_get_ours():
    s, t = settings_of("--num-users", "4")
    assert s.schedule.admission == "all" and s.model.block_tokens == 0  # all at once, one object per request
    assert t.notes[0].startswith("the MLPerf reference's load model, not ours: all users start at once (ours: "
                                 "--admission paced); one object per request (ours: --block-tokens 256")
    s, t = settings_of("--num-users", "4", "--admission", "paced", "--block-tokens", "16")  # ours, typed: kept
    assert not any(n.startswith("the MLPerf reference's load model") for n in t.notes)
    assert "--set" not in " ".join(a for a in t.argv if "admission" in a or "block_tokens" in a)


def test_its_rag_trace_and_autoscaler_defaults_apply_unless_set():
    s, _ = settings_of("--num-users", "4", "--enable-rag")
    assert s.rag.num_documents == 10
    s, _ = settings_of("--num-users", "4", "--enable-rag", "--rag-num-docs", "25")
    assert s.rag.num_documents == 25
    s, _ = settings_of("--num-users", "4", "--use-burst-trace")
    assert s.trace.replay_cycles == 0  # looped until --duration, as the reference replays it
    s, _ = settings_of("--num-users", "4", "--use-burst-trace", "--replay-cycles", "1")
    assert s.trace.replay_cycles == 1
    s, t = settings_of("--num-users", "4", "--enable-autoscaling")  # the reference starts at 4, no ceiling at 4
    assert (s.autoscale.start_users, s.workload.users) == (4, 500)
    assert "the autoscaler starting at 4 users" in t.notes[0]


def test_a_bad_value_in_their_config_is_refused_naming_its_key(tmp_path):
    """Issue 37, item 7: a model_configs dtype of float99 was ignored; interactive_probability 2 was blamed on
    --qos-mix, which was not given."""
    cfg = tmp_path / "theirs.yaml"
    cfg.write_text("model_configs:\n  llama3.1-8b: {dtype: float99, num_layers: 32, hidden_dim: 4096, num_heads: 32, "
                   "kv_heads: 8}\n")
    with pytest.raises(UserError, match=r"model_configs.llama3.1-8b.dtype 'float99' is not a dtype"):
        translate(["--config", str(cfg), "--num-users", "2", "--output", str(tmp_path / "o.json")])
    cfg.write_text("qos_distribution:\n  interactive_probability: 2\n")
    with pytest.raises(UserError, match=r"qos_distribution.interactive_probability must be a number from 0 to 1"):
        translate(["--config", str(cfg), "--num-users", "2", "--output", str(tmp_path / "o.json")])


def test_a_refusal_naming_our_flag_names_the_reference_flag_that_set_it(tmp_path):
    """--storage-capacity-gb too small for the run's largest object was refused as "--nvme-gb 0.01 holds no ...",
    a flag the user never typed (and typed beside theirs it is refused as setting the key twice)."""
    r = run_cli(["--model", "llama3.1-8b", "--num-users", "2", "--gpu-mem-gb", "0", "--cpu-mem-gb", "0",
                 "--storage-capacity-gb", "0.01", "--cache-dir", str(tmp_path / "c"), "--output",
                 str(tmp_path / "out.json"), "--output-dir", str(tmp_path / "o"), *bounded(2)], timeout=120)
    assert r.returncode == 2
    said = " ".join(r.stderr.split())
    assert "error: --storage-capacity-gb sets --nvme-gb here: --nvme-gb 0.01 holds no" in said, said
    assert not (tmp_path / "c").exists()  # made for the run, removed with its refusal
