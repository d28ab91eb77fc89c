"""The MLPerf reference's config.yaml, read by the front door (mlperf.py): its strict schema checked, its keys
mapped onto our settings (docs/mlperf.md "The MLPerf front door"), its model_configs applied."""

from __future__ import annotations

import dataclasses
import difflib

from kv_cache.config import Settings
from kv_cache.errors import UserError

_TEMPLATE_KEYS = {"context_range", "generation_range", "think_time_range"}
_QOS_KEYS = {"target_latency_p95_ms", "target_latency_p99_ms", "target_latency_p999_ms", "target_latency_p9999_ms",
             "priority"}
MODEL_FIELDS = {"name", "num_layers", "hidden_dim", "num_heads", "kv_heads", "dtype", "kv_dim_per_head",
                "attention_type", "kv_lora_rank", "qk_rope_head_dim"}
# the reference's strict config schema (docs/mlperf.md "The MLPerf front door"; ../shared/reference/mlperf_reference.md
# section 2): a section's keys, or for two-level sections each entry's keys; model_configs' entries are any name
REFERENCE_SCHEMA: dict[str, set | dict] = {
    "user_templates": dict.fromkeys(("chatbot", "coding", "document"), _TEMPLATE_KEYS),
    "generation_timing": {"none", "fast", "realistic"},
    "qos_profiles": dict.fromkeys(("interactive", "responsive", "batch"), _QOS_KEYS),
    "qos_distribution": {"interactive_probability", "responsive_threshold"},
    "eviction": {"max_recursion_depth", "target_usage_ratio", "large_entry_limit_ratio", "max_evictions_hard_cap",
                 "max_evictions_min"},
    "gpu_backend": {"memory_fraction", "max_eviction_attempts", "free_memory_threshold"},
    "prefix_cache": {"min_prefix_length", "max_prefix_entries", "system_prompt_hit_probability"},
    "rag": {"chunk_size_tokens", "top_k_chunks", "max_chunk_bytes", "request_probability", "retrieval_distribution",
            "max_documents", "large_model_doc_tokens_min", "large_model_doc_tokens_max", "small_model_doc_tokens_min",
            "small_model_doc_tokens_max"},
    "conversation": {"max_conversations", "max_turns_per_conv", "end_conversation_probability"},
    "autoscaler": {"min_users", "max_users", "scale_up_factor", "scale_down_factor", "consecutive_samples_required"},
    "decode": {"batch_size"},
    "sharegpt": {"max_context_tokens", "max_generation_tokens", "chars_per_token_estimate"},
    "saturation_detection": {"read_latency_p95_threshold_ms", "write_latency_p95_threshold_ms",
                             "queue_depth_threshold", "history_window_size"},
    "validation_limits": {"max_users", "max_duration_seconds", "max_gpu_memory_gb", "max_cpu_memory_gb"},
    "model_configs": {},
}
REFERENCE_SECTIONS = set(REFERENCE_SCHEMA)
OUR_SECTIONS = {f.name for f in dataclasses.fields(Settings)}


def is_reference_config(data: dict) -> bool:
    """Sections only the reference has, and none only ours has (rag is in both)."""
    keys = set(data)
    return bool(keys & (REFERENCE_SECTIONS - OUR_SECTIONS)) and not keys & (OUR_SECTIONS - REFERENCE_SECTIONS)


def apply_config(path: str, data: dict, chosen_model: str, sets, notes: list[str]) -> None:
    """Map a reference config file's keys onto ours (sets: mlperf.Sets); what has no equivalent is named in a
    note; what its strict schema refuses is refused."""
    unknown = sorted(set(data) - REFERENCE_SECTIONS)
    if unknown:
        raise UserError(f"config file {path}: section {unknown[0]!r} is in neither the MLPerf reference's schema nor "
                        f"ours; remove it.")
    for section, body in data.items():
        _check_keys(path, section, body)
    if data.get("model_configs"):
        sets.source = f"config file {path}: model_configs"
        _models(data.pop("model_configs"), chosen_model, sets, notes)
    sets.source = f"config file {path}: qos_distribution"
    unused = _qos_mix(data.pop("qos_distribution", None) or {}, sets)
    for mode, seconds in (data.pop("generation_timing", None) or {}).items():  # its sleep per token, by mode
        sets.timing[mode] = float(seconds) * 1000.0
    docs = _doc_tokens(data.get("rag") or {}, chosen_model)
    if docs:
        sets.source = f"config file {path}: rag.*_doc_tokens_*"
        sets["rag.document_tokens"] = docs
    for section, body in data.items():
        for k, v in (body or {}).items():
            sets.source = f"config file {path}: {section}.{k}"
            unused += [f"{section}.{k}{'.' + sub if sub else ''}" for sub in _config_key(section, k, v, sets)]
    sets.source = ""
    if unused:
        notes.append(f"config {path}: not applied here (no equivalent, or fixed by design): {', '.join(unused)}")


def _check_keys(path: str, section: str, body) -> None:
    """Refuse a key the reference's strict schema refuses (it raises ValueError), by name, with the nearest."""
    if body is None:
        return
    known = REFERENCE_SCHEMA[section]
    if not isinstance(body, dict):
        raise UserError(f"config file {path}: {section} must be a mapping, as the MLPerf reference reads it.")
    for k, v in body.items():
        if section == "model_configs" or isinstance(known, dict):
            fields = MODEL_FIELDS if section == "model_configs" else known.get(k)
            if fields is None:
                _unknown(path, f"{section}.{k}", known)
            if not isinstance(v, dict):
                raise UserError(f"config file {path}: {section}.{k} must be a mapping, as the MLPerf reference "
                                f"reads it.")
            for kk in v:
                if kk not in fields:
                    _unknown(path, f"{section}.{k}.{kk}", fields)
        elif k not in known:
            _unknown(path, f"{section}.{k}", known)


