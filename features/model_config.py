"""Model configs (Hugging Face ``config.json``, as downloaded) and the communication + GEMM pairs of a layer.

``ModelConfig.from_hf_dict`` reads a config by its ``model_type`` (``features/hf_families.py``), refusing
keys it cannot score; :func:`layer_pairs` gives the pairs of one forward layer at tensor-parallel degree
``tp`` (dense, MoE, shared experts, latent attention, parallel attention+MLP block). See docs/shapes.md.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ficco.features.hardware import DEFAULT_HARDWARE_ID, HardwareProfile, get_hardware
from ficco.features.hf_families import BASE_DEFAULTS, BY_MODEL_TYPE, MULTIMODAL_TEXT, NEEDED, Family
from ficco.features.scenario import DTYPES, Scenario

log = logging.getLogger(__name__)

KvLayout = Literal["megatron", "vllm"]
KV_LAYOUTS: tuple[str, ...] = ("megatron", "vllm")
"""How KV heads split over more ranks than there are heads: refuse (Megatron-LM) or replicate (vLLM)."""
CONFIG_FILE = "config.json"


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelConfig:
    """The shape-relevant facts of one decoder-only transformer (all sizes are full, not per rank)."""

    name: str = "model"
    """Family name, used as the dataset's ``family`` column (the config file's stem)."""
    model_type: str = "llama"
    """The Hugging Face ``model_type`` it was read as."""
    hidden_size: int = 4096
    """Model width (residual stream features)."""
    intermediate_size: int = 14336
    """Dense MLP width (per expert for Mixtral-style MoE without ``moe_intermediate_size``)."""
    num_attention_heads: int = 32
    """Query heads."""
    num_key_value_heads: int = 8
    """Key/value heads (grouped-query attention); equal to the query heads for multi-head attention."""
    head_dim: int = 128
    """Features per head (docs/shapes.md has the rule when the config has none)."""
    num_hidden_layers: int = 32
    gated_mlp: bool = True
    """Gate + up projections (up GEMM of 2x the width) or a single up projection."""
    parallel_block: bool = False
    """Attention and MLP in parallel on one input (Cohere)."""
    num_experts: int = 0
    """Routed experts per MoE layer; 0 for a dense model."""
    num_experts_per_tok: int = 0
    """Experts each token is routed to (top-k); 0 for a dense model."""
    moe_intermediate_size: int = 0
    """Width of one expert's MLP; 0 for a dense model."""
    shared_intermediate_size: int = 0
    """Total width of the shared experts of an MoE layer (0: none)."""
    dense_layers: int = 0
    """Layers of an MoE model whose MLP is dense (0 for a dense model: every layer is)."""
    q_lora_rank: int = 0
    """MLA: query down-projection rank (0: the query is projected directly)."""
    kv_lora_rank: int = 0
    """MLA: key/value latent rank; 0 means ordinary (grouped-query) attention."""
    qk_nope_head_dim: int = 0
    """MLA: per-head query/key features without rotary embedding."""
    qk_rope_head_dim: int = 0
    """MLA: per-head query/key features with rotary embedding (the key's part is shared by all heads)."""
    v_head_dim: int = 0
    """MLA: per-head value features."""

    def __post_init__(self) -> None:
        dims = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim")
        for name in (*dims, "num_hidden_layers"):
            _check_positive_int(f"ModelConfig.{name}", getattr(self, name))
        zero_ok = (
            "num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_intermediate_size",
            "dense_layers", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
            "v_head_dim",
        )  # fmt: skip
        for name in zero_ok:
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
        if self.dense_layers > self.num_hidden_layers:
            raise ValueError(
                f"ModelConfig {self.name!r}: dense_layers must be in [0, {self.num_hidden_layers}]; "
                f"got {self.dense_layers}"
            )
        if self.is_mla and not (self.qk_rope_head_dim and self.qk_nope_head_dim and self.v_head_dim):
            raise ValueError(
                f"ModelConfig {self.name!r} has kv_lora_rank={self.kv_lora_rank}: qk_nope_head_dim, "
                "qk_rope_head_dim and v_head_dim must be > 0"
            )

    @property
    def is_moe(self) -> bool:
        """True when (some of) the layers' MLP is a routed mixture of experts."""
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        """True for multi-head latent attention (DeepSeek-V2/V3)."""
        return self.kv_lora_rank > 0

    @classmethod
    def from_hf_dict(cls, name: str, data: dict[str, Any]) -> ModelConfig:
        """Read a parsed Hugging Face ``config.json`` as published (docs/shapes.md); raise
        ``ValueError`` naming a missing, bad or unknown key, or an unknown ``model_type`` (and ``name``)."""
        if not isinstance(data, dict):
            raise ValueError(f"model config {name!r} must be a JSON object; got {type(data).__name__}")
        model_type = data.get("model_type")
        known = sorted([*BY_MODEL_TYPE, *MULTIMODAL_TEXT])
        if not (isinstance(model_type, str) and model_type):
            raise ValueError(
                f"model config {name!r} has no 'model_type' (got {model_type!r}); ficco reads a config by "
                f"its model_type, one of {known}. Hugging Face config.json files carry it; add it (e.g. "
                "'llama' for Llama-style layers)"
            )
        if model_type in MULTIMODAL_TEXT:
            inner = data.get(MULTIMODAL_TEXT[model_type])
            if not isinstance(inner, dict):
                raise ValueError(
                    f"model config {name!r} (model_type {model_type!r}) needs an object "
                    f"{MULTIMODAL_TEXT[model_type]!r} with the language model's config"
                )
            log.info(
                "%s: scoring the language model of %s (%s)", name, model_type, MULTIMODAL_TEXT[model_type]
            )
            return cls.from_hf_dict(name, inner)
        family = BY_MODEL_TYPE.get(model_type)
        if family is None:
            raise ValueError(
                f"model config {name!r} has model_type {model_type!r}, which ficco does not read (it reads "
                f"{known}). To score it ficco would need: {NEEDED}. If its layers are Llama-style, set "
                "model_type to 'llama' and remove the keys ficco does not know"
            )
        unknown = sorted(set(data) - family.keys)
        if unknown:
            raise ValueError(
                f"model config {name!r} has unknown key(s) {unknown} for model_type {model_type!r}: ficco "
                "cannot tell whether they change the layer shapes"
            )
        for key, (default, why) in BASE_DEFAULTS.items():
            if data.get(key, default) not in (default, None):
                raise ValueError(
                    f"model config {name!r} key {key!r} must be {default!r} (or absent); got {data[key]!r}: "
                    f"{why}, which ficco does not score"
                )
        return _read(name, model_type, family, data)


