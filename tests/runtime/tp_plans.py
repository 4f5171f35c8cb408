"""Tiny models of the families ``ficco.runtime.tp`` must reproduce PyTorch's styles on, their
tensor-parallel plans over any mix of styles, and :func:`check`, which runs one (model, plan, shapes) case
under PyTorch's styles and under the mix and returns how far the output and every gradient are apart.

Models (``MODELS``), all at debug sizes that 2 and 4 ranks divide:

- ``llama``: ``benchmarks.llama.Transformer`` (torchtitan's names; q/k/v, w1/w3, no biases);
- ``gpt2``: a fused ``c_attn`` (q/k/v as one linear), ``c_fc``/``c_proj`` MLP, LayerNorms, biases on every
  linear (row-parallel ``c_proj`` with a bias is the case the bias gradient's reduction is for);
- ``gemma``: q/k/v, gated MLP, RMSNorms, Gemma's extra norms (after attention and around the MLP, and on
  the local heads' q and k);
- ``phi3_mlp``: an MLP block with a fused ``gate_up_proj`` split in the forward;
- ``reshaping_mlp``: a gated MLP (Mixtral's and Qwen's MoE shared expert) that views its input as
  ``[-1, hidden]`` before its column-parallel children and back after;
- ``odd_head``: a biased output projection whose 30 columns 4 ranks shard unevenly (PyTorch's style then);
- ``own_forward_mlp``: GPT-2's MLP of ``nn.Linear`` subclasses with a forward of their own;
- ``routed_mlp``: a gated MLP plus a replicated router's term, which reads its input beside its projections.

The full models take token ids ``[batch, seq]``; the others take hidden states ``[batch, seq, hidden]``
or, ``flat``, ``[tokens, hidden]``. Plans (:func:`plan`): sequence parallel (torchtitan's: ``Shard(1)``, or
``Shard(0)`` for flat inputs, between blocks, ``PrepareModuleInput`` gathering in front of attention and
MLP) or plain tensor parallel (replicated activations, row-parallel outputs all-reduced); the
``PrepareModuleInput`` styles and the linear styles each PyTorch's or ficco's.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import types
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import PrepareModuleOutput, loss_parallel, parallelize_module
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks import llama

TOLERANCE = {"fp32": 1e-5, "bf16": 1e-2}
"""Largest relative error (``||got - ref|| / ||ref||``) of an output or gradient: the executor tests'."""
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
HIDDEN, HEADS, FFN, SEQ = 32, 4, 64, 8
"""Debug sizes of the models other than Llama (whose own are ``benchmarks.llama.LlamaArgs``'s)."""
VOCAB = 64


@dataclass(frozen=True, kw_only=True)
class Case:
    """One model under one plan, at one shape."""

    model: str
    """A key of ``MODELS``."""
    sp: bool = True
    """Sequence parallel (else plain tensor parallel)."""
    prepare: str = "ficco"
    """Whose ``PrepareModuleInput`` (``ficco`` or ``torch``); sequence parallel only."""
    linears: str = "ficco"
    """Whose ``ColwiseParallel`` / ``RowwiseParallel`` (``ficco`` or ``torch``)."""
    local: bool = False
    """``PrepareModuleInput(use_local_output=...)``."""
    batch: int = 2
    seq: int = SEQ
    flat: bool = False
    """Hidden states as ``[tokens, hidden]`` (MLP blocks only)."""
    dtype: str = "fp32"
    usage: str = ""
    """What the user does around the model: keys of ``USAGES`` joined by ``+`` ("" none)."""

    def __str__(self) -> str:
        fields = [self.model, "sp" if self.sp else "tp", f"prep={self.prepare}", f"lin={self.linears}"]
        fields += [f"local={int(self.local)}", f"b={self.batch}", f"s={self.seq}", self.dtype]
        return " ".join(fields + (["flat"] if self.flat else []) + ([self.usage] if self.usage else []))


