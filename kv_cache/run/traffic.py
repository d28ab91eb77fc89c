"""Building the traffic from settings: which source, which arrival process, what to analyse.

Part of the composition root (run/, with pipeline.py and prepare.py): it knows the
concrete sources and hands the scheduler either closed-loop users or an
open-loop arrival stream.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from kv_cache.config import Settings
from kv_cache.config.schema import TraceSettings
from kv_cache.errors import UserError
from kv_cache.lifecycle.ceiling import MAX_BLOCKS
from kv_cache.run.geometry import geometry
from kv_cache.run.handoff import decode_traffic
from kv_cache.sources import csvtrace, hashtrace, sharegpt
from kv_cache.sources.replay import (
    SequenceUser,
    TraceSet,
    closed_users,
    every_nth,
    partition,
    poisson_arrivals,
    synthetic_builds,
    trace_arrivals,
    trace_builds,
    trace_span_s,
)
from kv_cache.sources.synthetic import SystemPrompts, each_user
from kv_cache.sources.textcorpus import ConversationTexts, TextCorpus
from kv_cache.sources.tokenizer import make_tokenizer
from kv_cache.sources.trace_io import TraceLog, trace_format
from kv_cache.sources.transforms import make_semantic_users

SYNTHETIC_SAMPLE_TURNS = 20  # requests per user in the pre-run analysis of synthetic traffic
SEMANTIC_SAMPLE_USERS = 32   # users sampled (4 requests each) in the pre-run analysis of semantic traffic


@dataclass
class Traffic:
    """What the scheduler runs, and what the pre-run analysis reads."""

    source: str                 # synthetic, or the trace format
    arrival: str                # closed, poisson, trace
    users: list | None = None
    arrivals: object = None
    analysis_items: object = None
    analysis_total: int | None = None
    trace: TraceSet | None = None
    notes: list[str] = field(default_factory=list)
    handoff_link: object = None  # a NIXL decode node's link to its prefill node: its arrivals, then its blocks
    users_made: int | None = None  # a trace's closed-loop users over all ranks (one a conversation at most)


def makes_users(source: str, arrival: str) -> bool:
    """Does this traffic make --users users? Synthetic and semantic traffic does (their requests come from users,
    open loop or not); a trace's records become users only in closed loop; a decode node's come from a manifest."""
    return source in ("synthetic", "semantic") or (arrival == "closed" and source != "handoff")


def rank_seed(seed: int, rank: int) -> int:
    """The arrival seed of an MPI rank. seed + rank made rank 1 of seed 42 replay rank 0 of seed 43; a hash of
    (seed, rank) is independent per rank. Rank 0 (every single-process run) keeps the seed itself, so a
    one-process schedule is what it always was."""
    if rank == 0:
        return seed
    return int(np.random.SeedSequence([seed, rank]).generate_state(1, np.uint64)[0] >> 1)


def _user_traffic(source: str, arrival: str, users, rate: float, seed: int, rank: int, size: int) -> Traffic:
    """Closed-loop users, one fixed sequence, or an open-loop stream of their requests (Poisson).

    users(owner) builds a fresh set: this rank's users by default, every user with owner None.
    """
    t = Traffic(source, arrival)
    if arrival == "sequence":
        t.users = [SequenceUser(b() for b in synthetic_builds(users()))]
    elif arrival == "closed":
        t.users = users()
    else:  # one shared request stream, dealt to the ranks in turn
        t.arrivals = poisson_arrivals(every_nth(synthetic_builds(users(None)), size, rank), rate, rank_seed(seed, rank))
    return t


def trace_has_times(path: str, fmt: str) -> bool:
    """A --trace whose records carry arrival times: every format read here but ShareGPT's (fmt "auto": detected)."""
    return trace_format(path, fmt)[1] != "sharegpt"


def load_trace(s: Settings) -> TraceSet:
    t = s.trace
    files, fmt = trace_format(s.trace.path, s.trace.format)
    _filters_of_other_formats(s, fmt)
    log = TraceLog(strict=t.strict, detected=fmt)
    vocab = s.workload.vocab_size
    tokenizer = ""
    if fmt in ("mooncake", "bailian"):
        records = hashtrace.load(files, fmt, log)
    elif fmt == "burstgpt":
        records = csvtrace.load_burstgpt(files, log, t.model_filter, t.log_type, t.include_failed)
    elif fmt == "azure":
        records = csvtrace.load_azure(files, log)
    else:
        tok = make_tokenizer(t.tokenizer, vocab)
        tokenizer = tok.name
        system = SystemPrompts(s.workload.num_system_prompts, s.workload.system_prompt_tokens, vocab, s.run.seed,
                               s.workload.system_prompt_zipf)
        opts = sharegpt.ShareGPTOptions(t.first_turn_only, t.min_prompt_tokens, t.max_prompt_tokens,
                                        t.max_output_tokens, t.max_conversations, t.shuffle, t.missing_answer_tokens)
        records = sharegpt.load(files, tok, lambda sid: system.pick(np.random.default_rng([s.run.seed, 0x5A7, sid])),
                                opts, s.run.seed, log)
    if not records:
        skipped = ", ".join(f"{k} {v}" for k, v in log.skipped.items()) or "none"
        raise UserError(f"trace {t.path} ({fmt}) has no usable record (skipped: {skipped}); "
                        f"check the file and the trace filters.")
    return TraceSet(fmt, records, log, tokenizer)