_REQUIRED = object()


def _check_positive_int(what: str, value: Any) -> None:
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        raise ValueError(f"{what} must be a positive int; got {value!r}")


def _int(name: str, data: dict[str, Any], key: str, default: Any = _REQUIRED) -> int:
    """``data[key]`` as a positive int; ``default`` when missing or null (ValueError if required)."""
    value = data.get(key)
    if value is None:
        if default is _REQUIRED:
            raise ValueError(f"model config {name!r} is missing the required key {key!r}")
        return default
    _check_positive_int(f"model config {name!r} key {key!r}", value)
    return value


def _moe_layer_count(name: str, family: Family, data: dict[str, Any], layers: int) -> int:
    """How many of ``layers`` have a routed-expert MLP (the rest are dense), by the family's keys:
    DeepSeek ``first_k_dense_replace`` and ``moe_layer_freq``; Qwen ``mlp_only_layers`` and
    ``decoder_sparse_step`` (layer i is MoE when ``(i + 1) % step == 0``); otherwise every layer."""
    first = data.get("first_k_dense_replace") or 0
    freq = _int(name, data, "moe_layer_freq", 1)
    step = _int(name, data, "decoder_sparse_step", 1)
    dense_only = data.get("mlp_only_layers") or []
    if not (isinstance(first, int) and 0 <= first <= layers):
        raise ValueError(
            f"model config {name!r} key 'first_k_dense_replace' must be in [0, {layers}]; got {first!r}"
        )
    if not (isinstance(dense_only, list) and all(isinstance(i, int) for i in dense_only)):
        raise ValueError(f"model config {name!r} key 'mlp_only_layers' must be a list of layer indices")
    return sum(
        1
        for i in range(layers)
        if i >= first and i % freq == 0 and (i + 1) % step == 0 and i not in dense_only
    )


