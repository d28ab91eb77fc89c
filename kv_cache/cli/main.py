"""Command line: flags derived from the settings schema, sub-commands, clean errors.

    kv_cache_benchmark.py [run] [--flags]     run the benchmark (the default)
    kv_cache_benchmark.py report RESULTS      re-render a results.json (or its folder)
    kv_cache_benchmark.py compare RUN RUN ... headline numbers side by side, ratios to the first
    kv_cache_benchmark.py validate DIR        check a submission package: rules and checksums
    kv_cache_benchmark.py clean               remove what killed runs left (data and report folders)
    kv_cache_benchmark.py fleet [--flags]     N engines and a router over one shared tier, on paper
    kv_cache_benchmark.py --list-models       the model table

A user error prints one sentence and exits 2; Ctrl-C, SIGTERM and SIGHUP stop a run cleanly and exit
128 + the signal (130, 143, 129).
"""

from __future__ import annotations

import json
import os
import sys
import typing
from pathlib import Path

from kv_cache import runlog, signals
from kv_cache.cli.args import Parser
from kv_cache.cli.flags import run_parser
from kv_cache.cli.fleet import cmd_fleet
from kv_cache.cli.folders import remove_if_empty
from kv_cache.cli.policies import cmd_policies
from kv_cache.config import resolve
from kv_cache.errors import RunFault, UserError
from kv_cache.inputs import read_text, runs_inside
from kv_cache.recorder.results_schema import RESULTS_LIMIT, Results
from kv_cache.recorder.typed import SchemaError, SchemaVersionError
from kv_cache.report.table import fit
from kv_cache.run.registry import Registry, discover
from kv_cache.tiers.fsinfo import FILES, refuse_system_dir

DEBUG = "--debug"  # any sub-command: print an internal error's traceback (it is always kept in a log file)


def _cmd_run(argv: list[str], reg: Registry) -> int:
    from kv_cache.cli import mlperf

    parser = run_parser(reg, full="--help-all" in argv)
    argv, expanded = mlperf.expand_prefixes(argv, {s for a in parser._actions for s in a.option_strings})
    typed = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    reference = mlperf.translate(argv) if mlperf.speaks_reference(argv) else None
    if reference is not None:
        argv = reference.argv
        reference.notes[:0] = expanded
    args = vars(parser.parse_args(argv))
    if args.pop("help_all"):
        run_parser(reg).print_help()
        return 0
    config, sets = args.pop("config"), args.pop("set")
    origins, lmcache_notes = dict(reference.origins) if reference is not None else {}, []
    if lmcache := args.pop("lmcache_config"):
        from kv_cache.cli.lmcache import blame
        from kv_cache.cli.lmcache import translate as lmcache_translate

        lm_sets, lm_origins, lmcache_notes, made = lmcache_translate(lmcache, reg.media)
        sets, origins = lm_sets + sets, {**lm_origins, **origins}  # the file below --set and the flags
        lmcache_notes[:0] = [f"LMCache configuration {lmcache}, run here as: --set " + " --set ".join(lm_sets)]
        try:
            return _run(argv, reg, reference, config, sets, args, origins, lmcache_notes)
        except UserError as e:
            remove_if_empty(made)
            raise blame(e, lmcache, lm_sets, argv) from None
    try:
        return _run(argv, reg, reference, config, sets, args, origins, lmcache_notes)
    except UserError as e:
        if reference is None:
            raise
        raise mlperf.blame(e, reference, typed) from None


def _run(argv, reg, reference, config, sets, args, origins, lmcache_notes) -> int:
    """Settings resolved from the command line (a reference's, an LMCache file's translated), then the run."""
    list_models = args.pop("list_models")
    settings = resolve(config, sets, args, origins or None, media_sections=reg.sections())
    if list_models:
        from kv_cache.report.models_table import list_models_table

        print(list_models_table(settings.models, settings.model.kv_dtype, settings.model.tp,
                                settings.model.block_tokens))
        return 0
    from kv_cache.run.pipeline import execute

    say = (lambda *a, **k: None) if settings.run.quiet else (lambda text="": print(fit(str(text)), flush=True))
    if settings.run.processes > 1:
        from kv_cache.run.distributed import launched_by_mpi, relaunch

        if not launched_by_mpi():  # the ranks run this same command line; --processes is theirs to ignore
            return relaunch(settings.run.processes, argv, say)
    if reference is not None:
        say("MLPerf reference command line, run here as: " + " ".join(reference.argv))
        for note in reference.notes:
            say(f"  note: {note}")
    for i, note in enumerate(lmcache_notes):
        say(note if i == 0 else f"  note: {note}")
    try:
        status = execute(settings, reg, say)
    except UserError:
        remove_if_empty(reference.made_dirs if reference is not None else [])
        raise
    if reference is not None:
        from kv_cache.cli.mlperf_files import after_run

        after_run(reference, settings, say)
    return status



