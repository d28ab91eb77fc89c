"""Counter names are spelled in kv_cache/counters.py only: a stage that counts and the results that read it back
name a counter through its constant or family, so neither can drift from the other (issue 40, item 4)."""

import ast
from pathlib import Path

from kv_cache import counters as C
from kv_cache.types import RequestOutcome

PKG = Path(__file__).resolve().parents[2] / "kv_cache"


def _vocabulary() -> tuple[set[str], tuple[str, ...]]:
    names = {v for v in vars(C).values() if type(v) is str and "." in v}
    families = tuple(f"{v}." for v in vars(C).values() if isinstance(v, C.Family))
    return names, families


def spelled_elsewhere(source: str) -> list[str]:
    """Counter names written as literals in source: a plain counter's name, or a literal / f-string starting with
    a family's prefix (settings keys such as "semantic.enabled" are not counters: a family's f-string is)."""
    names, families = _vocabulary()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
            found.append(node.value)
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            head = str(node.values[0].value)
            if head.startswith(families):
                found.append(head + "{...}")
    return found


def test_no_module_spells_a_counter_name_but_counters_py():
    bad = {str(p.relative_to(PKG)): hits for p in PKG.rglob("*.py") if p.name != "counters.py"
           and (hits := spelled_elsewhere(p.read_text()))}
    assert not bad, f"counter names spelled outside kv_cache/counters.py: {bad}"


def test_the_check_finds_a_name_spelled_again():
    assert spelled_elsewhere('recorder.count("verification.failures")') == ["verification.failures"]
    assert spelled_elsewhere('c.get(f"tokens.cached_by_tier.{t}")') == ["tokens.cached_by_tier.{...}"]
    assert spelled_elsewhere('replace(s, "semantic.enabled", True)') == []


def test_a_request_outcome_becomes_the_counters_the_results_read():
    out = RequestOutcome(100, 20, cached_tokens=64, blocks_looked_up=6, blocks_hit=4,
                         cached_tokens_by_tier={"cpu": 48, "nvme": 16}, cached_tokens_by_source={"system": 64},
                         prompt_tokens_by_source={"system": 64, "user": 36}, found={"prefix": True, "history": False},
                         semantic={"paraphrase": {"requests": 1, "found": 0}})
    got = dict(out.counts())
    assert got[C.TOKENS_PROMPT] == 100 and got[C.TOKENS_CACHED] == 64 and got[C.TOKENS_GENERATED] == 20
    assert C.TOKENS_CACHED_BY_TIER.of(got) == {"cpu": 48, "nvme": 16}
    assert C.TOKENS_PROMPT_BY_SOURCE.of(got) == {"system": 64, "user": 36}
    assert got[C.found("prefix", True)] == 1 and got[C.found("history", False)] == 1
    assert C.found("history", True) not in got
    assert got[C.SEMANTIC("paraphrase", "found")] == 0  # a transform's metrics keep their zeros
    assert C.BLOCKS_WRITE_SKIPPED not in got  # other zeros are left out: an absent counter reads 0
