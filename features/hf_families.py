"""How each Hugging Face ``model_type`` is read: which keys give the layer shapes, which it ignores, and
the layer's structure (gated MLP, MoE keys, latent attention, parallel attention+MLP block).

One ``Family`` per architecture. A key a family does not list is refused (ficco cannot tell whether it
changes the shapes); keys every ``PretrainedConfig`` writes (token ids, dtype, ...) are in ``COMMON_KEYS``.
"""

from __future__ import annotations

from dataclasses import dataclass

COMMON_KEYS: frozenset[str] = frozenset(
    {
        "_name_or_path", "architectures", "model_type", "transformers_version", "torch_dtype", "dtype",
        "auto_map", "vocab_size", "max_position_embeddings", "bos_token_id", "eos_token_id", "pad_token_id",
        "tie_word_embeddings", "use_cache", "initializer_range", "rope_theta", "rope_scaling",
        "rope_parameters", "attention_dropout", "hidden_act", "rms_norm_eps", "quantization_config",
        "attn_implementation", "_attn_implementation_autoset", "output_attentions", "output_hidden_states",
        "return_dict", "use_return_dict",
    }
)  # fmt: skip
"""Keys of ``transformers.PretrainedConfig`` itself and of every decoder (metadata, positional encoding,
norm epsilon, dropout): none changes a GEMM or collective shape. ``quantization_config`` is ignored
because the request's ``dtype`` gives the element type."""

DENSE_KEYS = frozenset(
    {"hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers"}
)
"""Shape keys every family reads."""

_SLIDING = frozenset({"sliding_window", "use_sliding_window", "max_window_layers", "layer_types"})
"""Local/global attention keys: they change the attention kernel, not the projections."""


@dataclass(frozen=True, slots=True)
class Family:
    """How one ``model_type`` is read."""

    model_types: tuple[str, ...]
    """``model_type`` values read this way."""
    ignored: frozenset[str] = frozenset()
    """Family keys that do not change a layer shape (beyond ``COMMON_KEYS``)."""
    shape_keys: frozenset[str] = frozenset({"head_dim"})
    """Shape keys beyond ``DENSE_KEYS`` that the reader uses."""
    gated_mlp: bool = True
    """Gate + up projections (SwiGLU/GeGLU: the up GEMM is 2x the MLP width) or one up projection."""
    expert_key: str = ""
    """Key of the routed-expert count ("" for dense families)."""
    top_k_key: str = "num_experts_per_tok"
    """Key of the experts per token."""
    parallel_block: bool = False
    """Attention and MLP read the same input and their outputs are summed (Cohere): one pair each way."""
    mla: bool = False
    """Multi-head latent attention (DeepSeek-V2/V3)."""

    @property
    def keys(self) -> frozenset[str]:
        """Every key this family reads or ignores."""
        return COMMON_KEYS | DENSE_KEYS | self.shape_keys | self.ignored | {self.expert_key, self.top_k_key}


_MOE_ROUTER = frozenset(
    {"router_aux_loss_coef", "router_jitter_noise", "output_router_logits", "norm_topk_prob"}
)
_QWEN_MOE_SHAPES = frozenset(
    {"head_dim", "moe_intermediate_size", "decoder_sparse_step", "mlp_only_layers", "num_experts_per_tok"}
)
_DEEPSEEK_SHAPES = frozenset(
    {
        "moe_intermediate_size", "n_shared_experts", "first_k_dense_replace", "moe_layer_freq",
        "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
    }
)  # fmt: skip
_DEEPSEEK_IGNORED = frozenset(
    {
        "routed_scaling_factor", "scoring_func", "topk_method", "n_group", "topk_group", "norm_topk_prob",
        "aux_loss_alpha", "seq_aux", "ep_size", "num_nextn_predict_layers", "attention_bias",
        "pretraining_tp",
    }
)  # fmt: skip

_GEMMA = frozenset(
    {
        "hidden_activation", "query_pre_attn_scalar", "final_logit_softcapping", "attn_logit_softcapping",
        "cache_implementation", "attention_bias", "rope_local_base_freq", "sliding_window_pattern",
    }
)  # fmt: skip

FAMILIES: tuple[Family, ...] = (
    Family(("llama",), frozenset({"attention_bias", "mlp_bias", "pretraining_tp"})),
    Family(("mistral",), _SLIDING),
    Family(("mixtral",), _SLIDING | _MOE_ROUTER, expert_key="num_local_experts"),
    Family(("qwen2",), _SLIDING | {"use_mrope"}),
    Family(
        ("qwen2_moe",),
        _SLIDING | _MOE_ROUTER | {"qkv_bias"},
        _QWEN_MOE_SHAPES | {"shared_expert_intermediate_size"},
        expert_key="num_experts",
    ),
    Family(("qwen3",), _SLIDING | {"attention_bias"}),
    Family(
        ("qwen3_moe",),
        _SLIDING | _MOE_ROUTER | {"attention_bias"},
        _QWEN_MOE_SHAPES,
        expert_key="num_experts",
    ),
    Family(("gemma2", "gemma3_text"), _SLIDING | _GEMMA),
    Family(
        ("phi3",),
        _SLIDING | {"resid_pdrop", "embd_pdrop", "original_max_position_embeddings", "partial_rotary_factor"},
    ),
    Family(
        ("cohere",), {"logit_scale", "use_qk_norm", "layer_norm_eps", "attention_bias"}, parallel_block=True
    ),
    Family(("internlm2",), {"bias"}),
    Family(
        ("deepseek_v2", "deepseek_v3"),
        _DEEPSEEK_IGNORED,
        _DEEPSEEK_SHAPES,
        expert_key="n_routed_experts",
        mla=True,
    ),
    Family(
        ("gpt_oss",),
        _SLIDING
        | _MOE_ROUTER
        | {"swiglu_limit", "initial_context_length", "attention_bias", "num_experts_per_tok"},
        expert_key="num_local_experts",
        top_k_key="experts_per_token",
    ),
    Family(
        ("granite",),
        {"embedding_multiplier", "logits_scaling", "residual_multiplier", "attention_multiplier"}
        | {"attention_bias", "mlp_bias"},
    ),
    Family(("olmo2",), {"attention_bias"}),
    Family(
        ("starcoder2",),
        _SLIDING | {"use_bias", "norm_epsilon", "residual_dropout", "embedding_dropout"},
        gated_mlp=False,
    ),
)
"""The families ficco reads; ``starcoder2`` is the plain (non-gated) MLP case."""

BY_MODEL_TYPE: dict[str, Family] = {t: f for f in FAMILIES for t in f.model_types}

MULTIMODAL_TEXT = {"gemma3": "text_config"}
"""Multimodal ``model_type`` -> the key holding the language model's config (the vision tower has no
tensor-parallel collectives ficco scores)."""

NEEDED = (
    "hidden_size, intermediate_size, num_attention_heads, num_key_value_heads, head_dim (if not "
    "hidden_size / num_attention_heads), num_hidden_layers, whether the MLP is gated, and for MoE the expert "
    "count, experts per token, expert width, shared experts and which layers are dense"
)
"""What ficco needs to know about an architecture it does not read (the unknown-model_type error)."""
