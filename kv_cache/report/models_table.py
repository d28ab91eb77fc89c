"""The --list-models table: geometry, bytes per token and one block's size per model."""

from __future__ import annotations

from kv_cache.errors import UserError
from kv_cache.model import all_models
from kv_cache.report.table import fit, format_table


def list_models_table(extra: dict | None, kv_dtype: str, tp: int, block_tokens: int) -> str:
    rows = [["model", "aliases", "layers", "kv heads", "head dim", "B/token", f"{block_tokens}-tok block"]]
    for m in all_models(extra):
        heads = "MLA" if m.attention == "mla" else str(m.kv_heads)
        dim = f"{m.kv_lora_rank}+{m.rope_dim}" if m.attention == "mla" else str(m.head_dim)
        try:
            bpt = m.bytes_per_token(kv_dtype, tp)
            size = [f"{bpt:,}", f"{bpt * max(block_tokens, 1) / 2**20:,.2f} MiB"]
        except UserError:
            size = ["n/a (tp)", "n/a"]
        rows.append([m.name, ",".join(m.aliases) or "-", str(m.layers), heads, dim, *size])
    note = f"(kv dtype {kv_dtype}, tp {tp}: bytes one tensor-parallel rank holds; notes: " + "; ".join(
        f"{m.name}: {m.note}" for m in all_models(extra) if m.note) + ")"
    return "\n".join(format_table(rows) + [fit(note)])
