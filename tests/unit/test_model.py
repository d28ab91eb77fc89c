"""Bytes per token and per block, against ../shared/reference/storage_methods.md section 5."""

import pytest

from kv_cache.errors import UserError
from kv_cache.model import find_model

# (name or alias, bytes/token at 16 bits, 256-token block in MiB) from the reference table.
TABLE = [
    ("llama8b", 131_072, 32), ("llama3.1-8b", 131_072, 32),
    ("llama70b", 327_680, 80), ("llama3.1-70b", 327_680, 80),
    ("llama405b", 516_096, 126), ("mistral7b", 131_072, 32),
    ("qwen2.5-7b", 57_344, 14), ("qwen2.5-72b", 327_680, 80),
    ("qwen3-8b", 147_456, 36), ("qwen3-32b", 262_144, 64),
    ("qwen3-30b-a3b", 98_304, 24), ("deepseek-v3", 70_272, 17.15625),
    ("gpt-oss-20b", 49_152, 12), ("gpt-oss-120b", 73_728, 18),
]


@pytest.mark.parametrize("name,bpt,block_mib", TABLE)
def test_bytes_per_token_matches_reference(name, bpt, block_mib):
    m = find_model(name)
    assert m.bytes_per_token("bf16") == bpt
    assert m.bytes_per_token("fp16") == bpt
    assert m.block_bytes(256, "bf16") == block_mib * 2**20


def test_fp8_halves_and_fp32_doubles():
    m = find_model("llama70b")
    assert m.bytes_per_token("fp8") == 163_840
    assert m.bytes_per_token("fp32") == 655_360


def test_tensor_parallel_splits_kv_heads_until_replication():
    m = find_model("llama70b")  # 8 kv heads
    assert m.bytes_per_token("bf16", tp=8) == 327_680 // 8
    assert m.bytes_per_token("bf16", tp=16) == 327_680 // 8  # one replicated head per rank
    with pytest.raises(UserError, match="does not divide"):
        m.bytes_per_token("bf16", tp=3)


def test_mla_latent_is_replicated_across_tp():
    m = find_model("deepseek-v3")
    assert m.bytes_per_token("bf16", tp=8) == 70_272
    assert m.bytes_per_token("fp8") == 35_136


def test_unknown_model_lists_valid_ones():
    with pytest.raises(UserError) as e:
        find_model("llama-9000")
    assert "unknown model 'llama-9000'" in str(e.value)
    assert "llama3.1-70b" in str(e.value) and "deepseek-v3" in str(e.value)


def test_models_from_config_join_the_table():
    extra = {"tiny": {"layers": 2, "kv_heads": 2, "head_dim": 64},
             "tiny-mla": {"layers": 3, "attention": "mla", "kv_lora_rank": 128, "rope_dim": 32}}
    assert find_model("tiny", extra).bytes_per_token("bf16") == 2 * 2 * 2 * 64 * 2
    assert find_model("tiny-mla", extra).bytes_per_token("bf16") == 3 * 160 * 2


@pytest.mark.parametrize("spec,msg", [
    ({"layers": 2, "kv_heads": 2}, "head_dim must be a positive integer"),
    ({"layers": 2, "kv_heads": 2, "head_dim": 64, "colour": 1}, "unknown key 'colour'"),
    ({"layers": 0, "kv_heads": 2, "head_dim": 64}, "layers must be a positive integer"),
    ("big", "must be a mapping"),
])
def test_bad_config_models_are_named(spec, msg):
    with pytest.raises(UserError, match=msg):
        find_model("x", {"x": spec})