def _no_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows (a results file holds finite numbers)")


def load_results(arg: str) -> tuple[Path, Results]:
    """A results.json (or the run folder holding it), read and checked against the schema, value types too."""
    path = Path(arg)
    if path.is_dir():
        _runs_inside(path)
        path = path / "results.json"
    fix = "pass a run folder under reports/ or its results.json"
    text = read_text(str(path), "results file", RESULTS_LIMIT, fix)
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except ValueError as e:  # JSONDecodeError too
        raise UserError(f"{path} is not a readable results file ({e}); {fix}.") from None
    if not isinstance(data, dict) or "schema_version" not in data:
        raise UserError(f"{path} is not a kv-cache-bench results file (no schema_version).")
    try:
        return path, Results.from_dict(data, path.name)  # the message names the path once, not in every field
    except SchemaVersionError as e:  # not damaged: named by its whole path (two runs' files are both results.json)
        raise UserError(f"{e.of(str(path))}.") from None
    except SchemaError as e:
        raise UserError(f"{path} is an incomplete or damaged results file ({e}); re-run or restore it.") from None


def _runs_inside(folder: Path) -> None:
    """A folder of runs (the policies sub-command's, one a policy) is named with its runs, not as a missing file."""
    if (folder / "results.json").exists():
        return
    runs = runs_inside(folder, "results.json")
    if runs:
        raise UserError(f"{folder} holds no results.json of its own but the runs {', '.join(runs)}: pass one of them "
                        f"({folder / runs[0]}).")


def _cmd_report(argv: list[str], reg: Registry) -> int:
    p = Parser(prog="kv_cache_benchmark.py report", description="Re-render a results.json.")
    p.add_argument("results", help="A results.json file or the run folder holding it.")
    p.add_argument("--plots", action="store_true", help="Also rewrite the report folder's files and plots.")
    p.add_argument("--mlperf-output", metavar="FILE", help="Also write the MLPerf reference's --output fields of this "
                   "run (its schema, names and units) to FILE, and print its sections and PASS/FAIL line.")
    p.add_argument("--mlperf-profile", choices=("latency", "throughput"), default="latency",
                   help="The reference's performance profile its PASS/FAIL judges [default: latency].")
    args = p.parse_args(argv)
    folder = Path(args.results)
    if folder.is_dir() and not (folder / "results.json").exists() and not args.mlperf_output:
        from kv_cache.report.policies import FILE, policies_report

        if (folder / FILE).is_file():  # the policies sub-command's folder: its comparison
            print(policies_report(folder, args.plots))
            return 0
    path, data = load_results(args.results)
    from kv_cache.report.console import render

    if args.plots:
        from kv_cache.report.files import write_report

        write_report(data, path.parent)
    print(fit(render(data, str(path))))
    if args.mlperf_output:
        from kv_cache.report.mlperf.output import write_output
        from kv_cache.report.mlperf.reference_console import reference_summary

        target, fields = write_output(args.mlperf_output, path.parent, args.mlperf_profile)
        print("\n".join(reference_summary(fields)) + f"\nMLPerf fields: {target}")
    return 0


