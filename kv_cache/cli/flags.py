"""The run's command line: every setting's flag, grouped by task for --help and by config.yaml section for
--help-all (part of the composition root's command line, beside main.py)."""

from __future__ import annotations

import argparse
import typing

from kv_cache import __version__
from kv_cache.cli.args import Parser
from kv_cache.config import Settings, flag_name, is_flag_key, iter_keys
from kv_cache.config.load import iter_media_keys

# --help: the flags of the README's "Quick start" and of a first day, grouped by task; --help-all every setting, by
# config.yaml section
TASKS = (
    ("the run: how long, how many times, where the results go",
     ("run.duration_s", "run.warmup_s", "run.max_requests", "run.seed", "run.trials", "run.output_dir", "run.run_id",
      "run.quiet")),
    ("the model: its KV geometry sizes the blocks", ("model.name", "model.kv_dtype", "model.block_tokens")),
    ("the tiers: GPU, CPU, then the storage under test (the bottom tier)",
     ("tiers.gpu", "tiers.gpu_mem_gb", "tiers.cpu_mem_gb", "tiers.nvme", "tiers.nvme_gb", "tiers.cache_dir",
      "tiers.io_engine", "tiers.remote_url", "tiers.precondition", "tiers.null_io", "cache.policy")),
    ("the traffic: synthetic users, a rate, or a trace",
     ("workload.users", "schedule.workers", "schedule.arrival", "schedule.request_rate", "trace.path",
      "trace.format", "trace.speedup", "rag.enabled", "semantic.enabled", "autoscale.mode")),
    ("disaggregated prefill / decode nodes", ("disagg.role", "disagg.handoff", "disagg.handoff_dir",
                                               "disagg.handoff_gb")),
    ("several processes or hosts, submissions, records", ("run.processes", "run.submission", "run.io_trace")),
)
COMMON = {k for _, keys in TASKS for k in keys}
TABLES = {"tiers.io_engine": lambda reg: reg.engines,  # settings whose choices are an extension table's names
          "cache.policy": lambda reg: reg.policies}
SUBCOMMANDS = {  # each sub-command and its line in --help (main.py runs each; none: a run)
    "report": "re-render the summary (and --plots) of a run folder or results.json",
    "compare": "headline numbers of several runs side by side, ratios to the first",
    "policies": "one request sequence through several eviction policies, compared",
    "validate": "check a submission package (--submission) against its manifest and rules",
    "clean": "remove what killed runs left in the cache and report folders",
    "capacity": "hit rate and storage demand at every capacity of the bottom tier (--capacity-curve runs)",
    "fleet": "engines sharing one KV tier through a router, on paper: hit rates, demand, imbalance",
}
SUBCOMMAND_HELP = ("sub-commands (kv_cache_benchmark.py COMMAND --help for each):\n"
                   "  (none)    run the benchmark with the flags below\n"
                   + "".join(f"  {name:<9} {line}\n" for name, line in SUBCOMMANDS.items())
                   + "\n--help-all lists every setting's flag (config.yaml documents each key too). --debug, with any\n"
                     "sub-command, prints the traceback of an internal error on stderr (it is always kept in "
                     "run.log).")


def _setting_groups(full: bool, sections: dict[str, type]) -> list[tuple[str, list]]:
    """(title, keys) of the help's groups: by task for --help (the common flags), by config.yaml section for
    --help-all (every flag); sections: every medium's settings section (the registry's)."""
    every = {k[0]: k for k in [*iter_keys(Settings), *iter_media_keys(sections)]}
    if not full:
        return [(title, [every[k] for k in keys]) for title, keys in TASKS]
    groups = [(f"{s} settings (config.yaml section '{s}')", [k for k in every.values() if k[0].startswith(s + ".")])
              for s in ("run", "model", "tiers", "cache", "workload", "schedule", "trace", "rag", "qos", "autoscale",
                        "disagg", "semantic")]
    return groups + [(f"{m} settings (config.yaml media.{m}, declared by its module)",
                      [k for k in every.values() if k[0].startswith(f"media.{m}.")]) for m in sorted(sections)]


def _add_setting_flags(p: Parser, reg, full: bool = True) -> None:
    shown, sections = set(), reg.sections()
    everything = [("", [*iter_keys(Settings), *iter_media_keys(sections)])]
    for title, keys in _setting_groups(full, sections) + ([] if full else everything):
        group = p.add_argument_group(title)
        for dotted, f, typ in keys:
            if (not dotted.startswith("media.") and not is_flag_key(dotted, typ)) or dotted in shown:
                continue
            shown.add(dotted)
            name, meta = flag_name(dotted, f), f.metadata
            text = meta["help"].replace("%", "%%")  # argparse %-formats help texts
            choices = meta.get("choices")
            if dotted in TABLES:  # an extension table is the choices' one source: its entries and their lines
                table = TABLES[dotted](reg)
                choices = sorted(table)
                text += " " + "; ".join(f"{n}: {e.summary}" for n, e in sorted(table.items())) + "."
            text += f" [default: {f.default}]" if not isinstance(f.default, bool) else ""
            if not full and dotted not in COMMON:
                text = argparse.SUPPRESS  # still accepted: --help-all shows it
            if typ is bool and f.default:  # the flag turns the feature off: say so before what the feature is
                group.add_argument("--no-" + name[2:], dest=dotted, action="store_false", default=argparse.SUPPRESS,
                                   help=text if text == argparse.SUPPRESS else f"Turn off (on by default): {text}")
            elif typ is bool:
                group.add_argument(name, dest=dotted, action="store_true", default=argparse.SUPPRESS, help=text)
            else:
                metavar = "LO,HI" if typing.get_origin(typ) is tuple else dotted.split(".")[-1].upper()
                group.add_argument(name, dest=dotted, default=argparse.SUPPRESS, help=text,
                                   choices=choices, metavar=metavar)


def flag_names(p: argparse.ArgumentParser) -> dict[str, str]:
    """Each option's dest (a setting's dotted key) -> the flag a user types for it."""
    return {a.dest: a.option_strings[0] for a in p._actions if a.option_strings}


def run_parser(reg, full: bool = True) -> Parser:
    """The run's flags (reg: the registry, whose tables give the media's sections and the engines' and policies'
    choices); full=False hides all but the common ones from --help (every flag is still accepted)."""
    p = Parser(prog="kv_cache_benchmark.py",
               description="Block-level KV-cache storage benchmark (GPU / CPU / NVMe tiers).",
               epilog=SUBCOMMAND_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"kv-cache-bench {__version__}")
    p.add_argument("--help-all", action="store_true", help="Show every setting's flag and exit.")
    p.add_argument("--config", help="YAML settings file (default: the repository's config.yaml).")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="Override any setting, e.g. --set profiles.chatbot.think_time_s=0.1,0.2 (repeatable).")
    p.add_argument("--list-models", action="store_true", help="Print the model table and exit.")
    p.add_argument("--lmcache-config", metavar="FILE", help="Run an LMCache configuration (its YAML: chunk_size, "
                   "local_cpu, max_local_cpu_size, local_disk, max_local_disk_size, remote_url, save_decode_cache, "
                   "cache_policy) as this benchmark's tiers; flags given beside it win.")
    _add_setting_flags(p, reg, full)
    if not full:  # group titles with no visible flag would print empty sections
        p._action_groups = [g for g in p._action_groups
                            if any(a.help != argparse.SUPPRESS for a in g._group_actions)]
    return p