# a trace filter acts on one kind of trace only: given for another, it would do nothing (said, not ignored)
FILTERS = {"first_turn_only": ("--first-turn-only", ("sharegpt",)), "shuffle": ("--no-shuffle", ("sharegpt",)),
           "model_filter": ("--trace-model", ("burstgpt",)), "log_type": ("--trace-log-type", ("burstgpt",))}


def _filters_of_other_formats(s: Settings, fmt: str) -> None:
    for key, (flag, formats) in FILTERS.items():
        given = getattr(s.trace, key) != TraceSettings.__dataclass_fields__[key].default
        if given and fmt not in formats:
            raise UserError(f"{flag} acts on {' and '.join(formats)} traces only, and {s.trace.path} is a {fmt} "
                            f"trace; drop {flag}.")


def _arrival(s: Settings, trace: TraceSet | None) -> str:
    arrival = s.schedule.arrival
    if arrival == "auto":
        arrival = "trace" if trace is not None and trace.timestamped else "closed"
    if arrival == "poisson" and s.schedule.request_rate <= 0:
        raise UserError("--arrival poisson needs --request-rate R (requests per second, > 0).")
    if arrival == "trace" and trace is None:
        raise UserError("--arrival trace needs --trace with timestamps (BurstGPT, Azure, Mooncake, Bailian).")
    if arrival != "closed" and s.schedule.admission != "paced":
        raise UserError(f"--admission {s.schedule.admission} paces the first turns of closed-loop users, and this "
                        f"run's arrival is {arrival} (open loop); drop --admission.")
    return arrival


def build_traffic(s: Settings, reg, rank: int = 0, size: int = 1) -> Traffic:
    """This rank's share of the traffic: users / sessions u with u mod size == rank (reg: the registry, whose
    handoff transports a decode node's traffic comes through)."""
    vocab, seed = s.workload.vocab_size, s.run.seed

    def owns(u: int) -> bool:
        return u % size == rank

    if s.disagg.role == "decode":  # a decode node serves what a prefill node hands over
        arrivals, link = decode_traffic(s, geometry(s).model.name, reg.transports)
        return Traffic("handoff", "handoff", arrivals=arrivals, handoff_link=link,
                       analysis_items=iter(()), analysis_total=0,
                       notes=["requests come from the prefill node's manifest as it publishes them"])
    rate = s.schedule.request_rate / size
    if s.semantic.enabled:
        return _semantic_traffic(s, owns, rate, rank, size)
    trace = load_trace(s) if s.trace.path else None
    if trace is not None and s.rag.enabled:
        raise UserError("--rag shapes synthetic traffic; drop it when replaying a --trace.")
    arrival = _arrival(s, trace)
    if trace is None:
        def each(owner=owns):  # a fresh set of synthetic users, made as asked for (owner: this rank's, or None: all)
            return each_user(s.workload.users, s.workload, s.profiles, seed, owner, s.rag, s.model.block_tokens)

        t = _user_traffic("synthetic", arrival, lambda owner=owns: list(each(owner)), rate, seed, rank, size)
        t.analysis_items, t.analysis_total = _user_by_user(each(), SYNTHETIC_SAMPLE_TURNS), None
        t.notes.append(f"analysis: the first {SYNTHETIC_SAMPLE_TURNS} requests of each user in turn, until "
                       f"{MAX_BLOCKS:,} distinct blocks")
        return t
    cycles = s.trace.replay_cycles
    t = Traffic(trace.fmt, arrival, trace=trace)
    if arrival == "sequence":
        trace = partition(trace, owns)
        t.users = [SequenceUser(b() for b in trace_builds(trace, vocab, cycles))]
    elif arrival == "closed":
        t.users = closed_users(trace, s.workload.users, vocab, s.schedule.think_time_s, cycles, seed, owns)
        t.users_made = min(s.workload.users, len({r.session for r in trace.records}))
        mine = {id(r) for u in t.users for r in u.records}  # this rank's records, in trace order
        trace = TraceSet(trace.fmt, [r for r in trace.records if id(r) in mine], trace.log, trace.tokenizer)
    elif arrival == "trace":
        _check_trace_fills_the_window(s, trace, cycles)
        t.notes += _trace_outlasts_the_run(s, trace, cycles)
        trace = partition(trace, owns)
        t.arrivals = trace_arrivals(trace, vocab, s.trace.speedup, cycles)
    else:
        trace = partition(trace, owns)
        t.arrivals = poisson_arrivals(trace_builds(trace, vocab, cycles), rate, rank_seed(seed, rank))
    passes = cycles or 1
    hashed = trace.fmt in ("mooncake", "bailian") and s.model.block_tokens > 0
    t.analysis_items = itertools.chain.from_iterable(
        trace.records if hashed else (r.build(vocab) for r in trace.records) for _ in range(passes))
    t.analysis_total = len(trace.records) * passes
    if cycles == 0:
        t.notes.append("analysis: one pass of the trace (--replay-cycles 0 repeats it until the duration ends)")
    return t


