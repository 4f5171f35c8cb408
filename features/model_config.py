"""Model configs (Hugging Face ``config.json``) and the communication + GEMM pairs of one layer.

A transformer layer under tensor parallelism of degree ``tp`` with sequence parallelism (Megatron-LM,
PyTorch async-TP) runs four pairs per layer, one collective beside one GEMM each::

    qkv        ag_gemm   m = tokens, k = hidden,            n = (heads/tp + 2 * kv_local) * head_dim
    attn_out   gemm_rs   m = tokens, k = heads*head_dim/tp, n = hidden
    mlp_up     ag_gemm   m = tokens, k = hidden,            n = 2 * intermediate / tp   (gate + up fused)
    mlp_down   gemm_rs   m = tokens, k = intermediate / tp, n = hidden

``kv_local`` is ``num_key_value_heads / tp``, or 1 when there are fewer KV heads than ranks (each rank
then holds a replica of one KV head, as Megatron-LM and vLLM do). In an MoE layer the MLP pairs become
expert-parallel all-to-alls over the same ``tp`` ranks, with ``m = tokens / tp`` tokens per rank::

    moe_dispatch  a2a_gemm  k = hidden,          n = 2 * moe_intermediate   (gate + up of one expert)
    moe_combine   gemm_a2a  k = moe_intermediate, n = hidden

``head_dim`` rule: the config's ``head_dim`` when present and not null (Gemma-2, Qwen3: it need not be
``hidden / heads``), otherwise ``hidden_size / num_attention_heads`` (Llama, Mistral, Qwen2.5, Phi-3).
``num_key_value_heads`` defaults to ``num_attention_heads`` (the Hugging Face convention for plain
multi-head attention).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ficco.features.hardware import HardwareProfile, get_hardware
from ficco.features.scenario import Scenario

_SHAPE_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "num_hidden_layers",
    "num_experts_per_tok",
    "moe_intermediate_size",
)
_EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
"""Keys different model families use for the number of routed experts (Mixtral, Qwen-MoE, DeepSeek)."""

_UNSUPPORTED_KEYS: dict[str, object] = {
    "n_shared_experts": 0,
    "shared_expert_intermediate_size": 0,
    "q_lora_rank": None,
    "kv_lora_rank": None,
    "first_k_dense_replace": 0,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "moe_layer_freq": 1,
}
"""Keys that change the layer's GEMM shapes in ways ficco does not model, with the one value accepted
(shared experts, multi-head latent attention, dense layers mixed into an MoE stack)."""

IGNORED_HF_KEYS: frozenset[str] = frozenset(
    {
        "_name_or_path", "architectures", "model_type", "transformers_version", "torch_dtype", "dtype",
        "auto_map", "vocab_size", "max_position_embeddings", "original_max_position_embeddings",
        "max_window_layers", "rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor",
        "rms_norm_eps", "layer_norm_eps", "hidden_act", "hidden_activation", "initializer_range",
        "use_cache", "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id",
        "attention_dropout", "attention_bias", "mlp_bias", "resid_pdrop", "embd_pdrop", "pretraining_tp",
        "sliding_window", "use_sliding_window", "attn_logit_softcapping", "final_logit_softcapping",
        "query_pre_attn_scalar", "cache_implementation", "router_aux_loss_coef", "router_jitter_noise",
        "output_router_logits", "norm_topk_prob", "qkv_bias", "use_qk_norm",
    }
)  # fmt: skip
"""Hugging Face keys that do not change any GEMM or collective shape (read and ignored)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelConfig:
    """The shape-relevant facts of one decoder-only transformer (all sizes are full, not per rank)."""

    name: str = "model"
    """Family name, used as the dataset's ``family`` column (the config file's stem)."""
    hidden_size: int = 4096
    """Model width (residual stream features)."""
    intermediate_size: int = 14336
    """Dense MLP width (per expert for Mixtral-style MoE without ``moe_intermediate_size``)."""
    num_attention_heads: int = 32
    """Query heads."""
    num_key_value_heads: int = 8
    """Key/value heads (grouped-query attention); equal to the query heads for multi-head attention."""
    head_dim: int = 128
    """Features per head (see the module docstring for the rule when the config has none)."""
    num_hidden_layers: int = 32
    """Transformer layers."""
    num_experts: int = 0
    """Routed experts per MoE layer; 0 for a dense model."""
    num_experts_per_tok: int = 0
    """Experts each token is routed to (top-k); 0 for a dense model."""
    moe_intermediate_size: int = 0
    """Width of one expert's MLP; 0 for a dense model."""

    def __post_init__(self) -> None:
        dims = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim")
        for name in (*dims, "num_hidden_layers"):
            _check_positive_int(f"ModelConfig.{name}", getattr(self, name))
        for name in ("num_experts", "num_experts_per_tok", "moe_intermediate_size"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
                raise ValueError(f"ModelConfig.{name} must be an int >= 0; got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                "ModelConfig.num_key_value_heads must divide "
                f"num_attention_heads={self.num_attention_heads}; got {self.num_key_value_heads}"
            )
        if self.is_moe and not (
            1 <= self.num_experts_per_tok <= self.num_experts and self.moe_intermediate_size
        ):
            raise ValueError(
                f"ModelConfig {self.name!r} has num_experts={self.num_experts}: num_experts_per_tok must "
                f"be in [1, {self.num_experts}] and moe_intermediate_size > 0; got "
                f"{self.num_experts_per_tok} and {self.moe_intermediate_size}"
            )

    @property
    def is_moe(self) -> bool:
        """True when the MLP of every layer is a routed mixture of experts."""
        return self.num_experts > 0

    @classmethod
    def from_hf_dict(cls, name: str, data: dict[str, Any]) -> ModelConfig:
        """Read a parsed Hugging Face ``config.json``; raise ``ValueError`` naming a missing, bad or
        unknown key (and ``name``)."""
        if not isinstance(data, dict):
            raise ValueError(f"model config {name!r} must be a JSON object; got {type(data).__name__}")
        known = set(_SHAPE_KEYS) | set(_EXPERT_COUNT_KEYS) | set(_UNSUPPORTED_KEYS) | IGNORED_HF_KEYS
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"model config {name!r} has unknown key(s) {unknown}: ficco cannot tell whether they change "
                "the layer shapes. If they do not, add them to features.model_config.IGNORED_HF_KEYS"
            )
        for key, accepted in _UNSUPPORTED_KEYS.items():
            if key in data and data[key] not in (accepted, None):
                raise ValueError(
                    f"model config {name!r}: key {key!r}={data[key]!r} is not supported (ficco models "
                    f"uniform layers without shared experts or latent attention); only {accepted!r} or null"
                )

        def get(key: str, default: Any = _REQUIRED) -> int:
            value = data.get(key)
            if value is None:
                if default is _REQUIRED:
                    raise ValueError(f"model config {name!r} is missing the required key {key!r}")
                return default
            _check_positive_int(f"model config {name!r} key {key!r}", value)
            return value

        heads = get("num_attention_heads")
        hidden = get("hidden_size")
        head_dim = get("head_dim", 0)
        if not head_dim:
            if hidden % heads:
                raise ValueError(
                    f"model config {name!r} has no 'head_dim' and hidden_size={hidden} is not divisible by "
                    f"num_attention_heads={heads}; add 'head_dim'"
                )
            head_dim = hidden // heads
        experts = _expert_count(name, data)
        intermediate = get("intermediate_size")
        return cls(
            name=name,
            hidden_size=hidden,
            intermediate_size=intermediate,
            num_attention_heads=heads,
            num_key_value_heads=get("num_key_value_heads", heads),
            head_dim=head_dim,
            num_hidden_layers=get("num_hidden_layers"),
            num_experts=experts,
            num_experts_per_tok=get("num_experts_per_tok") if experts else 0,
            moe_intermediate_size=get("moe_intermediate_size", intermediate) if experts else 0,
        )


