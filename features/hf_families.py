"""How each Hugging Face ``model_type`` is read: which keys give the layer shapes, which it ignores, and
the layer's structure (gated MLP, MoE keys, latent attention, parallel attention+MLP block).

One ``Family`` per architecture; a key no family set lists is refused, and the base-class keys that would
change a layer must keep their default (``BASE_DEFAULTS``). See docs/shapes.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PRETRAINED_CONFIG_KEYS: frozenset[str] = frozenset(
    {
        # metadata
        "_name_or_path", "_commit_hash", "architectures", "model_type", "transformers_version", "auto_map",
        "torch_dtype", "dtype", "use_bfloat16", "quantization_config", "attn_implementation",
        "_attn_implementation", "_attn_implementation_autoset", "tokenizer_class", "prefix",
        "finetuning_task", "problem_type", "task_specific_params", "id2label", "label2id", "num_labels",
        # outputs and export
        "return_dict", "use_return_dict", "output_attentions", "output_hidden_states", "torchscript",
        "tf_legacy_loss", "chunk_size_feed_forward", "is_decoder", "tie_word_embeddings",
        "tie_encoder_decoder", "pruned_heads", "is_encoder_decoder", "add_cross_attention",
        "cross_attention_hidden_size",
        # token ids
        "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
        # generation defaults (older transformers wrote them into config.json)
        "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
        "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
        "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
        "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
        "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
        "suppress_tokens", "begin_suppress_tokens",
    }
)  # fmt: skip
"""``transformers.PretrainedConfig``'s own attributes (``configuration_utils.py``): metadata, output flags,
token ids, generation defaults. ``quantization_config`` does not change the shapes: the request's ``dtype``
gives the element type, and a score says so (``model_config.quantization_note``). The ones that would change
a layer are checked against ``BASE_DEFAULTS``."""

BASE_DEFAULTS: dict[str, tuple[Any, str]] = {
    "pruned_heads": ({}, "pruned attention heads change the attention projections per layer"),
    "add_cross_attention": (False, "cross-attention adds projections to every layer"),
    "is_encoder_decoder": (False, "an encoder-decoder model has encoder layers and cross-attention"),
}
"""Base-class keys that change the layer unless at their default: key -> (default, why)."""

DECODER_KEYS: frozenset[str] = frozenset(
    {
        "vocab_size", "max_position_embeddings", "initializer_range", "use_cache", "rope_theta",
        "rope_scaling", "rope_parameters", "attention_dropout", "hidden_act",
    }
)  # fmt: skip
"""Keys every decoder config class read here defines (embedding size, positional encoding, initialisation,
dropout, activation): none changes a GEMM or collective shape of a layer (the embedding and LM head are not
scored)."""

DENSE_KEYS = frozenset(
    {"hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers"}
)
"""Shape keys every family reads."""

_SLIDING = frozenset({"sliding_window", "use_sliding_window", "max_window_layers", "layer_types"})
"""Local/global attention keys: they change the attention kernel, not the projections."""
_RMS = frozenset({"rms_norm_eps"})
"""RMSNorm's epsilon (Cohere's LayerNorm and StarCoder2's norm name theirs differently)."""


@dataclass(frozen=True, slots=True)
class Family:
    """How one ``model_type`` is read."""

    model_types: tuple[str, ...]
    """``model_type`` values read this way."""
    ignored: frozenset[str] = frozenset()
    """Family keys that do not change a layer shape (beyond ``PRETRAINED_CONFIG_KEYS``, ``DECODER_KEYS``)."""
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
        return (
            PRETRAINED_CONFIG_KEYS
            | DECODER_KEYS
            | DENSE_KEYS
            | self.shape_keys
            | self.ignored
            | {self.expert_key, self.top_k_key}
        )


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
    Family(("llama",), _RMS | {"attention_bias", "mlp_bias", "pretraining_tp"}),
    Family(("mistral",), _RMS | _SLIDING),
    Family(("mixtral",), _RMS | _SLIDING | _MOE_ROUTER, expert_key="num_local_experts"),
    Family(("qwen2",), _RMS | _SLIDING | {"use_mrope"}),
    Family(
        ("qwen2_moe",),
        _RMS | _SLIDING | _MOE_ROUTER | {"qkv_bias"},
        _QWEN_MOE_SHAPES | {"shared_expert_intermediate_size"},
        expert_key="num_experts",
    ),
    Family(("qwen3",), _RMS | _SLIDING | {"attention_bias"}),
    Family(
        ("qwen3_moe",),
        _RMS | _SLIDING | _MOE_ROUTER | {"attention_bias"},
        _QWEN_MOE_SHAPES,
        expert_key="num_experts",
    ),
    Family(("gemma2", "gemma3_text"), _RMS | _SLIDING | _GEMMA),
    Family(
        ("phi3",),
        _RMS
        | _SLIDING
        | {"resid_pdrop", "embd_pdrop", "original_max_position_embeddings", "partial_rotary_factor"}
        | {"attention_bias"},  # phi-4's config.json writes it (false); a bias does not change a GEMM's shape
    ),
    Family(
        ("cohere",), {"logit_scale", "use_qk_norm", "layer_norm_eps", "attention_bias"}, parallel_block=True
    ),
    Family(("internlm2",), _RMS | {"bias"}),
    Family(
        ("deepseek_v2", "deepseek_v3"),
        _RMS | _DEEPSEEK_IGNORED,
        _DEEPSEEK_SHAPES,
        expert_key="n_routed_experts",
        mla=True,
    ),
    Family(
        ("gpt_oss",),
        _RMS
        | _SLIDING
        | _MOE_ROUTER
        | {"swiglu_limit", "initial_context_length", "attention_bias", "num_experts_per_tok"},
        expert_key="num_local_experts",
        top_k_key="experts_per_token",
    ),
    Family(
        ("granite",),
        _RMS
        | {"embedding_multiplier", "logits_scaling", "residual_multiplier", "attention_multiplier"}
        | {"attention_bias", "mlp_bias"},
    ),
    Family(("olmo2",), _RMS | {"attention_bias"}),
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
