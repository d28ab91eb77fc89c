"""The design's arrows, enforced for every module of kv_cache (relative imports and `from kv_cache import x`
included), the same picture docs/architecture.md draws:

    cli/ -> run/ (the hub: it builds every stage and wires them; nothing else wires two stages)
    run/ -> sources/  scheduler/  lifecycle/ -> cache/ -> tiers/      recorder/ beside each; report/ at the end

- sources and scheduler are stages of their own: they import no other stage (run/ hands the scheduler the
  traffic and the lifecycle's execute as arguments);
- lifecycle -> cache -> tiers: each imports itself, the one stage after it, the recorder and the shared leaves;
- the recorder imports itself and the shared leaves; the report, the recorder too;
- the shared leaves (types, counters, errors, model, signals, buffers, runlog, inputs, markers, config, safefiles,
  hostmemory) import only shared leaves;
- the composition root (run/) may import any stage, the recorder and the report; nothing imports it but the
  command line (cli/) and the entry points (__main__);
- the command line imports run/, the report, the recorder and tiers/ (a path's checks, `clean --remote-url`'s
  store), never another stage; nothing imports it but the entry points;
- the fleet on paper (fleet/) is a pipeline of its own that run/ composes: it reads the traffic (sources), plans
  it with the lifecycle's planner and serves it through the cache on accounting tiers (lifecycle, cache, tiers) and
  the recorder's stack distances; nothing but run/ imports it.
A module outside these units fails: a new file has to be placed in the picture.
"""

import ast
import re
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "kv_cache"
FLOW = ["lifecycle", "cache", "tiers"]  # a chain: each stage may import the next
SOURCES = ("sources", "scheduler")      # stages of their own: no other stage
SHARED = {"__init__", "types", "counters", "errors", "model", "signals", "buffers", "runlog", "inputs", "markers",
          "config", "safefiles", "hostmemory"}
ROOT = "run"
CLI = "cli"
FLEET = "fleet"


def allowed(unit: str) -> set[str]:
    """The units `unit` may import."""
    if unit == CLI:
        return {CLI, ROOT, "report", "recorder", "tiers"} | SHARED
    if unit == ROOT:
        return {u for u in (*SOURCES, *FLOW, "recorder", "report", ROOT, FLEET, *SHARED)}
    if unit == FLEET:
        return {FLEET, "sources", *FLOW, "recorder"} | SHARED
    if unit in SOURCES:
        return {unit, "recorder"} | SHARED
    if unit == "__main__":
        return SHARED | {CLI}
    if unit in SHARED:
        return SHARED
    if unit in FLOW:
        i = FLOW.index(unit)
        return {unit, *FLOW[i + 1:i + 2], "recorder"} | SHARED
    if unit == "recorder":
        return {"recorder"} | SHARED
    if unit == "report":
        return {"report", "recorder"} | SHARED
    raise AssertionError(f"kv_cache/{unit} is in no unit of the design; place it (tests/unit/test_layering.py)")


def unit_of(rel: tuple[str, ...]) -> str:
    return rel[0] if len(rel) > 1 else rel[0].removesuffix(".py")


def imported_units(source: str, rel: tuple[str, ...]):
    """The kv_cache units a module's source imports, with the line of each import."""
    package = ["kv_cache", *rel[:-1]]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:  # from . import x / from ..tiers import y
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [f"{module}.{a.name}" for a in node.names] if module == "kv_cache" else [module]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            if parts[0] == "kv_cache" and len(parts) > 1:
                name = parts[1]
                yield ("__init__" if name == "__version__" else name), node.lineno


def violations(files: dict[tuple[str, ...], str]) -> list[str]:
    """Every import that breaks an arrow, as 'path:line imports kv_cache.unit'."""
    bad = []
    for rel, source in sorted(files.items()):
        unit = unit_of(rel)
        ok = allowed(unit)
        for target, line in imported_units(source, rel):
            if target not in ok:
                bad.append(f"{'/'.join(rel)}:{line} imports kv_cache.{target}")
    return bad


def tree() -> dict[tuple[str, ...], str]:
    return {p.relative_to(PKG).parts: p.read_text() for p in PKG.rglob("*.py")}


def test_imports_follow_the_flow():
    bad = violations(tree())
    assert not bad, "arrows the design forbids:\n" + "\n".join(bad)