def _cmd_compare(argv: list[str], reg: Registry) -> int:
    p = Parser(prog="kv_cache_benchmark.py compare",
               description="Headline numbers of several runs side by side, ratios to the first.")
    p.add_argument("runs", nargs="+", help="Run folders (or results.json files); the first is the baseline.")
    p.add_argument("--output", help="Folder for the comparison plots (default reports/compare-<time>).")
    args = p.parse_args(argv)
    from kv_cache.run.fleet_runs import export_comparison_lines, is_export

    if len(args.runs) == 1 and is_export(args.runs[0]):  # a fleet point and the real runs its run.sh launched
        print("\n".join(export_comparison_lines(Path(args.runs[0]), lambda f: load_results(str(f))[1])))
        return 0
    if len(args.runs) < 2:
        raise UserError("compare needs at least two runs (run folders or results.json files), or one fleet point "
                        "that fleet --export-assignment wrote.")
    import time

    from kv_cache.run.fleet_runs import fleet_folders

    if fleets := fleet_folders(args.runs):  # fleet.json files: their points side by side (text only)
        from kv_cache.report.fleet import fleet_comparison

        print("\n".join(fleet_comparison(fleets)))
        return 0
    out = Path(args.output or Path("reports") / time.strftime("compare-%Y%m%dT%H%M%SZ", time.gmtime()))
    _plot_folder(out)
    runs, paths = [], []
    for arg in args.runs:
        path, data = load_results(arg)
        runs.append((data.run.run_id or path.parent.name, data))
        paths.append(path)
    from kv_cache.report.compare import comparison_plots, comparison_table

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--output {out}: cannot make the folder ({e.strerror}); pass a writable folder.") from None
    print(comparison_table(runs))
    for plot in comparison_plots(runs, out):
        print(f"plot: {plot}")
    return 0


def _cmd_capacity(argv: list[str], reg: Registry) -> int:
    p = Parser(prog="kv_cache_benchmark.py capacity",
               description="Hit rate and storage demand at every capacity of the bottom tier, from runs made with "
                           "--capacity-curve; several runs: the tier they would share, from their merged accesses.")
    p.add_argument("runs", nargs="+", help="Run folders (each with capacity_access.npz).")
    p.add_argument("--output", help="Folder for capacity_curve.png (default: the first run's folder).")
    args = p.parse_args(argv)
    if args.output:  # refused as compare's is (/etc, a file, an unwritable folder), before anything is read
        _plot_folder(Path(args.output))
    from kv_cache.run.capacity_curve import run_capacity

    return run_capacity(args.runs, args.output, lambda text="": print(fit(str(text)), flush=True), reg.policies)


def _plot_folder(out: Path) -> None:
    """compare's and capacity's --output: refused before anything is read if it cannot become a folder of plots
    (made after)."""
    refuse_system_dir(str(out), "--output", FILES)
    if out.exists() and not out.is_dir():
        raise UserError(f"--output {out} is a file; the comparison writes plots into a folder: pass a new or "
                        f"existing folder.")
    top = out.absolute()
    while not top.exists():
        top = top.parent
    if not top.is_dir():
        raise UserError(f"--output {out}: {top} is a file in its path; pass a folder.")
    if not os.access(top, os.W_OK | os.X_OK):
        raise UserError(f"--output {out}: {top} is not writable; pass a writable folder.")


def _cmd_validate(argv: list[str], reg: Registry) -> int:
    p = Parser(prog="kv_cache_benchmark.py validate",
               description="Check a submission package against its rules and checksums.")
    p.add_argument("package", help="The run folder written by --submission.")
    folder = Path(p.parse_args(argv).package)
    if not folder.is_dir():
        raise UserError(f"{folder} is not a folder; pass the run folder a --submission run wrote.")
    from kv_cache.run.submission import validate

    failures, rules = validate(folder, reg.engines)
    if failures:
        print(f"{folder}: does NOT conform{f' ({rules} rules)' if rules else ''}, {len(failures)} problem(s):")
        for f in failures:
            print(f"  - {f}")
        return 1
    print(f"{folder}: conforms to the {rules} rules; every checksum matches.")
    return 0


