"""Settings sections of load control (QoS classes, the autoscaler, disaggregated roles) and semantic reuse.

Part of the one schema of schema.py (which imports these sections); kept
apart only to keep files small.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kv_cache.config.keys import DAY_S, MAX_GIB, MAX_TOKENS, key

QOS_CLASSES = ("interactive", "responsive", "batch")


@dataclass(frozen=True)
class QosClass:
    priority: int = key(1, "Order when every worker is busy: a higher priority is served first.", lo=0, hi=100)
    ttft_p95_ms: float = key(1000.0, "SLA: p95 of the storage part of time-to-first-token (queue wait + cached "
                                     "prefix load + prefill write), ms.", lo=0.001, hi=DAY_S * 1e3)
    ttft_p99_ms: float = key(5000.0, "SLA: p99 of the storage part of time-to-first-token, ms.", lo=0.001,
                             hi=DAY_S * 1e3)
    e2e_p95_ms: float = key(10000.0, "SLA: p95 of end-to-end request time (decode writes and any modelled "
                                     "generation time included), ms.", lo=0.001, hi=DAY_S * 1e3)
    e2e_p99_ms: float = key(20000.0, "SLA: p99 of end-to-end request time, ms.", lo=0.001, hi=DAY_S * 1e3)


def _qos_class(priority, t95, t99, e95, e99):
    defaults = dict(priority=priority, ttft_p95_ms=t95, ttft_p99_ms=t99, e2e_p95_ms=e95, e2e_p99_ms=e99)
    return field(default_factory=lambda: QosClass(**defaults),
                 metadata={"help": "QoS class: priority and SLA targets (MLPerf's p95 / p99 targets on the "
                                   "storage part of TTFT)."})


@dataclass(frozen=True)
class QosSettings:
    mix: str = key("interactive=15,responsive=35,batch=50", "Share of each QoS class, name=weight,... "
                                                            "(MLPerf's 15/35/50 by default).", "--qos-mix")
    assign: str = key("user", "Draw a class per user (all its requests share it) or per request.",
                      choices=("user", "request"))
    attainment: float = key(0.95, "A class is 'met' when its p95 and p99 targets hold; attainment is the share "
                                  "of its requests within the p95 TTFT target, which must reach this.", lo=0.0,
                            hi=1.0)
    interactive: QosClass = _qos_class(3, 50.0, 100.0, 2000.0, 4000.0)
    responsive: QosClass = _qos_class(2, 100.0, 200.0, 5000.0, 10000.0)
    batch: QosClass = _qos_class(1, 1000.0, 5000.0, 30000.0, 60000.0)


@dataclass(frozen=True)
class AutoscaleSettings:
    mode: str = key("off", "Change the number of active users during the run: qos finds the largest count whose "
                           "SLAs hold, capacity the count of peak throughput (closed loop only).", "--autoscale",
                    choices=("off", "qos", "capacity"))
    start_users: int = key(10, "Active users in the first step (at most --users, the pool).", lo=1,
                           hi=1_000_000)
    step_users: int = key(10, "Users added per step (growth add), or the first step's size (growth double).",
                          lo=1, hi=1_000_000)
    growth: str = key("add", "Step schedule: add step_users each step, or double the count.",
                      choices=("add", "double"))
    step_s: float = key(10.0, "Measurement window of one step, seconds.", lo=0.1, hi=DAY_S)
    cooldown_s: float = key(2.0, "Seconds after each change before the step's window opens (not measured).",
                            lo=0.0, hi=DAY_S)
    min_gain: float = key(0.05, "capacity: a step must raise throughput (prompt tokens/s) by this fraction to "
                                "count as a gain.", lo=0.0, hi=10.0)
    patience: int = key(2, "capacity: stop after this many steps in a row without gain.", lo=1, hi=100)
    resolution: int = key(2, "qos: after the first failing step, bisect (removing users) until good and bad "
                             "counts are this close.", lo=1, hi=1_000_000)


@dataclass(frozen=True)
class RoleSettings:
    role: str = key("both", "Disaggregated serving: prefill computes and publishes KV blocks into --handoff-dir; "
                            "decode loads them (waiting for them to appear) and appends decode blocks; both: one "
                            "node does everything.", "--role", choices=("both", "prefill", "decode"))
    handoff_dir: str = key("", "Shared directory between prefill and decode nodes: block files and the manifest "
                               "(prefill makes kvbench-handoff/ in it and removes it at the end).",
                           "--handoff-dir")
    handoff: str = key("", "How the prefill node hands blocks over: file://DIR (the same as --handoff-dir DIR) or "
                           "nixl://HOST:PORT: the decode node pulls them with NIXL READs (UCX) from the prefill "
                           "node's registered memory; HOST:PORT is the prefill node's side channel (it listens "
                           "there, the decode node connects).", "--handoff")
    handoff_gb: float = key(0.0, "Space of published blocks in GiB (0: auto: room for the longest prompt of every "
                                 "publishing worker, within half the machine's memory less the rest of the budget "
                                 "for NIXL's host region, a quarter of GPU 0's HBM for a region there, a quarter "
                                 "of the folder's filesystem for a folder, at most 64 GiB; fewer publishing "
                                 "workers where that cannot hold them all, said in one line). A request's "
                                 "blocks stay there until a decode node acknowledges that it loaded them; when "
                                 "it is full the prefill node waits (timed: the handoff's wait), at most "
                                 "--disagg-wait-s.", lo=0.0, hi=MAX_GIB)
    handoff_memory: str = key("host", "NIXL handoff: where the prefill node's region lives: host (registered host "
                                      "memory) or gpu (HBM of the GPU tier's first device, NIXL VRAM; needs a real "
                                      "GPU tier).", "--disagg-handoff-memory", choices=("host", "gpu"))
    wait_s: float = key(60.0, "decode: give up when no prefill node publishes anything for this long; prefill: "
                              "the longest it waits for a decode node's acknowledgement when its handoff space is "
                              "full, and at the end for decode nodes to finish reading.", lo=0.0, hi=DAY_S)
    peer_timeout_s: float = key(10.0, "NIXL handoff: the longest a node waits on its peer (the side channel's "
                                      "header, its next line or heartbeat - a prefill node sends one every second "
                                      "-, one READ) before it stops the run as a fault naming the peer.",
                                "--disagg-peer-timeout-s", lo=1.0, hi=DAY_S)


SEMANTIC_MIX = ("exact_repeat=1,instruction_variant=1,same_evidence_new_task=1,leading_evidence_new_task=1,"
                "rag_reorder=1,multi_donor_composite=1,fuzzy_edit=1,negative_control=1")


@dataclass(frozen=True)
class SemanticSettings:
    enabled: bool = key(False, "Semantic traffic (SemBench's transforms: each item a donor, then a recipient saying "
                               "the same in other words) with donor discovery: a found donor's aligned blocks are "
                               "read (op donor_read) instead of written. Text from the built-in corpus, or from a "
                               "ShareGPT --trace.", "--semantic")
    mix: str = key(SEMANTIC_MIX, "Share of each transform, name=weight,... (exact_repeat, instruction_variant, "
                                 "same_evidence_new_task, leading_evidence_new_task, rag_reorder, "
                                 "multi_donor_composite, fuzzy_edit, negative_control).")
    doc_tokens: tuple[int, int] = key((2048, 16384), "Built-in corpus: document length range; lengths fall in bands "
                                                     "of 1/8, 1/4, 1/2, 3/4 and all of the maximum (weights "
                                                     "1/2/3/3/3), at least the minimum (about; measured after "
                                                     "tokenizing).", lo=16, hi=MAX_TOKENS)
    embedder: str = key("sketch", "Donor search embedding: sketch (signed hashing of 3-token shingles, numpy, the "
                                  "same in every process) or minilm (all-MiniLM-L6-v2 on the prompt's text; the "
                                  "embed extra).", choices=("sketch", "minilm"))
    threshold: float = key(0.60, "Cosine similarity a donor needs to be a candidate (SemBlend's 0.60; from 0: a "
                                 "negative threshold would take unrelated and opposite prompts as donors).",
                           lo=0.0, hi=1.0)
    top_k: int = key(5, "Candidates aligned per request.", lo=1, hi=1000)
    min_reuse: float = key(0.50, "Accept donors only if they cover this share of the blocks the exact prefix "
                                 "cache missed.", lo=0.0, hi=1.0)
    multi_donor: bool = key(True, "Assemble a recipient from several donors (each block from one donor).")
    context_gate: bool = key(True, "Keep a matched block only if a neighbouring block matched at the same shift "
                                   "(SemBlend's context gate).")
    fuzzy: bool = key(False, "Fuzzy chunks: also take an unmatched block near the best donor's predicted position "
                             "when MinHash says enough of its distinct tokens are there.")
    fuzzy_overlap: float = key(0.80, "Fuzzy chunks: share of a block's distinct tokens that must be in the two donor "
                                     "blocks (SemBlend's verified-reuse tier).", lo=0.0, hi=1.0)
    max_donors: int = key(10_000, "Donors kept for search (least recently used leave first).", lo=1,
                          hi=10_000_000)
