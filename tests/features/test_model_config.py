"""Model configs: the shipped Hugging Face files, key errors, the head_dim rule and the layer pairs."""

import json
from pathlib import Path

import pytest
from ficco.features import get_hardware
from ficco.features.model_config import ModelConfig, layer_pairs, load_model_config, load_model_configs

CONFIGS = Path(__file__).resolve().parents[2] / "datasets" / "model_configs"
LLAMA_8B = json.loads((CONFIGS / "Llama-3.1-8B.json").read_text())


def test_load_shipped_configs_has_ten_dense_and_moe_families():
    configs = load_model_configs(CONFIGS)
    assert len(configs) >= 10
    assert sum(c.is_moe for c in configs) >= 2
    assert [c.name for c in configs] == sorted(c.name for c in configs)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("Llama-3.1-8B", (4096, 14336, 32, 8, 128, 32, 0, 0, 0)),
        ("Llama-3.1-70B", (8192, 28672, 64, 8, 128, 80, 0, 0, 0)),
        ("Gemma-2-27B", (4608, 36864, 32, 16, 128, 46, 0, 0, 0)),  # head_dim given, not 4608 / 32
        ("Phi-3-medium-4k", (5120, 17920, 40, 10, 128, 40, 0, 0, 0)),  # no head_dim: 5120 / 40
        ("Mixtral-8x7B-v0.1", (4096, 14336, 32, 8, 128, 32, 8, 2, 14336)),  # experts from num_local_experts
        ("Qwen3-30B-A3B", (2048, 6144, 32, 4, 128, 48, 128, 8, 768)),  # num_experts, moe_intermediate_size
    ],
)
def test_load_model_config_reads_model_card_facts(name, expected):
    c = load_model_config(CONFIGS / f"{name}.json")
    got = (
        c.hidden_size,
        c.intermediate_size,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.head_dim,
        c.num_hidden_layers,
        c.num_experts,
        c.num_experts_per_tok,
        c.moe_intermediate_size,
    )
    assert got == expected
    assert c.name == name


def test_from_hf_dict_defaults_kv_heads_to_query_heads():
    data = {k: v for k, v in LLAMA_8B.items() if k != "num_key_value_heads"}
    assert ModelConfig.from_hf_dict("mha", data).num_key_value_heads == 32


def test_load_model_config_missing_key_names_key_and_file(tmp_path):
    path = tmp_path / "NoHidden.json"
    path.write_text(json.dumps({k: v for k, v in LLAMA_8B.items() if k != "hidden_size"}))
    with pytest.raises(ValueError, match=r"NoHidden\.json.*missing the required key 'hidden_size'"):
        load_model_config(path)


def test_from_hf_dict_unknown_key_is_named():
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['q_proj_rank'\]"):
        ModelConfig.from_hf_dict("x", {**LLAMA_8B, "q_proj_rank": 64})


@pytest.mark.parametrize("value", ["4096", 0, -8, 4096.0, True])
def test_from_hf_dict_bad_value_names_key(value):
    with pytest.raises(ValueError, match=r"key 'hidden_size' must be a positive int; got"):
        ModelConfig.from_hf_dict("x", {**LLAMA_8B, "hidden_size": value})


def test_from_hf_dict_unsupported_shared_experts_rejected():
    with pytest.raises(ValueError, match=r"'n_shared_experts'=2 is not supported"):
        ModelConfig.from_hf_dict(
            "x", {**LLAMA_8B, "n_routed_experts": 64, "num_experts_per_tok": 6, "n_shared_experts": 2}
        )


def test_from_hf_dict_disagreeing_expert_counts_rejected():
    with pytest.raises(ValueError, match="different expert counts"):
        ModelConfig.from_hf_dict(
            "x", {**LLAMA_8B, "num_local_experts": 8, "num_experts": 16, "num_experts_per_tok": 2}
        )


def test_from_hf_dict_head_dim_needed_when_hidden_not_divisible():
    with pytest.raises(ValueError, match="has no 'head_dim'"):
        ModelConfig.from_hf_dict("x", {**LLAMA_8B, "num_attention_heads": 3, "num_key_value_heads": 3})


def test_load_model_config_invalid_json_names_file(tmp_path):
    path = tmp_path / "Broken.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match=r"cannot read model config .*Broken\.json"):
        load_model_config(path)


def test_layer_pairs_llama_8b_tp2_matches_hand_computed_shapes():
    # Llama-3.1-8B: hidden 4096, 32 query heads and 8 KV heads of 128, MLP 14336. At tp=2 a rank holds
    # 16 query + 4 KV heads: QKV out (16 + 2 * 4) * 128 = 3072; attention out in 16 * 128 = 2048;
    # MLP gate+up out 2 * 14336 / 2 = 14336; MLP down in 14336 / 2 = 7168.
    pairs = layer_pairs(load_model_config(CONFIGS / "Llama-3.1-8B.json"), tp=2, tokens=8192)
    got = {p.name: (p.scenario.op, p.scenario.m, p.scenario.n, p.scenario.k, p.per_layer) for p in pairs}
    assert got == {
        "qkv": ("ag_gemm", 8192, 3072, 4096, 1),
        "attn_out": ("gemm_rs", 8192, 4096, 2048, 1),
        "mlp_up": ("ag_gemm", 8192, 14336, 4096, 1),
        "mlp_down": ("gemm_rs", 8192, 4096, 7168, 1),
    }
    assert all(p.scenario.world_size == 2 and p.scenario.hardware.id == "h200x2" for p in pairs)


def test_layer_pairs_moe_uses_expert_shapes_and_tokens_per_rank():
    pairs = layer_pairs(load_model_config(CONFIGS / "Qwen3-30B-A3B.json"), tp=2, tokens=4096)
    moe = {p.name: p.scenario for p in pairs if p.scenario.op in ("a2a_gemm", "gemm_a2a")}
    assert set(moe) == {"moe_dispatch", "moe_combine"}
    dispatch, combine = moe["moe_dispatch"], moe["moe_combine"]
    assert (dispatch.m, dispatch.n, dispatch.k, dispatch.experts, dispatch.top_k) == (
        2048,
        1536,
        2048,
        128,
        8,
    )
    assert (combine.m, combine.n, combine.k) == (2048, 2048, 768)


def test_layer_pairs_replicates_kv_heads_when_fewer_than_ranks():
    config = load_model_config(CONFIGS / "Qwen3-30B-A3B.json")  # 32 query heads, 4 KV heads
    qkv = layer_pairs(config, tp=8, tokens=8192, hardware=get_hardware("h200x8"))[0].scenario
    assert qkv.n == (32 // 8 + 2 * 1) * 128


@pytest.mark.parametrize(
    ("name", "kwargs", "message"),
    [
        ("Llama-3.1-8B", {"tp": 2, "tokens": 1001}, "tokens must be a positive multiple of tp=2; got 1001"),
        ("Qwen2.5-7B", {"tp": 8, "tokens": 8192}, "num_attention_heads=28 is not divisible by tp=8"),
        ("Llama-3.1-8B", {"tp": 4, "tokens": 4096}, "world_size must be <= hardware.gpu_count=2"),
    ],
)
def test_layer_pairs_errors_name_model_and_rule(name, kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        layer_pairs(load_model_config(CONFIGS / f"{name}.json"), **kwargs)
