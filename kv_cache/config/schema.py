"""Settings: one typed schema, the only source of truth.

Vocabulary: a *section* is one frozen dataclass (run, model, tiers, cache,
workload, schedule, profiles); a *key* is one of its fields. Every key carries
its help text in ``metadata``; the CLI flags, ``--help``, the documented
``config.yaml`` and validation are all derived from this module.

Precedence, lowest first: schema defaults < config file (``config.yaml`` of
the repository, or ``--config FILE``) < ``--set section.key=value`` < flags.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from kv_cache.config.keys import DAY_S, MAX_COUNT, MAX_GIB, MAX_TOKENS, key
from kv_cache.config.load_control import AutoscaleSettings, QosSettings, RoleSettings, SemanticSettings

REPO_CONFIG = Path(__file__).resolve().parents[2] / "config.yaml"


@dataclass(frozen=True)
class RunSettings:
    seed: int = key(42, "Seed of every random choice: the same seed gives the same request schedule.", lo=0,
                    hi=2**63 - 1)
    duration_s: float = key(60.0, "Seconds of measurement after the warm-up (at most a day).", "--duration",
                       lo=0.1, hi=DAY_S)
    warmup_s: float = key(5.0, "Seconds at the start excluded from statistics (at most a day).", "--warmup",
                     lo=0.0, hi=DAY_S)
    drain_s: float = key(5.0, "After --duration (or the last request issued), requests in flight get this long to "
                              "finish; then each stops at its next block operation (or modelled decode step) and "
                              "is counted as abandoned (requests.abandoned_at_stop). A run ends within about "
                              "--duration + this + one block operation.", "--drain-s", lo=0.0, hi=DAY_S)
    max_requests: int = key(0, "Stop after issuing this many requests (0: no limit, the duration decides).", lo=0,
                        hi=MAX_COUNT)
    start_at: float = key(0.0, "Begin the measured window (its warm-up first) at this wall-clock time, seconds since "
                               "the epoch, once set-up is done: independent runs that must start together (a "
                               "fleet's engines: fleet --export-assignment writes their commands). A set-up ending "
                               "after it is refused. 0: at once.", "--start-at", lo=0.0, hi=1e11)
    processes: int = key(1, "Run as this many processes on this host (mpirun, launched for you): each with its "
                            "--workers threads and its own part of the users; results merged exactly.", lo=1, hi=256)
    output_dir: str = key("reports", "Folder under which reports/<run-id>/ is written.")
    run_id: str = key("", "Name of the run folder (empty: a UTC timestamp).")
    keep_data: bool = key(False, "Keep the NVMe tier's data files after the run (default: removed).")
    quiet: bool = key(False, "Print nothing but errors.")
    telemetry: bool = key(True, "Sample the host (CPU, memory, the cache directory's disk I/O from the block "
                                "layer, psutil) and each GPU (NVML) every second into the time series.")
    device_latency: str = key("auto", "The storage disk's own latency per block request (issue to completion, eBPF: "
                                      "bpftrace on the block layer's tracepoints) beside the per-block latency; "
                                      "auto: where root, bpftrace and a local disk allow it (else said why), off.",
                              choices=("auto", "off"))
    trials: int = key(1, "Repeat the run this many times with the same schedule; report the median and spread "
                         "(min, max, coefficient of variation) of the headline numbers.", lo=1, hi=1000)
    submission: str = key("", "Run under the fixed rules of a submission and write a package (v1; smoke only "
                              "tries the machinery): settings that break the rules are refused first.",
                          choices=("", "v1", "smoke"))
    capacity_curve: bool = key(False, "After the run, the hit rate and storage demand at every capacity of the "
                                      "bottom tier, from this run's block accesses (LRU stack distances): a table, "
                                      "capacity_curve.png and results.json's capacity_curve; its accesses are kept "
                                      "in capacity_access.npz for `capacity RUN ...`.", "--capacity-curve")
    capacity_log_accesses: int = key(4_000_000, "The most block accesses --capacity-curve's log holds (about 30 B "
                                                "each, and 104 B a request with a kept access): past it the log "
                                                "keeps a SHARDS sample of the blocks, halving its rate each time it "
                                                "fills again, and folds a request none of whose blocks it keeps into "
                                                "the one before, so a run of any length stays within it; the curve "
                                                "then says its rate, and the replays, which need every access, are "
                                                "not made.",
                                     lo=1000, hi=1_000_000_000)
    io_trace: str = key("", "Write every block operation to this CSV file (zstd-compressed if it ends in .zst), "
                            "and a fio job file approximating the measured NVMe mix beside it.", "--io-trace")
    io_trace_schema: str = key("kv-cache-bench", "The --io-trace file's columns: kv-cache-bench (intended and real "
                                                 "start, latency, op, tier, bytes, key, phase, measured) or mlperf "
                                                 "(the MLPerf reference's --io-trace-log: Timestamp, Operation, "
                                                 "Object_Size_Bytes, Tier, Key, Phase; a reference command line "
                                                 "chooses it).", choices=("kv-cache-bench", "mlperf"))
    steady_tolerance: float = key(0.0, "Steady-state detection on the throughput series: the first window of "
                                       "steady_window_s seconds whose requests/s stay within this fraction of their "
                                       "mean marks steady state (0: off).", "--steady-state", lo=0.0, hi=1.0)
    steady_window_s: int = key(10, "Length of the steady-state detection window, seconds.", lo=2, hi=3600)
    verify: str = key("checksum", "Check every block read: checksum (XXH3-64 of the whole block taken at write, "
                                  "checked at read: any changed byte is caught), full (every byte compared with "
                                  "the payload), stamps (only each 4 KiB page's 16-byte stamp: misplaced, stale or "
                                  "torn pages, not corrupted bytes), off.",
                      choices=("checksum", "full", "stamps", "off"))


@dataclass(frozen=True)
class ModelSettings:
    name: str = key("llama70b", "Model whose KV geometry sizes the blocks (see --list-models).", "--model")
    kv_dtype: str = key("bf16", "KV-cache element type.", choices=("fp16", "bf16", "fp8", "fp32"))
    tp: int = key(1, "Tensor-parallel degree: the benchmark plays one rank, holding 1/tp of each block.",
                  lo=1, hi=1024)
    block_tokens: int = key(256, "Tokens per KV block (256 as LMCache, 16 as vLLM, 512 as Mooncake); "
                                 "0 stores one object per request, as the MLPerf reference does.", lo=0,
                            hi=1 << 20)


@dataclass(frozen=True)
class TierSettings:
    gpu: str = key("auto", "GPU tier: auto (real when CuPy finds a device, else off, said in one line), real "
                           "(a device is required), simulated (capacity + bandwidth model, labelled simulated), off.",
                   choices=("auto", "real", "simulated", "off"))
    gpu_mem_gb: float = key(16.0, "GPU tier capacity in GiB, over all its GPUs (refused if more than their free "
                                  "HBM).", lo=0.0, hi=MAX_GIB)
    gpus: int = key(1, "GPUs the tier spreads its blocks over (0: every device CuPy sees).", lo=0, hi=64)
    gpu_sim_gbps: float = key(25.0, "Bandwidth model of the simulated GPU tier, GB/s per transfer "
                                    "(PCIe 5 x16 host copies reach about 25).", lo=0.001, hi=1e5)
    gpu_layout: str = key("auto", "The GPU tier's HBM: paged (the engine's own layout, as vLLM's: per layer a K and "
                                  "a V tensor of 16-token pages, a block gathered from and scattered into "
                                  "2 x layers x pages pieces), contiguous (a block in one slot), auto (paged on a real "
                                  "GPU where the model's geometry and --block-tokens allow it, said otherwise).",
                          "--gpu-layout", choices=("auto", "paged", "contiguous"))
    gpu_copy: str = key("kernel", "How the paged layout's pieces cross the link: kernel (one gather / scatter kernel "
                                  "per batch writing page-locked host memory directly, LMCache's design), batch (one "
                                  "cudaMemcpyBatchAsync over the pieces, vLLM's; CUDA >= 12.8), per-piece (one "
                                  "cudaMemcpyAsync per piece, the old engines' way: the reference point).",
                        "--gpu-copy", choices=("kernel", "batch", "per-piece"))
    gpu_kernel_path: str = key("host", "How --gpu-copy kernel crosses the link: host (the kernel reads and writes "
                                       "page-locked host memory itself, zero copy: SMs carry the bytes) or hbm (the "
                                       "kernel gathers into and scatters from a staging buffer in HBM, one DMA copy "
                                       "per block across the link: the copy engines carry them, both directions at "
                                       "once; HBM beyond --gpu-mem-gb: 64 MiB or a block per worker, checked).",
                               "--gpu-kernel-path", choices=("host", "hbm"))
    gds: bool = key(False, "GPUDirect Storage (the gds extra, kvikio): NVMe reads land in HBM and GPU -> NVMe "
                           "demotions skip host memory; the output says whether cuFile ran or kvikio fell back "
                           "to POSIX I/O. Needs a real GPU tier and the direct engine with slabs.", "--gds")
    cpu_mem_gb: float = key(4.0, "CPU tier capacity in GiB (0 turns the tier off).", lo=0.0, hi=MAX_GIB)
    nvme: str = key("on", "The local disk (NVMe) tier: on, or off (with --remote-url the remote tier sits right under "
                          "the CPU tier).", "--nvme", choices=("on", "off"))
    remote_url: str = key("", "A remote tier at the bottom of the stack, below the local tiers (LMCache's remote_url): "
                              "redis://, rediss://, valkey://, valkeys:// [user:password@]host[:port][/db], or "
                              "s3://BUCKET[/PREFIX] with AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY "
                              "and AWS_REGION from the environment. Its latency is network + server, never a device.",
                          "--remote-url")
    remote_gb: float = key(0.0, "Remote tier capacity in GiB (0: chosen from the server, said before the run).",
                           "--remote-gb", lo=0.0, hi=MAX_GIB)
    remote_namespace: str = key("", "Share the remote tier with every run naming this namespace (the engines of a "
                                    "fleet, hosts without MPI): a block any of them writes there is every one's to "
                                    "read, as --shared-storage shares a directory; each run joins it, and the last "
                                    "one to end removes it (each member a marker there: Valkey or S3). Empty: a "
                                    "namespace of the run's own.", "--remote-namespace")
    nvme_gb: float = key(0.0, "NVMe tier capacity in GiB (0: the largest power of two GiB within a quarter of the "
                                  "filesystem's size, 64 GiB and half its free space; with "
                                  "--null-io 0 means 64 GiB).",
                         lo=0.0, hi=MAX_GIB)
    cache_dir: str = key("", "Directory for the NVMe tier's files (empty: cache/ in --output-dir, reports/cache "
                             "by default). A run "
                             "makes its own subdirectory there and removes it at the end.")
    io_engine: str = key("direct", "How the NVMe tier moves bytes: one of its I/O engines (their table, "
                                   "kv_cache/tiers/engines.py, lists each; --help names them).")
    nvme_layout: str = key("slab", "slab: preallocated files of fixed slots; file-per-block: one file per "
                                   "block, created and unlinked.", choices=("slab", "file-per-block"))
    slab_file_gb: float = key(4.0, "Size of one slab file in GiB (slab layout).", lo=0.001, hi=1024.0)
    io_unit: str = key("block", "How an engine moves a block to and from the NVMe tier: block (one I/O per block) "
                                "or layer (one I/O per layer group, as layer-wise offloading engines do; each I/O's "
                                "latency is recorded beside the block's, as <op>_io).", "--io-unit",
                       choices=("block", "layer"))
    layers_per_io: int = key(1, "With --io-unit layer: layers moved by one I/O.", lo=1, hi=1024)
    io_chunk_mb: int = key(64, "The largest I/O of a whole-request object (--block-tokens 0), MiB, in whole 16 MiB "
                               "slots: a larger object is written and read as parts of this size from per-worker "
                               "buffers, its checksum taken part by part, its latency the sum of its parts' (each "
                               "part's beside it, as <op>_io). Memory grows with workers x this, not with the "
                               "largest object.", "--io-chunk-mb", lo=16, hi=1 << 20)
    allow_tmpfs: bool = key(False, "Accept a cache directory on tmpfs/ramfs (then the NVMe tier measures RAM).")
    precondition: bool = key(False, "Before measuring, write the NVMe tier's space sequentially (SNIA habit), "
                                    "showing each pass's bandwidth; not part of any statistic.")
    precondition_passes: int = key(2, "Passes over the NVMe tier's capacity when preconditioning.", lo=1, hi=100)
    precondition_steady: float = key(0.0, "Steady-state check: keep writing (up to 10 passes) until the last 3 "
                                          "passes are within this fraction of their mean (0: off).", lo=0.0, hi=1.0)
    shared_storage: bool = key(False, "One namespace for every MPI rank in --cache-dir: blocks one rank writes, "
                                      "the others can read (one file per block, published atomically).")
    null_io: bool = key(False, "Replace every tier by the null tier: no byte moves, the numbers are the "
                               "load generator's own overhead (as fio's null engine).")


@dataclass(frozen=True)
class CacheSettings:
    policy: str = key("lru", "Eviction policy of every tier: one of the policies' table (kv_cache/cache/policies; "
                             "--help names them).")
    promote: bool = key(True, "Promote a block read from a lower tier back to the top tier "
                              "(--no-promote: waterfall only).")


@dataclass(frozen=True)
class WorkloadSettings:
    users: int = key(200, "Simulated users (closed loop: each waits for its answer, thinks, asks again).",
                     lo=1, hi=1_000_000)
    profile_mix: str = key("chatbot=1,coding=1,document=1", "Weights of the user profiles, name=weight,...")
    num_system_prompts: int = key(4, "Shared system prompts; every conversation starts with one of them.",
                                  lo=0, hi=100_000)
    system_prompt_tokens: tuple[int, int] = key((512, 2048), "Range of system prompt lengths in tokens.", lo=0,
                                           hi=MAX_TOKENS)
    system_prompt_zipf: float = key(0.0, "Zipf exponent of system-prompt popularity: prompt i is chosen with weight "
                                         "1/(i+1)^s (0: uniform).", lo=0.0, hi=10.0)
    end_probability: float = key(0.2, "Chance that a conversation ends after a turn.", lo=0.0, hi=1.0)
    max_turns: int = key(50, "A conversation ends after this many turns.", lo=1, hi=1_000_000)
    generation_ms_per_token: float = key(0.0, "Simulated generation time per output token (0: storage stress; at "
                                                "most 10 s).", lo=0.0, hi=10_000.0)
    decode_writes: bool = key(True, "Write the KV of generated tokens (decode blocks) after each request; off: "
                                    "prompt (prefill) blocks only, as a prefill-only node (MLPerf's "
                                    "--prefill-only).")
    vocab_size: int = key(128256, "Token ids are drawn from [0, vocab_size).", lo=2, hi=1 << 31)


@dataclass(frozen=True)
class ScheduleSettings:
    workers: int = key(0, "Worker threads issuing block I/O (0: auto: 2 per CPU core, at least 4, at most 16, as "
                          "the machine's memory allows: the same on every run of a machine; on real storage the "
                          "tier's bandwidth at 1, 2, 4, ... threads is probed before the run and said beside it; "
                          "--null-io: one, as the null tier has no I/O for more to overlap).",
                       lo=0, hi=4096)
    arrival: str = key("auto", "When requests arrive: closed (users wait for answers and think), poisson (open "
                               "loop at --request-rate), trace (trace timestamps / --trace-speedup); auto: trace "
                               "for timestamped traces, closed otherwise; sequence: the traffic's requests in one "
                               "fixed order, back to back, one in flight (what the policies sub-command replays).",
                       choices=("auto", "closed", "poisson", "trace", "sequence"))
    admission: str = key("paced", "Closed loop: paced (a user's first request enters only while the queue is "
                                  "shorter than the workers, so started conversations reach later turns and reuse "
                                  "their history; its latency counts from admission) or all (every user asks at "
                                  "once, as MLPerf's reference does; on slow storage no user may reach a second "
                                  "turn).", choices=("paced", "all"))
    request_rate: float = key(0.0, "Requests per second of the poisson arrival process (at most 100,000: one "
                                   "process issues a few thousand at best; more is a typo).", lo=0.0, hi=1e5)
    think_time_s: tuple[float, float] = key((0.1, 0.5), "Think-time range of closed-loop users replaying a trace "
                                                        "(synthetic users take theirs from their profile).", lo=0.0,
                                        hi=DAY_S)
    request_io: str = key("batched", "How a worker moves one request's blocks in block mode: batched (its hit "
                                     "prefix read in batches grouped by tier and its new blocks written as one "
                                     "batch, up to --max-inflight at once, as vLLM's and LMCache's offloading do; "
                                     "each block's latency runs from its batch's submission to its own completion) "
                                     "or serial (one block at a time: the MLPerf reference's way). Whole-request "
                                     "objects (--block-tokens 0) are one object a request: always serial.",
                          choices=("batched", "serial"))
    max_inflight: int = key(32, "The most blocks one worker has in flight together under --request-io batched (a "
                                "larger batch goes in windows of this many); the device sees up to workers x this.",
                            lo=1, hi=1024)
    max_backlog_gb: float = key(1.0, "The most memory the requests issued and not yet done may hold (their tokens): "
                                     "past it an open loop that offers more than the storage serves stops issuing "
                                     "(stopped_reason backlog, said in one line) instead of queueing without end "
                                     "until memory runs out; counted in the memory budget of an open loop.",
                                "--max-backlog-gb",
                                lo=0.001, hi=MAX_GIB)


@dataclass(frozen=True)
class TraceSettings:
    path: str = key("", "Trace file, directory or glob (empty: synthetic users).", "--trace")
    format: str = key("auto", "Trace format (auto: detected from the first record, and said).", "--trace-format",
                      choices=("auto", "sharegpt", "burstgpt", "azure", "mooncake", "bailian"))
    replay_cycles: int = key(1, "Times the trace is replayed (0: until the duration ends).", lo=0,
                             hi=MAX_COUNT)
    speedup: float = key(1.0, "Trace time runs this many times faster (timestamps / speedup).", "--trace-speedup",
                         lo=1e-6, hi=1e6)
    strict: bool = key(False, "Stop at the first malformed record instead of skipping and counting it.")
    tokenizer: str = key("auto", "Text to tokens: tiktoken (cl100k, offline; the tokenize extra), fallback "
                                 "(deterministic estimate), auto (tiktoken when installed).",
                         choices=("auto", "tiktoken", "fallback"))
    first_turn_only: bool = key(False, "ShareGPT: only each conversation's first turn (vLLM's benchmark mode).")
    min_prompt_tokens: int = key(1, "ShareGPT: drop turns whose prompt is shorter.", lo=1, hi=MAX_TOKENS)
    max_prompt_tokens: int = key(0, "ShareGPT: end a conversation at a turn whose prompt is longer (0: no limit).",
                                 lo=0, hi=MAX_TOKENS)
    max_output_tokens: int = key(0, "ShareGPT: cut longer answers to this many tokens (0: no limit).", lo=0,
                                 hi=MAX_TOKENS)
    max_conversations: int = key(0, "ShareGPT: use at most this many conversations (0: all).", lo=0,
                                 hi=MAX_COUNT)
    shuffle: bool = key(True, "ShareGPT: shuffle conversations with the seed (--no-shuffle: file order).")
    missing_answer_tokens: int = key(128, "ShareGPT: answer length for a message with no answer in the file "
                                          "(0: drop such messages).", lo=0, hi=MAX_TOKENS)
    model_filter: str = key("", "BurstGPT: keep only rows of this Model (e.g. GPT-4).", "--trace-model")
    log_type: str = key("", "BurstGPT: keep only rows of this Log Type (Conversation log, API log).",
                        "--trace-log-type")
    include_failed: bool = key(False, "BurstGPT: keep failed rows (0 response tokens), skipped by default.")


@dataclass(frozen=True)
class RagSettings:
    enabled: bool = key(False, "RAG traffic: a share of synthetic conversations open with retrieved documents.",
                        "--rag")
    request_probability: float = key(0.5, "Share of new synthetic conversations that retrieve documents.",
                                     lo=0.0, hi=1.0)
    num_documents: int = key(1000, "Documents in the corpus.", lo=1, hi=10_000_000)
    document_tokens: tuple[int, int] = key((512, 4096), "Document length range in tokens (each is then cut at "
                                                        "block boundaries: padded to whole blocks).", lo=1,
                                            hi=MAX_TOKENS)
    top_k: int = key(4, "Documents retrieved per request.", "--rag-top-k", lo=1, hi=1000)
    zipf: float = key(1.0, "Zipf exponent of document popularity (document i has weight 1/(i+1)^s).", "--rag-zipf",
                      lo=0.0, hi=10.0)
    reuse: str = key("prefix", "prefix: documents are part of the prompt's prefix chain; chunk: each document's "
                               "blocks are keyed by their own content and hit wherever the document sits "
                               "(position-independent, as CacheBlend), counted apart as rag_chunk.",
                     "--rag-reuse", choices=("prefix", "chunk"))


@dataclass(frozen=True)
class Profile:
    context_tokens: tuple[int, int] = key((512, 4096), "First-turn context length range (tokens).", lo=1,
                                            hi=MAX_TOKENS)
    message_tokens: tuple[int, int] = key((32, 256), "Length range of each later user message.", lo=1,
                                            hi=MAX_TOKENS)
    output_tokens: tuple[int, int] = key((50, 200), "Answer length range (tokens).", lo=1, hi=MAX_TOKENS)
    think_time_s: tuple[float, float] = key((0.1, 0.5), "Pause between an answer and the next question.", lo=0.0,
                                          hi=DAY_S)
    max_context_tokens: int = key(16384, "A conversation ends before its prompt would exceed this.", lo=1,
                                hi=MAX_TOKENS)


def _profile(ctx, msg, out, think, max_ctx):
    defaults = dict(context_tokens=ctx, message_tokens=msg, output_tokens=out, think_time_s=think,
                    max_context_tokens=max_ctx)
    return field(default_factory=lambda: Profile(**defaults),
                 metadata={"help": "User profile (MLPerf ranges for context, output and think time)."})


@dataclass(frozen=True)
class ProfileSettings:
    chatbot: Profile = _profile((512, 4096), (32, 256), (50, 200), (0.1, 0.5), 16384)
    coding: Profile = _profile((4096, 25000), (64, 512), (100, 500), (0.2, 1.0), 32768)
    document: Profile = _profile((4096, 16384), (32, 256), (200, 800), (0.3, 1.5), 32768)


@dataclass(frozen=True)
class Settings:
    """The resolved settings of a run; embedded in every results file."""

    run: RunSettings = field(default_factory=RunSettings)
    model: ModelSettings = field(default_factory=ModelSettings)
    tiers: TierSettings = field(default_factory=TierSettings)
    cache: CacheSettings = field(default_factory=CacheSettings)
    workload: WorkloadSettings = field(default_factory=WorkloadSettings)
    schedule: ScheduleSettings = field(default_factory=ScheduleSettings)
    trace: TraceSettings = field(default_factory=TraceSettings)
    rag: RagSettings = field(default_factory=RagSettings)
    qos: QosSettings = field(default_factory=QosSettings)
    autoscale: AutoscaleSettings = field(default_factory=AutoscaleSettings)
    disagg: RoleSettings = field(default_factory=RoleSettings)
    semantic: SemanticSettings = field(default_factory=SemanticSettings)
    profiles: ProfileSettings = field(default_factory=ProfileSettings)
    models: dict = key({}, "Extra models: name -> {layers, kv_heads, head_dim} or "
                           "{layers, attention: mla, kv_lora_rank, rope_dim}.")
    media: dict = key({}, "Settings of each storage medium, declared in its own module (tiers/<medium>.py): "
                          "media.<medium>.<key>, flag --<medium>-<key> (config/media.py).")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