USAGES: dict[str, str] = {
    "autocast": "the step under torch.autocast (bf16) of an fp32 model",
    "compile": "each block (or the MLP) compiled after the plan, fullgraph (backend aot_eager)",
    "twice": "the model called twice in one step, the outputs summed",
    "accumulate": "two backward passes accumulating into the gradients",
    "no_grad": "inference under torch.no_grad",
    "frozen": "the first column-parallel layers' parameters frozen (requires_grad=False)",
    "checkpoint": "each block under activation checkpointing (checkpoint_wrapper, non-reentrant)",
    "double": "model.double() after the plan (fp64 input)",
    "half": "model.half() after the plan (fp16 input)",
    "to_bf16": "model.to(torch.bfloat16) after the plan (bf16 input)",
    "fsdp": "FSDP2 (fully_shard) over the data dimension of a 2 x 2 mesh, tensor parallel over the other",
    "loss_parallel": "vocab-parallel output (Shard(-1), a DTensor) and cross-entropy under loss_parallel()",
}
"""The usages :func:`check` applies, and what each does."""
AFTER_PLAN = {"double": torch.float64, "half": torch.float16, "to_bf16": torch.bfloat16}
"""The dtype a usage casts the model and input to after the plan."""


# Models -----------------------------------------------------------------------------------------------------