_REQUIRED = object()


def _check_positive_int(what: str, value: Any) -> None:
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        raise ValueError(f"{what} must be a positive int; got {value!r}")


def _expert_count(name: str, data: dict[str, Any]) -> int:
    """The routed-expert count under whichever key the family uses (0 if none); the keys must agree."""
    found = {key: data[key] for key in _EXPERT_COUNT_KEYS if data.get(key) not in (None, 0)}
    for key, value in found.items():
        _check_positive_int(f"model config {name!r} key {key!r}", value)
    if len(set(found.values())) > 1:
        raise ValueError(f"model config {name!r} gives different expert counts: {found}")
    return next(iter(found.values()), 0)


def load_model_config(path: str | Path) -> ModelConfig:
    """Load one Hugging Face ``config.json``; the family name is the file's stem.

    Raises ``ValueError`` naming the file for unreadable JSON and for missing, bad or unknown keys.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot read model config {path}: {err}") from None
    try:
        return ModelConfig.from_hf_dict(path.stem, data)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


def load_model_configs(directory: str | Path) -> list[ModelConfig]:
    """Every ``*.json`` config in ``directory``, sorted by name; raise ``ValueError`` if there is none."""
    paths = sorted(Path(directory).glob("*.json"))
    if not paths:
        raise ValueError(f"no model configs (*.json) in {directory}")
    return [load_model_config(p) for p in paths]


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerPair:
    """One communication + GEMM pair of a transformer layer."""

    name: str = "qkv"
    """``qkv``, ``attn_out``, ``mlp_up``, ``mlp_down``, ``moe_dispatch`` or ``moe_combine``."""
    scenario: Scenario = field(default_factory=Scenario)
    """The pair's shapes on one rank."""
    per_layer: int = 1
    """How many times this pair runs in one transformer layer (forward)."""