def _read(name: str, model_type: str, family: Family, data: dict[str, Any]) -> ModelConfig:
    """The ``ModelConfig`` of a config whose keys ``family`` accepts."""
    heads = _int(name, data, "num_attention_heads")
    hidden = _int(name, data, "hidden_size")
    head_dim = _int(name, data, "head_dim", 0)
    if not head_dim:
        if hidden % heads:
            raise ValueError(
                f"model config {name!r} has no 'head_dim' and hidden_size={hidden} is not divisible by "
                f"num_attention_heads={heads}; add 'head_dim'"
            )
        head_dim = hidden // heads
    layers = _int(name, data, "num_hidden_layers")
    intermediate = _int(name, data, "intermediate_size")
    extra: dict[str, int] = {}
    experts = _int(name, data, family.expert_key, 0) if family.expert_key else 0
    if experts:
        expert_width = _int(name, data, "moe_intermediate_size", intermediate)
        shared = _int(name, data, "shared_expert_intermediate_size", 0) or (
            _int(name, data, "n_shared_experts", 0) * expert_width
        )
        extra |= {
            "num_experts": experts,
            "num_experts_per_tok": _int(name, data, family.top_k_key),
            "moe_intermediate_size": expert_width,
            "shared_intermediate_size": shared,
            "dense_layers": layers - _moe_layer_count(name, family, data, layers),
        }
    if family.mla:
        extra |= {
            key: _int(name, data, key, 0 if key == "q_lora_rank" else _REQUIRED)
            for key in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
        }
    config = ModelConfig(
        name=name,
        model_type=model_type,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_attention_heads=heads,
        num_key_value_heads=_int(name, data, "num_key_value_heads", heads),
        head_dim=head_dim,
        num_hidden_layers=layers,
        gated_mlp=family.gated_mlp,
        parallel_block=family.parallel_block,
        **extra,
    )
    log.info(
        "%s: read as %s (%s MLP%s%s%s)",
        name,
        model_type,
        "gated" if config.gated_mlp else "plain",
        f", {experts} experts" if experts else "",
        ", latent attention" if config.is_mla else "",
        ", parallel attention+MLP block" if config.parallel_block else "",
    )
    return config


QUANTIZATION_DETAILS = ("fmt", "bits", "weight_block_size", "activation_scheme")
"""Keys of a ``quantization_config`` that :func:`quantization_note` names beside its ``quant_method``."""


def quantization_note(data: Any, dtype: str) -> str | None:
    """A note for a Hugging Face config whose ``quantization_config`` (at its top, or in a multimodal
    config's language model) quantizes its weights, e.g. DeepSeek-V3's fp8: ficco's models were measured on
    ``features.DTYPES`` GEMMs only, so its layers are scored at ``dtype``; None for a config without one."""
    if not isinstance(data, dict):
        return None
    inner = data.get(MULTIMODAL_TEXT.get(str(data.get("model_type")), ""))
    quant = data.get("quantization_config") or (
        inner.get("quantization_config") if isinstance(inner, dict) else None
    )
    if not isinstance(quant, dict) or not quant:
        return None
    method = str(quant.get("quant_method") or "quantized")
    details = ", ".join(f"{k}={quant[k]}" for k in QUANTIZATION_DETAILS if k in quant)
    given = f"{method}: {details}" if details else method
    return (
        f"the config's quantization_config ({given}) is not scored as such: ficco's models know "
        f"{'/'.join(DTYPES)} GEMMs only, so its layers are scored as {dtype} (its {method} GEMMs move fewer "
        "bytes and run faster, so their best overlap schedule can differ)"
    )