def test_the_test_fails_on_forbidden_imports():
    """The checker itself: the imports the issue found passing before now fail, in every spelling."""
    files = tree()
    rel = ("sources", "synthetic.py")
    files[rel] = files[rel] + ("\nfrom kv_cache.tiers.nvme import NvmeTier\nfrom ..lifecycle.executor import Lifecycle"
                               "\nfrom kv_cache import run\nimport kv_cache.report.console\n")
    bad = violations(files)
    assert [b.split(" imports ")[1] for b in bad] == ["kv_cache.tiers", "kv_cache.lifecycle", "kv_cache.run",
                                                      "kv_cache.report"], bad
    # a stage may not skip the next one (lifecycle -> tiers), nor a shared leaf reach into a stage
    assert violations({("lifecycle", "x.py"): "from kv_cache.tiers.base import FAKE_IO\n"})
    assert violations({("config", "x.py"): "from kv_cache.recorder.results_schema import Results\n"})
    assert violations({("recorder", "x.py"): "from kv_cache.config.load_control import QOS_CLASSES\n"}) == []
    assert violations({("tiers", "x.py"): "from ..run import stack\n"})
    # issue 47: the picture is the imports: sources and scheduler reach no other stage, the command line no stage
    # but the tiers' checks
    assert violations({("sources", "x.py"): "from kv_cache.scheduler.clock import Clock\n"})
    assert violations({("scheduler", "x.py"): "from kv_cache.lifecycle.executor import Lifecycle\n"})
    assert violations({("cli", "x.py"): "from kv_cache.cache.cache import BlockCache\n"})
    assert violations({("cli", "x.py"): "from kv_cache.run.registry import discover\n"}) == []


def test_every_module_is_placed():
    for rel in tree():
        allowed(unit_of(rel))  # raises for a module in no unit


def test_only_the_tiers_name_a_medium():
    """A new bottom tier is one module: no code above tiers/ names a medium's class or module."""
    media = re.compile(r"\b(Nvme|Cpu|Gpu|Simulated|Null)Tier\b|kv_cache\.tiers\.(nvme|cpu|gpu|simulated|null)\b"
                       r"|[\"']nvme[\"']")  # settings keys (s.tiers.nvme_gb, s.tiers.gpu) are the tiers' own settings
    found = [f"{'/'.join(rel)}:{i}: {line.strip()}" for rel, src in tree().items() if rel[0] not in ("tiers", "config")
             for i, line in enumerate(src.splitlines(), 1) if media.search(line)]
    assert not found, found
    assert media.search("from kv_cache.tiers.nvme import NvmeTier") and media.search('b["nvme"]')


def test_budget_of_module_size():
    big = [f"{'/'.join(rel)}: {n}" for rel, src in tree().items() if (n := len(src.splitlines())) > 400]
    assert not big, big


def test_docstrings_and_comments_name_only_modules_that_exist():
    """A file renamed or folded away leaves no stale name behind (pipeline.py once named build.py and run.py)."""
    root = PKG.parent
    names = {p.name for p in root.rglob("*.py")}
    stale = []
    for path in PKG.rglob("*.py"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            stale += [f"{path.relative_to(root)}:{n}: {m}" for m in re.findall(r"\b([A-Za-z_]\w*\.py)\b", line)
                      if m not in names]
            for dotted in re.findall(r"\bkv_cache(?:\.\w+)+", line):
                parts = dotted.split(".")
                if not any((root.joinpath(*parts[:k]).with_suffix(".py")).exists()
                           or (root.joinpath(*parts[:k]) / "__init__.py").exists() for k in range(2, len(parts) + 1)):
                    stale.append(f"{path.relative_to(root)}:{n}: {dotted}")
    assert not stale, stale


def module_imports(files: dict[tuple[str, ...], str]) -> dict[str, set[str]]:
    """Each module's kv_cache modules imported (at its top or inside a function), as dotted names."""
    names = {".".join(("kv_cache", *rel)).removesuffix(".py").removesuffix(".__init__") for rel in files}
    graph = {}
    for rel, source in files.items():
        me = ".".join(("kv_cache", *rel)).removesuffix(".py").removesuffix(".__init__")
        package = ["kv_cache", *rel[:-1]]
        out = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom):
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else [])) \
                    if node.level else (node.module or "")
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in names:
                    t = t.rpartition(".")[0]
                if t and t != me and not me.startswith(t + "."):  # a package's own __init__ is not a circle
                    out.add(t)
        graph[me] = out
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import circles (Tarjan's strongly connected components of more than one module)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle():
    """Issue 38, item 5: tiers/registry.py and tiers/nvme.py imported each other (the handoff's shared files). No
    module reaches itself through its imports, function-level imports included."""
    assert circles(module_imports(tree())) == []
    assert circles(module_imports({("tiers", "a.py"): "def f():\n    from kv_cache.tiers.b import x\n",
                                   ("tiers", "b.py"): "from kv_cache.tiers.a import y\n"})) == [
        ["kv_cache.tiers.a", "kv_cache.tiers.b"]]