def _cmd_clean(argv: list[str], reg: Registry) -> int:
    p = Parser(prog="kv_cache_benchmark.py clean",
               description="Remove the folders that killed runs (SIGKILL, a crashed host) left: "
                           "only folders carrying this program's marker whose run is gone.")
    p.add_argument("--cache-dir", default="",
                   help="The cache directory the runs used [default: cache/ in --output-dir, as a run's].")
    p.add_argument("--output-dir", default="reports", help="Their --output-dir (empty report folders) "
                                                           "[default: reports].")
    p.add_argument("--other-hosts", action="store_true",
                   help="Also remove folders of runs of other hosts (their liveness cannot be checked from here).")
    p.add_argument("--dry-run", action="store_true", help="List what would be removed; remove nothing.")
    p.add_argument("--remote-url", help="Clean this remote tier instead (the namespaces killed runs left there).")
    p.add_argument("--kept", action="store_true", help="Also remove what runs kept on purpose (--keep-data).")
    args = p.parse_args(argv)
    if args.remote_url:
        return _clean_remote(args.remote_url, args.other_hosts, args.dry_run, args.kept, reg)
    from kv_cache.markers import Swept
    from kv_cache.run.leftovers import clean

    # where a run without --cache-dir puts its files; a run removes it once empty, so its absence is no mistake
    cache = args.cache_dir or str(Path(args.output_dir) / "cache")
    for where in ([args.cache_dir] if args.cache_dir else []) + [args.output_dir]:
        if not Path(where).is_dir():
            raise UserError(f"{where} is not a folder; pass the --cache-dir / --output-dir the runs used.")
    swept = clean(cache, args.other_hosts, args.dry_run, _say, kept=args.kept) if Path(cache).is_dir() else Swept()
    swept += clean(args.output_dir, args.other_hosts, args.dry_run, _say, prefix="")
    print(fit(swept.line("folder(s)", args.dry_run)))
    return 0


def _say(line: str) -> None:
    print(fit(line))


def _clean_remote(url: str, other_hosts: bool, dry_run: bool, kept: bool, reg: Registry) -> int:
    """clean --remote-url: what killed runs left in a remote tier, found by their markers, removed."""
    from kv_cache.tiers import remote

    kind = remote.medium_of(reg.media, url)
    store = kind.open_store(url, kind.settings_section())
    try:
        store.check()
        swept = remote.clean_namespaces(store, other_hosts, dry_run, _say, kept)
    except RunFault as e:  # the server went away midway
        raise UserError(str(e)) from None
    finally:
        store.close()
    print(fit(swept.line("namespace(s)", dry_run, f" in {store.url}")))
    return 0


COMMANDS = {"run": _cmd_run, "report": _cmd_report, "compare": _cmd_compare, "validate": _cmd_validate,
            "policies": cmd_policies, "clean": _cmd_clean, "capacity": _cmd_capacity, "fleet": cmd_fleet}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    stdout = sys.stdout
    if not isinstance(stdout, runlog.PipeSafe):
        sys.stdout = runlog.PipeSafe(stdout)
    runlog.set_debug(DEBUG in argv)  # any sub-command: an internal error's traceback on stderr too
    argv = [a for a in argv if a != DEBUG]
    command = argv[0] if argv and argv[0] in COMMANDS else "run"
    rest = argv[1:] if argv and argv[0] in COMMANDS else argv
    signals.install()  # SIGTERM and SIGHUP stop a run as Ctrl-C does
    try:
        reg = discover()  # every extension point, found once and handed down
        return COMMANDS[command](rest, reg)
    except UserError as e:
        runlog.tell(f"error: {e}")
        return 2
    except KeyboardInterrupt:
        # a run that started measuring never gets here: the runner catches the signal and results are written
        runlog.tell(f"{signals.name()} received before the measurement started; nothing was measured and "
                    f"temporary data was removed." if command == "run" else
                    f"{signals.name()} received: the {command} command stopped before it finished.")
        return signals.exit_status()
    except Exception as e:  # a bug of ours, not the user's: one line, the traceback in a log file
        runlog.tell(f"{runlog.internal('internal error', e)}; please report it with that file"
                    f"{'' if runlog.debugging() else ' (--debug prints it)'}.")
        return 1
    finally:
        runlog.close()
        sys.stdout = stdout


def leave(status: int) -> typing.NoReturn:
    """Exit with status. NIXL's wheel bundles a libnl-route whose library destructor crashes at exit (SIGSEGV in
    rtnl_tc_unregister) once a NIXL agent was made: then every file is closed by now, so leave without it."""
    signals.ignore()  # done: a late signal must not turn the exit into a traceback
    if "nixl_cu12" in sys.modules:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    raise SystemExit(status)


def entry() -> typing.NoReturn:
    """The kv-cache-bench console script."""
    leave(main())