def _user_by_user(fresh, turns: int):
    """Each user's first turns requests, one user after another, each user made as its turn comes (fresh: an
    iterator) and let go (its conversation's tokens with it) once done. An infinite cache's hits in a whole sample
    do not depend on its order (a block misses where it is first planned and hits every time after); cut short at
    the analysis's bound, whole users keep the reuse of their conversations' later turns, where every user's first
    few turns would lack it. Round-robin over 5,000 users held every user's history at once, and each follow-up
    missed the planner's chain memo."""
    for user in fresh:
        for _ in range(turns):
            yield user.next_request()


def _check_trace_fills_the_window(s: Settings, trace, cycles: int) -> None:
    """A trace that arrives wholly inside the warm-up would measure nothing: refuse it before any byte moves."""
    span = trace_span_s(trace, s.trace.speedup, cycles)
    if span is None or span >= s.run.warmup_s or not trace.timestamped:
        return
    raise UserError(f"trace {s.trace.path}: its {len(trace.records):,} requests arrive over {span:.2f} s at "
                    f"--trace-speedup {s.trace.speedup:g}, all inside the {s.run.warmup_s:g} s warm-up, so nothing "
                    f"would be measured; lower --warmup (e.g. --warmup 0), lower --trace-speedup, or raise "
                    f"--replay-cycles (0 repeats the trace until --duration ends).")


def _trace_outlasts_the_run(s: Settings, trace, cycles: int) -> list[str]:
    """A trace whose timestamps span far more than the run replays only its first moments (BurstGPT's 400 rows span
    37,274 s): say how much of it the window holds and which --trace-speedup plays it all."""
    span = trace_span_s(trace, s.trace.speedup, cycles)
    window = s.run.warmup_s + s.run.duration_s
    if span is None or span <= 2 * window or s.run.max_requests:
        return []
    fit = s.trace.speedup * span / s.run.duration_s
    return [f"the trace's {len(trace.records):,} requests arrive over {span:,.0f} s at --trace-speedup "
            f"{s.trace.speedup:g}, and this run lasts {window:g} s: it replays about the first "
            f"{100 * window / span:.2g} % of them; --trace-speedup {fit:,.0f} plays the whole trace within --duration"]


def semantic_texts(s: Settings):
    """The text semantic traffic transforms: ShareGPT conversations from --trace, or the built-in corpus."""
    if s.rag.enabled:
        raise UserError("--semantic brings its own retrieved evidence; drop --rag.")
    if not s.trace.path:
        return TextCorpus(s.semantic.doc_tokens)
    files, fmt = trace_format(s.trace.path, s.trace.format)
    if fmt != "sharegpt":
        raise UserError(f"--semantic transforms text, and trace {s.trace.path} is {fmt} (numbers only); "
                        f"give a ShareGPT file, or no --trace for the built-in corpus.")
    log = TraceLog(strict=s.trace.strict, detected=fmt)
    texts = sharegpt.conversation_texts(files, log, s.trace.max_conversations)
    if not texts:
        raise UserError(f"trace {s.trace.path} has no conversation with text; check the file.")
    return ConversationTexts(texts)


def _semantic_traffic(s: Settings, owns, rate: float, rank: int, size: int) -> Traffic:
    texts = semantic_texts(s)
    tok = make_tokenizer(s.trace.tokenizer, s.workload.vocab_size)

    def users(owner=owns) -> list:
        return make_semantic_users(s.workload.users, texts, s.semantic.mix, tok, s.run.seed, s.profiles.document,
                                   s.workload.vocab_size, owner)

    t = _user_traffic("semantic", _arrival(s, None), users, rate, s.run.seed, rank, size)
    fresh = users()[:SEMANTIC_SAMPLE_USERS]  # building an item's text costs tens of ms: sample a few users
    t.analysis_items, t.analysis_total = (u.next_request() for _ in range(4) for u in fresh), None
    t.notes.append(f"semantic traffic from the {texts.name} ({tok.name} tokens); analysis: the first 4 requests "
                   f"of {len(fresh)} users")
    return t