def _doc_tokens(rag: dict, model: str) -> list[int] | None:
    """Its model-aware document lengths: the large_model_* range for models of 70B parameters and more (by their
    name, as its model table sizes them), the small_model_* range for the others."""
    import re

    size = re.search(r"(\d+(?:\.\d+)?)b\b", model.lower())
    prefix = "large" if size and float(size.group(1)) >= 70 else "small"
    lo, hi = rag.get(f"{prefix}_model_doc_tokens_min"), rag.get(f"{prefix}_model_doc_tokens_max")
    return [int(lo), int(hi)] if lo is not None and hi is not None else None


def _unknown(path: str, dotted: str, known) -> None:
    near = difflib.get_close_matches(dotted.rsplit(".", 1)[1], list(known), 1)
    hint = f"did you mean {near[0]}?" if near else f"known: {', '.join(sorted(known))}"
    raise UserError(f"config file {path}: {dotted} is not in the MLPerf reference's schema (it refuses it too); "
                    f"{hint}")


_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "int8": "fp8"}  # same bytes per element


def _models(body: dict, chosen: str, sets, notes: list[str]) -> None:
    """model_configs as our models (merged over the built-ins, new names allowed); the chosen model's dtype sets
    --kv-dtype, as the reference sizes a token with it."""
    from kv_cache.model import all_models

    builtin = {n: m.name for m in all_models() for n in (m.name, *m.aliases)}
    models = {}
    for key, spec in body.items():
        layers, attention = spec.get("num_layers"), spec.get("attention_type", "mha")
        if attention == "mla":
            ours = {"layers": layers, "attention": "mla", "kv_lora_rank": spec.get("kv_lora_rank"),
                    "rope_dim": spec.get("qk_rope_head_dim")}
        else:
            heads, hidden = spec.get("num_heads"), spec.get("hidden_dim")
            head_dim = spec.get("kv_dim_per_head") or (hidden // heads if hidden and heads else None)
            ours = {"layers": layers, "kv_heads": spec.get("kv_heads"), "head_dim": head_dim}
        missing = [k for k, v in ours.items() if v is None]
        if missing:
            notes.append(f"model_configs.{key}: not applied, it lacks what sizes a token here ({', '.join(missing)}"
                         f"; the reference merges a partial entry over its built-in, whose fields are not ours)")
            continue
        if "dtype" in spec and spec["dtype"] not in _DTYPES:
            raise UserError(f"{sets.source}.{key}.dtype {spec['dtype']!r} is not a dtype the reference knows "
                            f"({', '.join(_DTYPES)}).")
        models[builtin.get(key, key)] = ours  # a built-in's name or alias: that model is replaced
        if key == chosen and spec.get("dtype") in _DTYPES:
            sets["model.kv_dtype"] = _DTYPES[spec["dtype"]]
    if models:
        sets["models"] = models


def _qos_mix(body: dict, sets: dict) -> list[str]:
    """qos_distribution -> qos.mix; a key it leaves out takes the reference's default (0.15, cumulative 0.50)."""
    if not body:
        return []
    a = body.get("interactive_probability", 0.15)
    b = body.get("responsive_threshold", 0.50)
    for name, v, lo in (("interactive_probability", a, 0.0), ("responsive_threshold", b, a)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= 1.0:
            raise UserError(f"{sets.source}.{name} must be a number from {lo:g} to 1 (responsive_threshold is "
                            f"cumulative, at least interactive_probability); got {v!r}.")
    sets["qos.mix"] = f"interactive={a:g},responsive={b - a:g},batch={1 - b:g}"
    return [f"qos_distribution.{k}" for k in sorted(set(body) - {"interactive_probability", "responsive_threshold"})]


_TEMPLATE = {"context_range": "context_tokens", "generation_range": "output_tokens",
             "think_time_range": "think_time_s"}


def _nested(v: dict, names: dict, prefix: str, sets: dict) -> list[str]:
    """Apply the sub-keys of v named in names under prefix; the sub-keys with no equivalent."""
    for rk, ours in names.items():
        if rk in v:
            sets[f"{prefix}.{ours}"] = list(v[rk]) if isinstance(v[rk], list) else v[rk]
    return sorted(set(v) - set(names))


def _config_key(section: str, k: str, v, sets: dict) -> list[str]:
    """Apply one reference config key to our settings; what of it has no equivalent ('' = all of it)."""
    if section == "user_templates" and isinstance(v, dict) and k in ("chatbot", "coding", "document"):
        return _nested(v, _TEMPLATE, f"profiles.{k}", sets)
    if section == "qos_profiles" and isinstance(v, dict) and k in ("interactive", "responsive", "batch"):
        # the reference judges end-to-end latency against its p95 target; p99.9 / p99.99 are not judged here
        names = {"target_latency_p95_ms": "e2e_p95_ms", "target_latency_p99_ms": "e2e_p99_ms", "priority": "priority"}
        return _nested(v, names, f"qos.{k}", sets)
    if section == "rag" and "_doc_tokens_" in k:
        return []  # applied as one range (_doc_tokens)
    simple = {("conversation", "max_turns_per_conv"): "workload.max_turns",
              ("sharegpt", "max_generation_tokens"): "trace.max_output_tokens",
              ("conversation", "end_conversation_probability"): "workload.end_probability",
              ("rag", "top_k_chunks"): "rag.top_k", ("rag", "request_probability"): "rag.request_probability"}
    if (section, k) in simple:
        sets[simple[(section, k)]] = v
        return []
    if (section, k) == ("rag", "retrieval_distribution"):
        sets["rag.zipf"] = 1.0 if v == "zipfian" else 0.0
        return []
    return [""]
