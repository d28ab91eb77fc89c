"""The policies sub-command's command line."""

from __future__ import annotations

from kv_cache.cli.args import amount
from kv_cache.cli.flags import flag_names, run_parser
from kv_cache.config import replace, resolve
from kv_cache.config.keys import DAY_S
from kv_cache.errors import UserError
from kv_cache.run.registry import Registry

# how requests arrive: the comparison replays one fixed sequence (--arrival sequence), so each would be replaced
ARRIVING = ("schedule.arrival", "schedule.request_rate", "schedule.think_time_s", "schedule.admission",
            "trace.speedup", "autoscale.mode")


def cmd_policies(argv: list[str], reg: Registry) -> int:
    p = run_parser(reg)
    p.prog = "kv_cache_benchmark.py policies"
    p.description = "Replay one deterministic request sequence through several eviction policies and compare."
    p.add_argument("--policies", default=",".join(reg.policies), help="Comma-separated policies [default: all].")
    p.add_argument("--prefill-ms-per-token", type=amount, default=0.08,
                   help="Recompute cost of a missed prompt token in the modelled TTFT [default: 0.08].")
    args = vars(p.parse_args(argv))
    names = [n.strip() for n in args.pop("policies").split(",") if n.strip()]
    unknown = [n for n in names if n not in reg.policies]
    if unknown or not names:
        raise UserError(f"--policies: unknown policy '{(unknown or [''])[0]}'; known: {', '.join(reg.policies)}.")
    for dotted in ARRIVING:
        if dotted in args and (dotted, args[dotted]) != ("schedule.arrival", "sequence"):  # the one it runs
            raise UserError(f"policies replays one fixed sequence of requests, one in flight (--arrival sequence), "
                            f"so that every policy sees the same; {flag_names(p)[dotted]} would change how they "
                            f"arrive: drop it.")
    ms = args.pop("prefill_ms_per_token")
    config, sets, _, _ = args.pop("config"), args.pop("set"), args.pop("list_models"), args.pop("help_all")
    args.pop("lmcache_config")
    settings = resolve(config, sets, args, media_sections=reg.sections())
    if not settings.run.max_requests:
        raise UserError("policies replays a fixed sequence: give its length with --max-requests N.")
    if "run.warmup_s" in args and settings.run.warmup_s:
        raise UserError(f"policies judges every policy on every request of its sequence; --warmup "
                        f"{settings.run.warmup_s:g} would leave out those of its first seconds, a different number "
                        f"for each policy: drop it.")
    # the sequence's end, not the clock, ends each policy's run; a typed --duration stays a cap, said if it cut any
    settings = replace(settings, "run.warmup_s", 0.0)
    if "run.duration_s" not in args:
        settings = replace(settings, "run.duration_s", float(DAY_S))
    from kv_cache.run.policy_runs import compare_policies

    return compare_policies(settings, names, ms, (lambda *_: None) if settings.run.quiet else print, reg)
