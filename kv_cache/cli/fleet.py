"""The fleet sub-command's command line."""

from __future__ import annotations

from kv_cache.cli.args import amount
from kv_cache.cli.flags import flag_names, run_parser
from kv_cache.config import resolve
from kv_cache.errors import UserError
from kv_cache.report.table import fit
from kv_cache.run.registry import Registry


def _counts(text: str) -> tuple[int, ...]:
    """--engines: a comma-separated list of engine counts, each at least 1."""
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UserError(f"--engines {text}: give engine counts as whole numbers, e.g. --engines 4,16,64.") from None
    if not out or min(out) < 1 or max(out) > MAX_ENGINES:
        raise UserError(f"--engines {text}: each count must be between 1 and {MAX_ENGINES:,}, e.g. --engines 4,16.")
    return tuple(dict.fromkeys(out))


MAX_ENGINES = 100_000
# What the plan reads: the traffic, the model's blocks, each engine's HBM and CPU tiers and their policy. Any other
# setting says how a run measures (its length, its disk, its engine, its processes): typed here it would do nothing
# on paper, unless --export-assignment hands it to the engines' runs (their settings.yaml)
PLANNED = ("model.", "models.", "workload.", "profiles.", "trace.", "rag.", "semantic.", "cache.", "run.seed",
           "run.max_requests", "run.output_dir", "run.run_id", "run.quiet", "schedule.request_rate", "tiers.gpu",
           "tiers.gpu_mem_gb", "tiers.cpu_mem_gb")


def _unplanned(flags: dict, sets: list[str], names: dict[str, str]) -> None:
    """Refuse a setting typed (a flag, a --set) that the plan does not read (PLANNED); names: each flag's dest -> what
    is typed."""
    typed = [(k, names.get(k, k)) for k in flags] + \
        [(t.split("=")[0].strip(), f"--set {t.split('=')[0].strip()}") for t in sets]
    for dotted, said in typed:
        if not any(dotted == k or (k.endswith(".") and dotted.startswith(k)) for k in PLANNED):
            raise UserError(f"fleet plans on paper from the traffic, the model and each engine's HBM and CPU tiers; "
                            f"{said} says how a run measures and would do nothing here: drop it (with "
                            f"--export-assignment the engines' runs take it).")


def cmd_fleet(argv: list[str], reg: Registry) -> int:
    p = run_parser(reg)
    p.prog = "kv_cache_benchmark.py fleet"
    p.description = ("N engines, each with its own HBM and CPU tiers (--gpu-mem-gb, --cpu-mem-gb), over one shared "
                     "KV tier, serving one traffic (synthetic users or --trace) through a router, on paper: hit rates "
                     "by tier, the shared tier's demand and capacity, load imbalance. Nothing moves a byte.")
    p.add_argument("--engines", default="4", help="Engine counts to sweep, comma-separated [default: 4].")
    p.add_argument("--router", default="", help=f"Routers, comma-separated: {', '.join(reg.routers)} "
                                                "[default: every router the traffic allows].")
    p.add_argument("--shared-gb", type=amount, default=0.0,
                   help="The shared tier's capacity in GiB: one LRU pool, or with --engine-model cache and "
                        "--shared-writes demote the engines' equal shares [default: 0, unbounded: the output says "
                        "what it needed].")
    p.add_argument("--shared-writes", choices=("demote", "through"), default="demote",
                   help="How blocks reach the shared tier: demote (as the engines' upper tiers evict them: this "
                        "benchmark's waterfall, what a run of it with a shared bottom tier does) or through (every "
                        "block stored as it is made, the shared tier evicting for itself: LMCache's remote backend, "
                        "Mooncake's store) [default: demote].")
    p.add_argument("--engine-model", choices=("auto", "cache", "stack"), default="auto",
                   help="Each engine's tiers: cache (the benchmark's own cache on accounting tiers: any policy, "
                        "about 50 us a block), stack (the LRU waterfall as two ordered maps: exact for LRU bar the "
                        "prefix rule's approximation, a few us a block; its shared tier one LRU pool), auto (stack "
                        "for --policy lru, else cache) [default: auto].")
    p.add_argument("--load-slack", type=amount, default=0.25,
                   help="prefix router: an engine is a candidate while its requests in flight are at most "
                        "(1 + slack) x the mean + 1 [default: 0.25].")
    p.add_argument("--prefill-ms-per-token", type=amount, default=0.08,
                   help="Modelled engine load: ms of prefill per computed prompt token [default: 0.08].")
    p.add_argument("--decode-ms-per-token", type=amount, default=20.0,
                   help="Modelled engine load: ms per output token [default: 20].")
    p.add_argument("--export-assignment", default="", metavar="DIR",
                   help="Write each point's assignment as one trace per engine (a hash-id trace at its own "
                        "timestamps), with the settings and a run.sh that runs the engines for real as processes "
                        "sharing one Valkey or S3 namespace (--remote-namespace), to hold the simulation against "
                        "(docs/capacity.md) [default: none].")
    args = vars(p.parse_args(argv))
    engines = _counts(args.pop("engines"))
    routers = tuple(dict.fromkeys(n.strip() for n in args.pop("router").split(",") if n.strip()))
    unknown = [n for n in routers if n not in reg.routers]
    if unknown:
        raise UserError(f"--router {unknown[0]}: no such router; known: {', '.join(reg.routers)}.")
    from kv_cache.run.fleet_runs import FleetAsk, run_fleet

    ask = FleetAsk(engines, routers, args.pop("shared_gb"), args.pop("load_slack"), args.pop("prefill_ms_per_token"),
                   args.pop("decode_ms_per_token"), args.pop("shared_writes"), args.pop("engine_model"),
                   args.pop("export_assignment"))
    config, sets, _, _ = args.pop("config"), args.pop("set"), args.pop("list_models"), args.pop("help_all")
    args.pop("lmcache_config")
    if not ask.export:
        _unplanned(args, sets, flag_names(p))
    settings = resolve(config, sets, args, media_sections=reg.sections())
    return run_fleet(settings, ask, reg, (lambda text="": None) if settings.run.quiet else
                     (lambda text="": print(fit(str(text)), flush=True)))