def _attention(
    x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, head_dim: int
) -> torch.Tensor:
    """Causal attention of ``[batch, seq, local heads * head_dim]`` q/k/v (the local heads: ``-1``)."""
    b, s = x.shape[0], x.shape[1]
    q, k, v = (t.view(b, s, -1, head_dim).transpose(1, 2) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.transpose(1, 2).reshape(b, s, -1)


class GPT2Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c_attn = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.c_proj = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.c_attn(x)
        q, k, v = qkv.split(qkv.shape[-1] // 3, dim=-1)
        return self.c_proj(_attention(x, q, k, v, HIDDEN // HEADS))


class GPT2MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c_fc = nn.Linear(HIDDEN, FFN)
        self.c_proj = nn.Linear(FFN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class GPT2Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(HIDDEN), GPT2Attention()
        self.ln_2, self.mlp = nn.LayerNorm(HIDDEN), GPT2MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GemmaAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(HIDDEN, HIDDEN, bias=False) for _ in range(3))
        self.o_proj = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.q_norm, self.k_norm = nn.RMSNorm(HIDDEN // HEADS), nn.RMSNorm(HIDDEN // HEADS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = HIDDEN // HEADS
        b, s = x.shape[0], x.shape[1]
        q = self.q_norm(self.q_proj(x).view(b, s, -1, d)).flatten(2)
        k = self.k_norm(self.k_proj(x).view(b, s, -1, d)).flatten(2)
        return self.o_proj(_attention(x, q, k, self.v_proj(x), d))


class GatedMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(HIDDEN, FFN, bias=False)
        self.up_proj = nn.Linear(HIDDEN, FFN, bias=False)
        self.down_proj = nn.Linear(FFN, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class ReshapingMLP(GatedMLP):
    """Mixtral's / Qwen's shared expert: the input viewed as tokens before the projections, the product
    viewed back before the down projection."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.view(-1, x.shape[-1])
        h = F.silu(self.gate_proj(tokens)) * self.up_proj(tokens)
        return self.down_proj(h.view(*x.shape[:-1], -1))


class Phi3MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(HIDDEN, 2 * FFN, bias=False)
        self.down_proj = nn.Linear(FFN, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class GemmaBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.input_layernorm, self.self_attn = nn.RMSNorm(HIDDEN), GemmaAttention()
        self.post_attention_layernorm = nn.RMSNorm(HIDDEN)
        self.pre_feedforward_layernorm, self.mlp = nn.RMSNorm(HIDDEN), GatedMLP()
        self.post_feedforward_layernorm = nn.RMSNorm(HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x)))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class RoutedMLP(GatedMLP):
    """A gated MLP plus a per-sequence term from a replicated linear (a router, as a MoE's) that reads the
    same input as its column-parallel projections: the prepared input is consumed by the op and by another
    reader at once."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + self.router(x).mean(1, keepdim=True)  # [batch, 1, hidden]


class HalvedLinear(nn.Linear):
    """A linear with a forward of its own (as float8 or LoRA linears have): its output halved."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) / 2


class OwnForwardMLP(GPT2MLP):
    """GPT-2's MLP whose layers are :class:`HalvedLinear` (PyTorch's style then, which keeps the forward)."""

    def __init__(self) -> None:
        super().__init__()
        self.c_fc, self.c_proj = HalvedLinear(HIDDEN, FFN), HalvedLinear(FFN, HIDDEN)


class OddHead(nn.Module):
    """An output projection of 30 columns with a bias: an uneven shard at 4 ranks (as GPT-2's 50257)."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(HIDDEN, 30)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x)


class NeoXBlock(nn.Module):
    """GPT-NeoX: a fused ``query_key_value`` (per head q, k, v) with biases, biased ``dense``, and the MLP
    beside attention (parallel residual)."""

    def __init__(self) -> None:
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
        self.attention, self.mlp = NeoXAttention(), NeoXMLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attention(self.input_layernorm(x)) + self.mlp(self.post_attention_layernorm(x))


class NeoXAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.query_key_value = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.dense = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = HIDDEN // HEADS
        qkv = self.query_key_value(x).view(x.shape[0], x.shape[1], -1, 3 * d)
        q, k, v = (t.flatten(2) for t in qkv.split(d, dim=-1))
        return self.dense(_attention(x, q, k, v, d))


class NeoXMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dense_h_to_4h, self.dense_4h_to_h = nn.Linear(HIDDEN, FFN), nn.Linear(FFN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(x)))


class Qwen2Attention(nn.Module):
    """Qwen2: grouped-query attention (half as many key/value heads, 8 and 4 of 4 features: 4 ranks hold
    a key/value head each) with biased q/k/v, no bias on o."""

    def __init__(self) -> None:
        super().__init__()
        d = HIDDEN // (2 * HEADS)
        self.q_proj = nn.Linear(HIDDEN, HIDDEN)
        self.k_proj, self.v_proj = nn.Linear(HIDDEN, HIDDEN // 2), nn.Linear(HIDDEN, HIDDEN // 2)
        self.o_proj = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.head_dim = d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape[0], x.shape[1], self.head_dim
        q = self.q_proj(x)
        kv = (self.k_proj(x), self.v_proj(x))
        k, v = (t.view(b, s, -1, d).repeat_interleave(2, 2).flatten(2) for t in kv)
        return self.o_proj(_attention(x, q, k, v, d))


class Qwen2Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.input_layernorm, self.self_attn = nn.RMSNorm(HIDDEN), Qwen2Attention()
        self.post_attention_layernorm, self.mlp = nn.RMSNorm(HIDDEN), GatedMLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class WrappedMLP(nn.Module):
    """A gated MLP whose output the plan gathers again (``PrepareModuleOutput`` on the wrapper)."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = GatedMLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x)


def tied_llama() -> nn.Module:
    """The debug Llama with its output projection tied to its token embeddings."""
    model = llama.Transformer(llama.LlamaArgs())
    model.output.weight = model.tok_embeddings.weight
    return model


class Decoder(nn.Module):
    """Embedding, two blocks, a final norm and the output projection."""

    def __init__(self, block: type[nn.Module], norm: type[nn.Module]) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList([block(), block()])
        self.norm, self.head = norm(HIDDEN), nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.head(self.norm(h))


@dataclass(frozen=True)
class _Roles:
    """Where a model's parallel layers are, relative to one block (or the model, for an MLP block)."""

    blocks: str
    """The blocks' container (``layers``), or "" for a model that is one MLP block."""
    norms: tuple[str, ...]
    """Norms on the sequence-parallel activations (``SequenceParallel`` in a sequence-parallel plan)."""
    modules: dict[str, tuple[tuple[str, ...], tuple[str, ...]]]
    """Prepared module ("" for the model itself) -> (its column-parallel children, its row-parallel ones)."""
    local_only: bool = False
    """Its prepared input must be a local tensor (``use_local_output=True``): the model mixes it with plain
    parameters, which a DTensor refuses under PyTorch's styles too."""
    post_norms: tuple[str, ...] = ()
    """Norms of a block's output added to its input (``SequenceParallel(use_local_output=True)``)."""
    args: dict[str, int] = field(default_factory=dict)
    """Prepared module -> how many inputs it takes when more than one (the first is the activations)."""
    embed: str = ""
    norm: str = ""
    head: str = ""
    gather_output: bool = False
    """The model's own output gathered again (``PrepareModuleOutput``, ``Shard(1) -> Replicate()``)."""


MODELS: dict[str, tuple[Callable[[], nn.Module], _Roles]] = {
    "llama": (
        lambda: llama.Transformer(llama.LlamaArgs()),
        _Roles(
            "layers",
            ("attention_norm", "ffn_norm"),
            {"attention": (("wq", "wk", "wv"), ("wo",)), "feed_forward": (("w1", "w3"), ("w2",))},
            embed="tok_embeddings",
            norm="norm",
            head="output",
            args={"attention": 2},  # (x, freqs_cis)
        ),
    ),
    "gpt2": (
        lambda: Decoder(GPT2Block, nn.LayerNorm),
        _Roles(
            "layers",
            ("ln_1", "ln_2"),
            {"attn": (("c_attn",), ("c_proj",)), "mlp": (("c_fc",), ("c_proj",))},
            embed="embed",
            norm="norm",
            head="head",
        ),
    ),
    "gemma": (
        lambda: Decoder(GemmaBlock, nn.RMSNorm),
        _Roles(
            "layers",
            ("input_layernorm", "pre_feedforward_layernorm"),
            {
                "self_attn": (("q_proj", "k_proj", "v_proj"), ("o_proj",)),
                "mlp": (("gate_proj", "up_proj"), ("down_proj",)),
            },
            post_norms=("post_attention_layernorm", "post_feedforward_layernorm"),
            embed="embed",
            norm="norm",
            head="head",
        ),
    ),
    "neox": (
        lambda: Decoder(NeoXBlock, nn.LayerNorm),
        _Roles(
            "layers",
            ("input_layernorm", "post_attention_layernorm"),
            {
                "attention": (("query_key_value",), ("dense",)),
                "mlp": (("dense_h_to_4h",), ("dense_4h_to_h",)),
            },
            embed="embed",
            norm="norm",
            head="head",
        ),
    ),
    "qwen2": (
        lambda: Decoder(Qwen2Block, nn.RMSNorm),
        _Roles(
            "layers",
            ("input_layernorm", "post_attention_layernorm"),
            {
                "self_attn": (("q_proj", "k_proj", "v_proj"), ("o_proj",)),
                "mlp": (("gate_proj", "up_proj"), ("down_proj",)),
            },
            embed="embed",
            norm="norm",
            head="head",
        ),
    ),
    "tied_llama": (
        tied_llama,
        _Roles(
            "layers",
            ("attention_norm", "ffn_norm"),
            {"attention": (("wq", "wk", "wv"), ("wo",)), "feed_forward": (("w1", "w3"), ("w2",))},
            embed="tok_embeddings",
            norm="norm",
            head="output",
            args={"attention": 2},
        ),
    ),
    "wrapped_mlp": (
        WrappedMLP,
        _Roles("", (), {"mlp": (("gate_proj", "up_proj"), ("down_proj",))}, gather_output=True),
    ),
    "odd_head": (OddHead, _Roles("", (), {}, head="head")),
    "own_forward_mlp": (OwnForwardMLP, _Roles("", (), {"": (("c_fc",), ("c_proj",))})),
    "routed_mlp": (
        RoutedMLP,
        _Roles("", (), {"": (("gate_proj", "up_proj"), ("down_proj",))}, local_only=True),
    ),
    "phi3_mlp": (Phi3MLP, _Roles("", (), {"": (("gate_up_proj",), ("down_proj",))})),
    "reshaping_mlp": (ReshapingMLP, _Roles("", (), {"": (("gate_proj", "up_proj"), ("down_proj",))})),
}


# Plans ------------------------------------------------------------------------------------------------------


def plan(model: nn.Module, case: Case, prepare_styles, linear_styles) -> dict:
    """The case's plan of ``model`` (``parallelize_module``'s dict; "" is the model itself):
    ``prepare_styles`` gives ``PrepareModuleInput`` and ``SequenceParallel``, ``linear_styles``
    ``ColwiseParallel`` and ``RowwiseParallel`` (modules of styles: PyTorch's or ficco's)."""
    _, roles = MODELS[case.model]
    seq = Shard(0 if case.flat else 1)
    rows = seq if case.sp else Replicate()
    out: dict = {}
    if roles.embed:
        out[roles.embed] = linear_styles.RowwiseParallel(input_layouts=Replicate(), output_layouts=rows)
    if roles.norm and case.sp:
        out[roles.norm] = prepare_styles.SequenceParallel()
    if roles.head and case.usage == "loss_parallel":  # the logits stay vocab-sharded, as a DTensor
        out[roles.head] = linear_styles.ColwiseParallel(
            input_layouts=rows, output_layouts=Shard(-1), use_local_output=False
        )
    elif roles.head:
        out[roles.head] = linear_styles.ColwiseParallel(input_layouts=rows, output_layouts=Replicate())
    if roles.gather_output and case.sp:
        out[""] = PrepareModuleOutput(output_layouts=seq, desired_output_layouts=Replicate())
    blocks = [""]
    if roles.blocks:
        blocks = [f"{roles.blocks}.{i}." for i in range(len(model.get_submodule(roles.blocks)))]
    for block in blocks:
        if case.sp:
            out |= {block + norm: prepare_styles.SequenceParallel() for norm in roles.norms}
            local = prepare_styles.SequenceParallel(use_local_output=True)
            out |= {block + norm: local for norm in roles.post_norms}
        for module, (cols, row_layers) in roles.modules.items():
            path = block + module  # the prepared module ("" for the model itself)
            if case.sp:
                more = (None,) * (roles.args.get(module, 1) - 1)
                out[path.rstrip(".")] = prepare_styles.PrepareModuleInput(
                    input_layouts=(seq, *more),
                    desired_input_layouts=(Replicate(), *more),
                    use_local_output=case.local,
                )
            prefix = f"{path}." if module else path
            out |= {prefix + col: linear_styles.ColwiseParallel() for col in cols}
            out |= {prefix + row: linear_styles.RowwiseParallel(output_layouts=rows) for row in row_layers}
    return out


def apply_plan(model: nn.Module, mesh, styles: dict) -> None:
    """``parallelize_module`` of ``styles``, whose key "" is the model itself (applied first)."""
    styles = dict(styles)
    if "" in styles:
        parallelize_module(model, mesh, styles.pop(""))
    parallelize_module(model, mesh, styles)


def ficco_styles_with(schedules) -> types.SimpleNamespace:
    """ficco's styles with ``schedules``, as torchtitan swaps its float8 styles in (a module of styles)."""
    import functools

    from ficco.runtime import tp as ficco_styles

    return types.SimpleNamespace(
        ColwiseParallel=functools.partial(ficco_styles.ColwiseParallel, schedules=schedules),
        RowwiseParallel=functools.partial(ficco_styles.RowwiseParallel, schedules=schedules),
        PrepareModuleInput=ficco_styles.PrepareModuleInput,
        SequenceParallel=ficco_styles.SequenceParallel,
    )


def styles_of(case: Case, schedules) -> tuple[types.SimpleNamespace, types.SimpleNamespace]:
    """The case's (prepare styles, linear styles), ficco's with ``schedules``."""
    import torch.distributed.tensor.parallel as torch_styles

    pick = {"ficco": ficco_styles_with(schedules), "torch": torch_styles}
    return pick[case.prepare], pick[case.linears]


# The check --------------------------------------------------------------------------------------------------


def inputs(case: Case, rank: int, world_size: int, device: torch.device) -> torch.Tensor:
    """This rank's input: token ids ``[batch, seq]`` (full models), else hidden states, this rank's
    sequence shard in a sequence-parallel plan (the same full tensor on every rank before it)."""
    gen = torch.Generator().manual_seed(11)
    if MODELS[case.model][1].embed:
        return torch.randint(0, VOCAB, (case.batch, case.seq), generator=gen).to(device)
    shape = (case.batch * case.seq, HIDDEN) if case.flat else (case.batch, case.seq, HIDDEN)
    x = torch.randn(shape, generator=gen).to(device, DTYPES[case.dtype])
    if case.sp:
        dim = 0 if case.flat else 1
        x = x.chunk(world_size, dim=dim)[rank]
    return x.contiguous().requires_grad_()


def check(case: Case, mesh, schedules, device: torch.device, dp_mesh=None) -> dict:
    """``case`` under PyTorch's styles and under its mix of styles (ficco's with ``schedules``), same seed
    and input, with its ``usage`` (:data:`USAGES`; ``fsdp`` shards over ``dp_mesh``). ``ficco_ops`` counts
    the ficco ops the mix ran (not under ``compile``). For the output, the input's gradient (hidden-state
    inputs) and every parameter's gradient, compared as this rank's local tensors (a replicated gradient is
    compared on each rank), ``errors`` holds ``name -> (relative error of the mix, of PyTorch's)`` against
    the reference: PyTorch's run itself (its own error 0); in bf16 the same plan under PyTorch's styles in
    fp32 on the bf16-rounded model and input, so that the mix's rounding is set beside PyTorch's.
    ``placements`` lists the gradients whose DTensor placements differ from PyTorch's, ``dtypes`` those of
    another dtype than PyTorch's, ``spread`` those that differ between ranks where PyTorch's are identical
    on every rank (the largest difference)."""
    import torch.distributed.tensor.parallel as torch_styles

    torch.manual_seed(0)
    factory, _ = MODELS[case.model]
    base = factory().to(device, DTYPES[case.dtype])
    x = inputs(case, mesh.get_local_rank(), mesh.size(), device)
    runs = {"torch": (torch_styles, torch_styles), "mix": styles_of(case, schedules)}
    if low_precision(case):
        runs["truth"] = (torch_styles, torch_styles)
    truth = dataclasses.replace(case, usage="+".join(u for u in case.usage.split("+") if u not in LOW))
    results, ficco_ops = {}, {}
    for name, (prepare_styles, linear_styles) in runs.items():
        model = copy.deepcopy(base).float() if name == "truth" else copy.deepcopy(base)
        run = truth if name == "truth" else case
        apply_plan(model, mesh, plan(model, run, prepare_styles, linear_styles))
        if name == "mix":
            from ficco.runtime import tp as ficco_styles

            ficco_styles.name_modules(model)
        xi = x.detach().float() if name == "truth" and x.is_floating_point() else x.detach()
        model, xi = _after_plan(run, model, xi, dp_mesh, compiled=name == "mix")
        xi.requires_grad_(x.requires_grad and case.usage != "no_grad")
        counts = name == "mix" and "compile" not in case.usage
        counting = CountFiccoOps() if counts else contextlib.nullcontext()
        with counting:
            out = _step(run, model, xi, device)
        if isinstance(counting, CountFiccoOps):
            ficco_ops = counting.counts
        grads = {"<output>": out.detach(), "<input>": xi.grad}
        grads |= {n.replace("_orig_mod.", "").replace("_checkpoint_wrapped_module.", ""): p.grad
                  for n, p in model.named_parameters()}  # fmt: skip
        results[name] = grads
    ref = results.get("truth", results["torch"])
    out = {"case": asdict(case), "errors": {}, "placements": {}, "dtypes": {}, "spread": {}}
    out["ficco_ops"] = ficco_ops
    replicated = {}
    scale = max((float(_local(t).norm()) for t in ref.values() if t is not None), default=0.0)
    for name, want in ref.items():
        got, theirs = results["mix"][name], results["torch"][name]
        if want is None:
            if got is not None:
                out["errors"][name] = (float("inf"), 0.0)
            continue
        placements = [getattr(t, "placements", None) for t in (got, theirs)]
        if placements[0] != placements[1]:
            out["placements"][name] = [str(p) for p in placements]
        if got is not None and got.dtype != theirs.dtype:
            out["dtypes"][name] = [str(got.dtype), str(theirs.dtype)]
        local = [_local(t) for t in (got, theirs, want)]
        out["errors"][name] = (
            _rel(local[0], local[2], scale),
            _rel(local[1], local[2], scale) if "truth" in results else 0.0,
        )
        if placements[1] is None or all(isinstance(p, Replicate) for p in placements[1]):
            replicated[name] = (local[0], local[1])
    everyone = [None] * mesh.size()
    dist.all_gather_object(everyone, replicated, group=mesh.get_group())
    for name in replicated:
        spreads = [
            max(float((r[name][i] - everyone[0][name][i]).abs().max()) for r in everyone) for i in (0, 1)
        ]
        if spreads[0] > 0 and spreads[1] == 0:
            out["spread"][name] = spreads[0]
    return out


def _after_plan(case: Case, model: nn.Module, x: torch.Tensor, dp_mesh, *, compiled: bool):
    """The model and input once ``case.usage`` changed them after the plan: cast, frozen, checkpointed,
    sharded over ``dp_mesh``, or (``compiled``: the mix's run) compiled per block."""
    usages, roles = case.usage.split("+"), MODELS[case.model][1]
    blocks = model.get_submodule(roles.blocks) if roles.blocks else None
    for usage in usages:
        model, x = _changed(usage, roles, model, blocks, x, dp_mesh, compiled=compiled)
    return model, x


def _changed(usage: str, roles: _Roles, model: nn.Module, blocks, x: torch.Tensor, dp_mesh, *, compiled):
    """:func:`_after_plan` of one usage."""
    if usage in AFTER_PLAN:
        model.to(AFTER_PLAN[usage])
        x = x.to(AFTER_PLAN[usage]) if x.is_floating_point() else x
    elif usage == "frozen":  # the first prepared module's column-parallel layers, in every block
        module, (cols, _) = next(iter(roles.modules.items()))
        for name, p in model.named_parameters():
            if any(f"{module}.{c}." in f".{name}" for c in cols):
                p.requires_grad_(False)
    elif usage == "checkpoint" and blocks is not None:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        for key, block in list(blocks.named_children()):
            blocks.register_module(key, checkpoint_wrapper(block))
    elif usage == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in blocks.children() if blocks is not None else ():
            fully_shard(block, mesh=dp_mesh)
        fully_shard(model, mesh=dp_mesh)
    elif usage == "compile" and compiled:
        options = {"backend": "aot_eager", "fullgraph": True}
        if blocks is None:
            return torch.compile(model, **options), x
        for key, block in list(blocks.named_children()):
            blocks.register_module(key, torch.compile(block, **options))
    return model, x


def _step(case: Case, model: nn.Module, x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """One step of ``model`` on ``x`` with ``case.usage`` (the backward of a fixed random projection of the
    output, or of the loss under ``loss_parallel``); the output, as a local tensor."""
    usages = case.usage.split("+")
    usage = next((u for u in usages if u != "compile" and u != "autocast"), "")
    if usage == "no_grad":
        with torch.no_grad():
            return _as_local(model(x))
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if "autocast" in usages else None
    out = None
    for call in range(2 if usage in ("twice", "accumulate") else 1):
        with autocast or contextlib.nullcontext():
            y = model(x)
        if usage == "loss_parallel":
            labels = torch.randint(0, VOCAB, x.shape, generator=torch.Generator().manual_seed(3 + call))
            with loss_parallel():
                F.cross_entropy(y.flatten(0, 1), labels.to(device).flatten()).backward()
            return _as_local(y)
        y = _as_local(y)
        if usage == "twice":
            out = y if out is None else out + y
            continue
        g = torch.randn(y.shape, generator=torch.Generator().manual_seed(5 + call)).to(device)
        (y.float() * g).sum().backward()
        out = y if out is None else out + y
    if usage == "twice":
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(device)
        (out.float() * g).sum().backward()
    return out


def _as_local(y: torch.Tensor) -> torch.Tensor:
    return y.to_local() if isinstance(y, DTensor) else y


class CountFiccoOps(TorchDispatchMode):
    """Counts the ficco ops run inside it (``counts``: op name -> calls), forward and backward; the public
    ops decompose into their twins above the mode, so it sees ``ficco._all_gather_matmul``."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if name.startswith("ficco."):
            self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def _local(t: torch.Tensor | None) -> torch.Tensor | None:
    """A gradient's local tensor, fp32 on the host."""
    if t is None:
        return None
    return (t.to_local() if isinstance(t, DTensor) else t).detach().float().cpu()


VANISHING = 1e-2
"""A reference gradient this far below the step's largest (``scale``) is zero in exact arithmetic (a key's
bias: attention's softmax does not see it) and rounding noise in floating point: :func:`_rel` measures it
against ``VANISHING * scale``."""


def _rel(got: torch.Tensor | None, ref: torch.Tensor, scale: float = 0.0) -> float:
    if got is None or got.shape != ref.shape:
        return float("inf")
    return float((got - ref).norm() / max(float(ref.norm()), VANISHING * scale, 1e-30))


LOW = ("autocast", "half", "to_bf16")
"""Usages that run the step in a 16-bit dtype."""


def low_precision(case: Case) -> bool:
    """Whether ``case`` runs in a 16-bit dtype (its own, or by its usage): compared with PyTorch's fp32 run
    of the same plan, at the 16-bit tolerance."""
    return case.dtype != "fp32" or any(u in LOW for u in case.usage.split("+"))


def failures(result: dict, tolerance: dict[str, float] = TOLERANCE) -> list[str]:
    """What is wrong in one :func:`check` result (empty when the mix gives PyTorch's answer): an error over
    the dtype's ``tolerance`` (bf16: over twice PyTorch's own rounding error as well), a placement, a
    spread."""
    tol = tolerance["bf16" if low_precision(Case(**result["case"])) else "fp32"]
    bad = [
        f"{name} {mine:.3g} (PyTorch's {theirs:.3g})"
        for name, (mine, theirs) in result["errors"].items()
        if not mine <= max(tol, 2 * theirs)
    ]
    bad += [f"grad placements of {n}: {p[0]} (PyTorch's {p[1]})" for n, p in result["placements"].items()]
    bad += [f"dtype of {n}: {d[0]} (PyTorch's {d[1]})" for n, d in result.get("dtypes", {}).items()]
    bad += [f"grad of {n} differs between ranks by {s:.3g}" for n, s in result["spread"].items()]
    return bad