def layer_pairs(
    config: ModelConfig,
    *,
    tp: int,
    tokens: int,
    dtype: str = "bf16",
    hardware: HardwareProfile | None = None,
) -> list[LayerPair]:
    """The pairs of one forward layer of ``config`` at tensor-parallel degree ``tp`` over ``tokens`` tokens.

    Shapes follow the module docstring; ``hardware`` defaults to ``h200x2``. Raises ``ValueError`` naming
    the model, the field and the divisibility rule when the model cannot be split ``tp`` ways.
    """
    hardware = hardware or get_hardware("h200x2")
    c = config
    if not (isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 1 and tokens % tp == 0):
        raise ValueError(f"tokens must be a positive multiple of tp={tp}; got {tokens!r}")
    if c.num_attention_heads % tp:
        raise ValueError(f"{c.name}: num_attention_heads={c.num_attention_heads} is not divisible by tp={tp}")
    if c.num_key_value_heads % tp and tp % c.num_key_value_heads:
        raise ValueError(
            f"{c.name}: num_key_value_heads={c.num_key_value_heads} must divide or be a multiple of tp={tp}"
        )
    kv_local = max(1, c.num_key_value_heads // tp)

    def pair(name: str, op: str, m: int, n: int, k: int, **moe: Any) -> LayerPair:
        try:
            scenario = Scenario(op=op, m=m, n=n, k=k, dtype=dtype, world_size=tp, hardware=hardware, **moe)
        except ValueError as err:
            raise ValueError(f"{c.name} {name} at tp={tp}, tokens={tokens}: {err}") from None
        return LayerPair(name=name, scenario=scenario)

    out = [
        pair(
            "qkv", "ag_gemm", tokens, (c.num_attention_heads // tp + 2 * kv_local) * c.head_dim, c.hidden_size
        ),
        pair("attn_out", "gemm_rs", tokens, c.hidden_size, c.num_attention_heads * c.head_dim // tp),
    ]
    if c.is_moe:
        moe = {"experts": c.num_experts, "top_k": c.num_experts_per_tok}
        out += [
            pair("moe_dispatch", "a2a_gemm", tokens // tp, 2 * c.moe_intermediate_size, c.hidden_size, **moe),
            pair("moe_combine", "gemm_a2a", tokens // tp, c.hidden_size, c.moe_intermediate_size, **moe),
        ]
    else:
        if c.intermediate_size % tp:
            raise ValueError(f"{c.name}: intermediate_size={c.intermediate_size} is not divisible by tp={tp}")
        local = c.intermediate_size // tp
        out += [
            pair("mlp_up", "ag_gemm", tokens, 2 * local, c.hidden_size),
            pair("mlp_down", "gemm_rs", tokens, c.hidden_size, local),
        ]
    return out


__all__ = [
    "IGNORED_HF_KEYS",
    "LayerPair",
    "ModelConfig",
    "layer_pairs",
    "load_model_config",
    "load_model_configs",
]
