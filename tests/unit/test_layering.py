"""The data flows one way: a stage imports only itself, the stages to its right and shared modules.

    sources -> scheduler -> lifecycle -> cache -> tiers      recorder beside, report at the end
"""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "kv_cache"
FLOW = ["sources", "scheduler", "lifecycle", "cache", "tiers"]
SHARED = {"types", "config", "config_check", "config_load", "errors", "model", "signals", "__init__"}
ROOT = {"cli", "run", "build", "budget", "traffic", "config_doc", "distributed", "trials", "submission", "__main__",
        "control", "policy_compare", "leftovers", "outfolder"}
SHARED_EXTRA = {"config_check"}  # composition root: may import anything


def allowed(stage: str) -> set[str]:
    if stage in FLOW:
        return set(FLOW[FLOW.index(stage):]) | SHARED | {"recorder"}
    if stage == "recorder":
        return {"recorder"} | SHARED
    if stage == "report":
        return {"report", "recorder"} | SHARED
    return SHARED


def kv_imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for n in names:
            parts = n.split(".")
            if parts[0] == "kv_cache" and len(parts) > 1:
                yield parts[1]


def test_imports_follow_the_flow():
    bad = []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).parts
        stage = rel[0] if len(rel) > 1 else path.stem
        if stage in ROOT:
            continue
        for target in kv_imports(path):
            if target not in allowed(stage):
                bad.append(f"{'/'.join(rel)} imports kv_cache.{target}")
    assert not bad, "arrows going back:\n" + "\n".join(bad)


def test_budget_of_module_size():
    big = [f"{p.relative_to(PKG)}: {n}" for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > 400]
    assert not big, big