def load_model_config(path: str | Path) -> ModelConfig:
    """Load one Hugging Face ``config.json``, or a model folder holding one, named by :func:`config_name`;
    ``ValueError`` naming the file for unreadable JSON and for missing, bad or unknown keys."""
    path = Path(path)
    if path.is_dir():
        path = path / CONFIG_FILE
    name = config_name(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot read model config {path}: {err}") from None
    try:
        return ModelConfig.from_hf_dict(name, data)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


def config_name(path: Path) -> str:
    """The model name of a config file: its folder's for ``config.json``, else the file's stem."""
    return path.parent.name if path.name == CONFIG_FILE else path.stem


def config_paths(path: str | Path) -> list[Path]:
    """The config files ``path`` names: a ``.json`` file; a model folder holding ``config.json``; or a
    folder of ``*.json`` files and model folders, sorted. Raises ``ValueError`` if it names none."""
    path = Path(path)
    if path.is_file():
        return [path]
    if (path / CONFIG_FILE).is_file():
        return [path / CONFIG_FILE]
    if not path.is_dir():
        raise ValueError(f"model config {path} does not exist")
    found = sorted([*path.glob("*.json"), *path.glob(f"*/{CONFIG_FILE}")])
    if not found:
        raise ValueError(f"no model configs (*.json or */{CONFIG_FILE}) in {path}")
    return found


def load_model_configs(directory: str | Path) -> list[ModelConfig]:
    """Every config ``config_paths(directory)`` finds, sorted by name; raise ``ValueError`` if none."""
    return sorted((load_model_config(p) for p in config_paths(directory)), key=lambda c: c.name)


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerPair:
    """One communication + GEMM pair of a transformer layer."""

    name: str = "qkv"
    """``qkv``, ``attn_out``, ``mlp_up``, ``mlp_down``, ``moe_dispatch``, ``moe_combine``, ``shared_up``,
    ``shared_down``, or for a parallel block ``qkv_mlp_up`` and ``attn_mlp_out``."""
    scenario: Scenario = field(default_factory=Scenario)
    """The pair's shapes on one rank."""
    per_layer: int = 1
    """How many times this pair runs in one transformer layer (forward)."""
    layers: int = 1
    """In how many of the model's layers it runs (MoE models may have dense layers)."""


def _kv_local(c: ModelConfig, tp: int, kv_layout: str) -> int:
    """KV heads on one rank under ``kv_layout``; ValueError naming the rule when they do not split."""
    if kv_layout not in KV_LAYOUTS:
        raise ValueError(f"kv_layout must be one of {list(KV_LAYOUTS)}; got {kv_layout!r}")
    kv = c.num_key_value_heads
    if kv % tp == 0:
        return kv // tp
    if kv_layout == "vllm" and tp % kv == 0:
        return 1
    rule = "be a multiple of" if kv_layout == "megatron" else "divide or be a multiple of"
    hint = (
        " (kv_layout='vllm' replicates KV heads instead)" if kv_layout == "megatron" and tp % kv == 0 else ""
    )
    raise ValueError(
        f"{c.name}: num_key_value_heads={kv} must {rule} tp={tp} under kv_layout={kv_layout!r}{hint}"
    )


def _attention_dims(c: ModelConfig, tp: int, kv_layout: str) -> tuple[int, int]:
    """(n of the QKV GEMM, k of the attention-out GEMM) on one rank."""
    local_heads = c.num_attention_heads // tp
    if c.is_mla:
        query = c.q_lora_rank or local_heads * (c.qk_nope_head_dim + c.qk_rope_head_dim)
        return query + c.kv_lora_rank + c.qk_rope_head_dim, local_heads * c.v_head_dim
    kv_local = _kv_local(c, tp, kv_layout)
    return (local_heads + 2 * kv_local) * c.head_dim, local_heads * c.head_dim


def _split(c: ModelConfig, what: str, width: int, tp: int) -> int:
    if width % tp:
        raise ValueError(f"{c.name}: {what}={width} is not divisible by tp={tp}")
    return width // tp


def layer_pairs(
    config: ModelConfig,
    *,
    tp: int,
    tokens: int,
    dtype: str = "bf16",
    hardware: HardwareProfile | None = None,
    kv_layout: KvLayout = "megatron",
) -> list[LayerPair]:
    """The pairs of one forward layer of ``config`` at tensor-parallel degree ``tp`` over ``tokens`` tokens
    (docs/shapes.md) on ``hardware`` (default ``h200x2``); ``ValueError`` naming the model, the field and
    the divisibility rule when the model cannot be split under ``kv_layout``."""
    hardware = hardware or get_hardware(DEFAULT_HARDWARE_ID)
    c = config
    if not (isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 1 and tokens % tp == 0):
        raise ValueError(f"tokens must be a positive multiple of tp={tp}; got {tokens!r}")
    if c.num_attention_heads % tp:
        raise ValueError(f"{c.name}: num_attention_heads={c.num_attention_heads} is not divisible by tp={tp}")
    qkv_n, attn_k = _attention_dims(c, tp, kv_layout)
    up = 2 if c.gated_mlp else 1
    moe_layers = c.num_hidden_layers - c.dense_layers if c.is_moe else 0
    dense_layers = c.num_hidden_layers - moe_layers

    def pair(name: str, op: str, m: int, n: int, k: int, layers: int, **moe: Any) -> LayerPair:
        try:
            scenario = Scenario(op=op, m=m, n=n, k=k, dtype=dtype, world_size=tp, hardware=hardware, **moe)
        except ValueError as err:
            raise ValueError(f"{c.name} {name} at tp={tp}, tokens={tokens}: {err}") from None
        return LayerPair(name=name, scenario=scenario, layers=layers)

    h, n_layers = c.hidden_size, c.num_hidden_layers
    if c.parallel_block:
        local = _split(c, "intermediate_size", c.intermediate_size, tp)
        return [
            pair("qkv_mlp_up", "ag_gemm", tokens, qkv_n + up * local, h, n_layers),
            pair("attn_mlp_out", "gemm_rs", tokens, h, attn_k + local, n_layers),
        ]
    out = [
        pair("qkv", "ag_gemm", tokens, qkv_n, h, n_layers),
        pair("attn_out", "gemm_rs", tokens, h, attn_k, n_layers),
    ]
    if dense_layers:
        local = _split(c, "intermediate_size", c.intermediate_size, tp)
        out += [
            pair("mlp_up", "ag_gemm", tokens, up * local, h, dense_layers),
            pair("mlp_down", "gemm_rs", tokens, h, local, dense_layers),
        ]
    if moe_layers:
        moe = {"experts": c.num_experts, "top_k": c.num_experts_per_tok}
        width = c.moe_intermediate_size
        out += [
            pair("moe_dispatch", "a2a_gemm", tokens // tp, up * width, h, moe_layers, **moe),
            pair("moe_combine", "gemm_a2a", tokens // tp, h, width, moe_layers, **moe),
        ]
    if moe_layers and c.shared_intermediate_size:
        local = _split(c, "shared expert width", c.shared_intermediate_size, tp)
        out += [
            pair("shared_up", "ag_gemm", tokens, up * local, h, moe_layers),
            pair("shared_down", "gemm_rs", tokens, h, local, moe_layers),
        ]
    return out
