"""Model geometry -> KV bytes per token and per block.

Vocabulary: *bytes per token* is the KV of one token over all layers;
GQA/MHA stores K and V per kv head, MLA one compressed latent plus a shared
RoPE key per layer. With tensor parallelism the benchmark plays one rank:
kv heads are split across ranks while there are at least as many heads as
ranks (beyond that each rank keeps one replicated head), and an MLA latent is
replicated on every rank.

Values follow ../shared/reference/storage_methods.md section 5.
"""

from __future__ import annotations

from dataclasses import dataclass

from kv_cache.errors import UserError

GiB = 2**30  # one definition: every GiB figure of the tool

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
PAGE_BYTES = 4096


@dataclass(frozen=True)
class ModelSpec:
    """One model's KV geometry."""

    name: str
    layers: int
    kv_heads: int = 0
    head_dim: int = 0
    attention: str = "gqa"  # gqa (includes MHA) or mla
    kv_lora_rank: int = 0
    rope_dim: int = 0
    aliases: tuple[str, ...] = ()
    note: str = ""

    def bytes_per_token(self, kv_dtype: str = "bf16", tp: int = 1) -> int:
        """KV bytes per token held by one tensor-parallel rank."""
        dtype = DTYPE_BYTES[kv_dtype]
        if self.attention == "mla":
            return self.layers * (self.kv_lora_rank + self.rope_dim) * dtype
        heads_per_rank = self.kv_heads // tp if tp <= self.kv_heads else 1
        if tp <= self.kv_heads and self.kv_heads % tp:
            raise UserError(f"model {self.name} has {self.kv_heads} kv heads, which --tp {tp} does not divide; "
                            f"use a divisor of {self.kv_heads} or a multiple above it.")
        return 2 * self.layers * heads_per_rank * self.head_dim * dtype

    def block_bytes(self, block_tokens: int, kv_dtype: str = "bf16", tp: int = 1) -> int:
        return block_tokens * self.bytes_per_token(kv_dtype, tp)


def _gqa(name, layers, kv_heads, head_dim, aliases=(), note=""):
    return ModelSpec(name, layers, kv_heads, head_dim, "gqa", aliases=tuple(aliases), note=note)


BUILTIN = (
    _gqa("llama3.1-8b", 32, 8, 128, ("llama8b",)),
    _gqa("llama3.1-70b", 80, 8, 128, ("llama70b", "llama3.1-70b-instruct")),
    _gqa("llama3.1-405b", 126, 8, 128, ("llama405b",)),
    _gqa("llama2-7b", 32, 32, 128, ("llama7b",), "multi-head attention: 32 KV heads"),
    _gqa("tiny-1b", 12, 4, 128, ("tinyllama-1.1b",), "MLPerf's reference test model"),
    _gqa("mistral-7b", 32, 8, 128, ("mistral7b",), "v0.1's 4096-token sliding window not modelled"),
    _gqa("qwen2.5-7b", 28, 4, 128),
    _gqa("qwen2.5-72b", 80, 8, 128),
    _gqa("qwen3-8b", 36, 8, 128),
    _gqa("qwen3-32b", 64, 8, 128),
    _gqa("qwen3-30b-a3b", 48, 4, 128),
    _gqa("qwen3-235b-a22b", 94, 4, 128),
    ModelSpec("deepseek-v3", 61, attention="mla", kv_lora_rank=512, rope_dim=64, aliases=("deepseek-r1",)),
    _gqa("gpt-oss-20b", 24, 8, 64, note="every layer full attention (sliding-window layers not modelled)"),
    _gqa("gpt-oss-120b", 36, 8, 64, note="every layer full attention (sliding-window layers not modelled)"),
)


def check_model(name: str, spec, origin: str = "config") -> ModelSpec:
    """A model of the settings' models section, or one sentence naming what set it (origin) and what is wrong."""
    where = f"{origin}: models.{name}" if origin != "config" else f"config models.{name}"
    if not isinstance(spec, dict):
        raise UserError(f"{where} must be a mapping with layers, kv_heads, head_dim (or MLA keys).")
    allowed = {"layers", "kv_heads", "head_dim", "attention", "kv_lora_rank", "rope_dim", "aliases", "note"}
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise UserError(f"{where}: unknown key '{unknown[0]}' (known: {', '.join(sorted(allowed))}).")
    attention = spec.get("attention", "gqa")
    need = ("layers", "kv_lora_rank", "rope_dim") if attention == "mla" else ("layers", "kv_heads", "head_dim")
    if attention not in ("gqa", "mha", "mla"):
        raise UserError(f"{where}.attention must be gqa, mha or mla; got {attention!r}.")
    for k in need:
        v = spec.get(k)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise UserError(f"{where}.{k} must be a positive integer; got {v!r}.")
    return ModelSpec(name, spec["layers"], spec.get("kv_heads", 0), spec.get("head_dim", 0),
                     "mla" if attention == "mla" else "gqa", spec.get("kv_lora_rank", 0),
                     spec.get("rope_dim", 0), tuple(spec.get("aliases", ())), spec.get("note", "from config"))


def all_models(extra: dict | None = None) -> list[ModelSpec]:
    models = list(BUILTIN)
    for name, spec in (extra or {}).items():
        models = [m for m in models if m.name != name] + [check_model(name, spec)]
    return models


def find_model(name: str, extra: dict | None = None) -> ModelSpec:
    """Look a model up by name or alias; an unknown name lists the valid ones."""
    models = all_models(extra)
    for m in models:
        if name == m.name or name in m.aliases:
            return m
    # Names are exact, as the reference's --model choices are: a case slip is named, not silently mapped
    near = [n for m in models for n in (m.name, *m.aliases) if n.lower() == name.lower()]
    if near:
        raise UserError(f"unknown model '{name}': model names are case-sensitive; did you mean '{near[0]}'?")
    names = ", ".join(m.name for m in models)
    raise UserError(f"unknown model '{name}'; valid models: {names} (aliases in --list-models).")


def slot_bytes(nbytes: int) -> int:
    """Bytes a block occupies in a tier: rounded up to whole 4 KiB pages (O_DIRECT alignment)."""
    return -(-nbytes // PAGE_BYTES) * PAGE_BYTES
