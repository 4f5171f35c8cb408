"""Model configs: the shipped Hugging Face files, key errors, the head_dim rule and the layer pairs."""

import json
from pathlib import Path

import pytest

from ficco.features import get_hardware
from ficco.features.model_config import (
    ModelConfig,
    config_paths,
    layer_pairs,
    load_model_config,
    load_model_configs,
)

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


def test_layer_pairs_vllm_layout_replicates_kv_heads_when_fewer_than_ranks():
    config = load_model_config(CONFIGS / "Qwen3-30B-A3B.json")  # 32 query heads, 4 KV heads
    qkv = layer_pairs(config, tp=8, tokens=8192, hardware=get_hardware("h200x8"), kv_layout="vllm")[0]
    assert qkv.scenario.n == (32 // 8 + 2 * 1) * 128


def test_layer_pairs_megatron_layout_is_default_and_refuses_fewer_kv_heads_than_ranks():
    config = load_model_config(CONFIGS / "Qwen3-30B-A3B.json")
    with pytest.raises(ValueError, match=r"num_key_value_heads=4 must be a multiple of tp=8 .*'megatron'"):
        layer_pairs(config, tp=8, tokens=8192, hardware=get_hardware("h200x8"))


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


# Complete config.json files: tests/features/configs holds real ones (their sources in its README.md);
# configs/from_memory the families no real file was found for, written from memory of the published files.
HF = Path(__file__).resolve().parent / "configs"
MEMORY = "from_memory/"
H8 = get_hardware("h200x8")
REAL_TYPES = {"llama", "mistral", "qwen2", "qwen3", "phi3", "deepseek_v3", "gpt_oss"}


def _shapes(name: str, tp: int = 8, tokens: int = 8192, **kw) -> dict[str, tuple]:
    pairs = layer_pairs(load_model_config(HF / name), tp=tp, tokens=tokens, hardware=H8, **kw)
    return {p.name: (p.scenario.op, p.scenario.m, p.scenario.n, p.scenario.k, p.layers) for p in pairs}


def test_every_real_config_is_read_by_its_model_type():
    assert {c.model_type for c in load_model_configs(HF)} == REAL_TYPES


def test_every_family_has_a_complete_config():
    types = {c.model_type for c in load_model_configs(HF)} | {
        c.model_type for c in load_model_configs(HF / MEMORY)
    }
    assert types >= {
        "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma2", "gemma3_text",
        "phi3", "cohere", "internlm2", "deepseek_v2", "deepseek_v3", "gpt_oss", "granite", "olmo2",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("name", "tp", "expected"),
    [
        # 32 heads, 8 KV heads of 4096 / 32 = 128; MLP 14336. tp=8: a rank holds 4 query + 1 KV heads.
        (
            "Meta-Llama-3.1-8B-Instruct.json",
            8,
            {"qkv": (4 + 2) * 128, "attn_out": 4 * 128, "mlp_up": 2 * 14336 // 8, "mlp_down": 14336 // 8},
        ),
        # The same dimensions, in a file saved with every PretrainedConfig default (torchscript, ...).
        (
            "Mistral-7B-Instruct-v0.3.json",
            8,
            {"qkv": (4 + 2) * 128, "attn_out": 4 * 128, "mlp_up": 2 * 14336 // 8, "mlp_down": 14336 // 8},
        ),
        # 28 heads, 4 KV heads of 3584 / 28 = 128; MLP 18944. tp=4: 7 query + 1 KV heads.
        (
            "Qwen2.5-7B-Instruct.json",
            4,
            {"qkv": (7 + 2) * 128, "attn_out": 7 * 128, "mlp_up": 2 * 18944 // 4, "mlp_down": 18944 // 4},
        ),
        # 32 heads, 8 KV heads, no head_dim key: 4096 / 32 = 128; MLP 12288. tp=8: 4 + 1 heads.
        (
            "Qwen3-8B.json",
            8,
            {"qkv": (4 + 2) * 128, "attn_out": 4 * 128, "mlp_up": 2 * 12288 // 8, "mlp_down": 12288 // 8},
        ),
        # model_type phi3: 40 heads, 10 KV heads of 5120 / 40 = 128; MLP 17920. tp=2: 20 + 5 heads.
        (
            "phi-4.json",
            2,
            {"qkv": (20 + 2 * 5) * 128, "attn_out": 20 * 128, "mlp_up": 17920, "mlp_down": 17920 // 2},
        ),
    ],
)
def test_real_dense_configs_give_hand_computed_shapes(name, tp, expected):
    shapes = _shapes(name, tp=tp)
    got = {pair: shape[2] if shape[0] == "ag_gemm" else shape[3] for pair, shape in shapes.items()}
    assert got == expected  # n of the all-gathered GEMMs, k of the reduce-scattered ones
    assert all(shape[1] == 8192 for shape in shapes.values())


def test_gpt_oss_120b_every_layer_is_moe_with_expert_width_from_intermediate_size():
    # 64 heads, 8 KV heads, head_dim 64 (not 2880 / 64); 128 experts, 4 per token (experts_per_token), each
    # 2880 wide (intermediate_size: gpt-oss has no moe_intermediate_size); 36 layers, none dense.
    assert _shapes("gpt-oss-120b.json") == {
        "qkv": ("ag_gemm", 8192, (8 + 2 * 1) * 64, 2880, 36),
        "attn_out": ("gemm_rs", 8192, 2880, 8 * 64, 36),
        "moe_dispatch": ("a2a_gemm", 8192 // 8, 2 * 2880, 2880, 36),
        "moe_combine": ("gemm_a2a", 8192 // 8, 2880, 2880, 36),
    }
    c = load_model_config(HF / "gpt-oss-120b.json")
    assert (c.num_experts, c.num_experts_per_tok, c.dense_layers) == (128, 4, 0)


def test_unsupported_real_config_names_its_model_type_and_what_ficco_would_need():
    with pytest.raises(
        ValueError, match=r"model_type 'olmo3', which ficco does not read.*would need: hidden_size"
    ):
        load_model_config(HF / "unsupported" / "Olmo-3.1-32B-Instruct.json")


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("pruned_heads", {"0": [1, 2]}, "pruned attention heads"),
        ("add_cross_attention", True, "cross-attention adds projections"),
        ("is_encoder_decoder", True, "encoder-decoder"),
    ],
)
def test_base_class_keys_that_change_a_layer_must_keep_their_default(key, value, why):
    data = json.loads((HF / "Mistral-7B-Instruct-v0.3.json").read_text())
    ModelConfig.from_hf_dict("m", data)  # the file holds them all, at their defaults
    with pytest.raises(ValueError, match=rf"key '{key}' must be .* \(or absent\); got .*{why}"):
        ModelConfig.from_hf_dict("m", {**data, key: value})


def test_a_folder_holding_config_json_is_one_model_named_by_the_folder():
    assert config_paths(HF / "DeepSeek-V3") == [HF / "DeepSeek-V3" / "config.json"]
    assert load_model_config(HF / "DeepSeek-V3").name == "DeepSeek-V3"
    assert HF / "DeepSeek-V3" / "config.json" in config_paths(HF)


def test_deepseek_v3_mla_shared_expert_and_dense_first_layers():
    # q_lora 1536 + kv_lora 512 + rope 64 = 2112 (replicated down projections); attn out 128/8 heads * v 128;
    # first_k_dense_replace=3 dense layers of 18432; 58 MoE layers with one shared expert of 2048.
    assert _shapes("DeepSeek-V3") == {
        "qkv": ("ag_gemm", 8192, 2112, 7168, 61),
        "attn_out": ("gemm_rs", 8192, 7168, 2048, 61),
        "mlp_up": ("ag_gemm", 8192, 2 * 18432 // 8, 7168, 3),
        "mlp_down": ("gemm_rs", 8192, 7168, 18432 // 8, 3),
        "moe_dispatch": ("a2a_gemm", 1024, 4096, 7168, 58),
        "moe_combine": ("gemm_a2a", 1024, 7168, 2048, 58),
        "shared_up": ("ag_gemm", 8192, 2 * 2048 // 8, 7168, 58),
        "shared_down": ("gemm_rs", 8192, 7168, 2048 // 8, 58),
    }


def test_deepseek_v2_lite_without_q_lora_projects_the_query_directly():
    # 16/8 heads * (nope 128 + rope 64) = 384, + kv_lora 512 + rope 64 = 960; 2 shared experts of 1408.
    shapes = _shapes(MEMORY + "DeepSeek-V2-Lite.json")
    assert shapes["qkv"][2] == 960
    assert shapes["shared_up"][2] == 2 * 2 * 1408 // 8
    assert shapes["mlp_up"][4] == 1 and shapes["moe_dispatch"][4] == 26


def test_cohere_parallel_block_is_one_pair_each_way():
    # 64 heads, 64 KV heads at tp=8: QKV (8 + 16) * 128 = 3072, + gate/up 2 * 22528 / 8 = 5632.
    assert _shapes(MEMORY + "c4ai-command-r-v01.json") == {
        "qkv_mlp_up": ("ag_gemm", 8192, 3072 + 5632, 8192, 40),
        "attn_mlp_out": ("gemm_rs", 8192, 8192, 1024 + 2816, 40),
    }


def test_plain_mlp_has_half_the_up_width_of_a_gated_one():
    plain = load_model_config(HF / MEMORY / "starcoder2-15b.json")
    assert not plain.gated_mlp
    shapes = _shapes(MEMORY + "starcoder2-15b.json", tp=4)
    assert shapes["mlp_up"][2] == 24576 // 4 == shapes["mlp_down"][3]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("gpt-oss-120b.json", (128, 4, 2880, 0, 0)),  # experts_per_token; expert width = intermediate_size
        (MEMORY + "Qwen1.5-MoE-A2.7B.json", (60, 4, 1408, 5632, 0)),  # shared_expert_intermediate_size
        (MEMORY + "Qwen3-235B-A22B.json", (128, 8, 1536, 0, 0)),
        (MEMORY + "Mixtral-8x7B-Instruct-v0.1.json", (8, 2, 14336, 0, 0)),
    ],
)
def test_moe_families_read_their_own_keys(name, expected):
    c = load_model_config(HF / name)
    got = (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size, c.shared_intermediate_size)
    assert (*got, c.dense_layers) == expected


def test_gemma3_reads_the_language_model_of_the_multimodal_config():
    c = load_model_config(HF / MEMORY / "gemma-3-27b-it.json")
    assert (c.model_type, c.hidden_size, c.head_dim, c.num_hidden_layers) == ("gemma3_text", 5376, 128, 62)


def test_qwen_sparse_step_and_mlp_only_layers_count_dense_layers():
    data = json.loads((HF / MEMORY / "Qwen3-235B-A22B.json").read_text())
    c = ModelConfig.from_hf_dict("q", {**data, "decoder_sparse_step": 2, "mlp_only_layers": [1, 2]})
    assert c.dense_layers == 94 - (47 - 1)  # layers 1, 3, 5, ... are MoE; layer 1 is listed dense


def test_unknown_model_type_names_what_ficco_would_need():
    data = json.loads((HF / "Meta-Llama-3.1-8B-Instruct.json").read_text())
    with pytest.raises(ValueError, match=r"model_type 'falcon'.*ficco would need: hidden_size.*gated"):
        ModelConfig.from_hf_dict("f", {**data, "model_type": "falcon"})


def test_a_key_is_ignored_per_family_not_globally():
    # Granite's multipliers do not change shapes of a Granite layer, but mean nothing to a Llama one.
    data = json.loads((HF / "Meta-Llama-3.1-8B-Instruct.json").read_text())
    with pytest.raises(
        ValueError, match=r"unknown key\(s\) \['residual_multiplier'\] for model_type 'llama'"
    ):
        ModelConfig.from_hf_dict("l", {**data, "residual_multiplier": 0.22})
    # RMSNorm's epsilon is a Llama key; StarCoder2's norm names its own (norm_epsilon).
    starcoder = json.loads((HF / MEMORY / "starcoder2-15b.json").read_text())
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['rms_norm_eps'\] for model_type 'starcoder2'"):
        ModelConfig.from_hf_dict("s", {**starcoder, "rms_norm_eps": 1e-5})


def test_mla_config_missing_a_head_dim_names_it():
    data = json.loads((HF / "DeepSeek-V3" / "config.json").read_text())
    del data["v_head_dim"]
    with pytest.raises(ValueError, match="missing the required key 'v_head_dim'"):
        ModelConfig.from_hf_dict("d", data)


def test_bad_kv_layout_names_the_allowed_values():
    with pytest.raises(ValueError, match=r"kv_layout must be one of \['megatron', 'vllm'\]; got 'tgi'"):
        _shapes("Meta-Llama-3.1-8B-Instruct.json", kv_layout="tgi")


@pytest.mark.parametrize("model_type", [None, "", 5])
def test_config_without_model_type_is_refused_with_that_reason(model_type):
    data = {k: v for k, v in LLAMA_8B.items() if k != "model_type"}
    if model_type is not None:
        data["model_type"] = model_type
    with pytest.raises(ValueError, match=r"model config 'x' has no 'model_type'.*one of \[.*'llama'"):
        ModelConfig.from_hf_dict("x", data)


def test_a_quantized_config_gets_a_note_naming_its_format_and_the_dtype_scored():
    from ficco.features.model_config import quantization_note

    deepseek = json.loads((HF / "DeepSeek-V3" / "config.json").read_text())
    note = quantization_note(deepseek, "fp16")
    assert "(fp8: fmt=e4m3, weight_block_size=[128, 128], activation_scheme=dynamic)" in note
    assert "scored as fp16" in note and "bf16/fp16/fp32" in note
    assert "(mxfp4)" in quantization_note(json.loads((HF / "gpt-oss-120b.json").read_text()), "bf16")
    inner = {
        "model_type": "gemma3",
        "text_config": {"quantization_config": {"quant_method": "awq", "bits": 4}},
    }
    assert "(awq: bits=4)" in quantization_note(inner, "bf16")
    for plain in ({"model_type": "llama"}, {"quantization_config": {}}, None):
        assert quantization_note(plain, "bf16") is None
