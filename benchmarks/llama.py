"""torchtitan's Llama 3 with its module names, and torchtitan's tensor-parallel plan (``apply_tp`` of
``torchtitan/models/llama3/infra/parallelize.py``) over a module of parallel styles: PyTorch's
(``torch.distributed.tensor.parallel``) or ficco's (``ficco.runtime.tp``), the one switch a torchtitan user
makes. torchtitan itself is not a dependency: its 0.3.0 release no longer plans Llama with ParallelStyles and
pulls in datasets, wandb and tensorboard; the model and plan here follow its module names and plan line by
line (``tok_embeddings``, ``layers.<i>.attention.wq/wk/wv/wo``, ``feed_forward.w1/w2/w3``, ``norm``,
``output``).

Sizes: :class:`LlamaArgs` defaults to a debug model (what the tests parallelize on gloo);
:meth:`LlamaArgs.from_config` takes a model's shapes (``datasets/model_configs/Llama-3.1-8B.json``).
:class:`TransformerBlocks` is the decoder layers alone, on sequence-parallel shards ``[batch, seq/w, dim]``
(what ``benchmarks/runtimes.py`` times), parallelized by :func:`apply_block_tp`, the per-layer half of
:func:`apply_tp`."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import parallelize_module

from ficco.features.model_config import ModelConfig


@dataclass(frozen=True, kw_only=True, slots=True)
class LlamaArgs:
    """torchtitan's ``TransformerModelArgs``; the defaults are a debug size (GQA: 8 heads, 4 KV heads)."""

    dim: int = 32
    n_layers: int = 2
    n_heads: int = 8
    n_kv_heads: int = 4
    vocab_size: int = 64
    hidden_dim: int = 48
    max_seq_len: int = 64
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5

    @classmethod
    def from_config(cls, cfg: ModelConfig, *, n_layers: int, max_seq_len: int) -> LlamaArgs:
        """A model's layer shapes (``features.model_config``) with ``n_layers`` layers and rotary
        frequencies for ``max_seq_len`` tokens; ValueError when its head size is not ``dim / n_heads`` (the
        Llama layout this model assumes)."""
        if cfg.head_dim * cfg.num_attention_heads != cfg.hidden_size:
            raise ValueError(
                f"{cfg.name}: head_dim * num_attention_heads must equal hidden_size for a Llama; got "
                f"{cfg.head_dim} * {cfg.num_attention_heads} != {cfg.hidden_size}"
            )
        shapes = {arg: getattr(cfg, name) for arg, name in CONFIG_NAMES.items()}
        return cls(n_layers=n_layers, max_seq_len=max_seq_len, **shapes)


CONFIG_NAMES = {
    "dim": "hidden_size",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "hidden_dim": "intermediate_size",
}
"""The layer shapes :meth:`LlamaArgs.from_config` takes: torchtitan's argument -> ``ModelConfig``'s field."""


def precompute_freqs_cis(dim: int, end: int, theta: float) -> torch.Tensor:
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    return torch.polar(torch.ones(end, dim // 2), torch.outer(torch.arange(end).float(), freqs))


def apply_rotary_emb(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    bs, slen, n_kv_heads, head_dim = x.shape
    if n_rep == 1:
        return x
    return x[:, :, :, None, :].expand(bs, slen, n_kv_heads, n_rep, head_dim).reshape(bs, slen, -1, head_dim)


class Attention(nn.Module):
    def __init__(self, args: LlamaArgs) -> None:
        super().__init__()
        self.n_rep = args.n_heads // args.n_kv_heads
        self.head_dim = args.dim // args.n_heads
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        bs, seqlen, _ = x.shape
        xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)
        # -1: the local heads under tensor parallelism
        xq = xq.view(bs, seqlen, -1, self.head_dim)
        xk = xk.view(bs, seqlen, -1, self.head_dim)
        xv = xv.view(bs, seqlen, -1, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis)
        keys, values = repeat_kv(xk, self.n_rep), repeat_kv(xv, self.n_rep)
        out = F.scaled_dot_product_attention(
            xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), is_causal=True
        )
        return self.wo(out.transpose(1, 2).contiguous().view(bs, seqlen, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, args: LlamaArgs) -> None:
        super().__init__()
        self.attention = Attention(args)
        self.feed_forward = FeedForward(args.dim, args.hidden_dim)
        self.attention_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.ffn_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, args: LlamaArgs) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.register_buffer(
            "freqs_cis", precompute_freqs_cis(args.dim // args.n_heads, args.max_seq_len, args.rope_theta)
        )
        self.layers = nn.ModuleDict({str(i): TransformerBlock(args) for i in range(args.n_layers)})
        self.norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        freqs_cis = self.freqs_cis[: tokens.shape[1]]
        for layer in self.layers.values():
            h = layer(h, freqs_cis)
        return self.output(self.norm(h))


class TransformerBlocks(nn.Module):
    """The decoder layers of :class:`Transformer` alone (``layers.<i>``, same names), on this rank's
    sequence shard: ``h [batch, seq/w, dim] -> [batch, seq/w, dim]`` under :func:`apply_block_tp` on ``w``
    ranks (``tp_degree``), or the whole sequence unparallelized (``tp_degree=1``)."""

    def __init__(self, args: LlamaArgs, tp_degree: int = 1) -> None:
        super().__init__()
        self.tp_degree = tp_degree
        self.register_buffer(
            "freqs_cis", precompute_freqs_cis(args.dim // args.n_heads, args.max_seq_len, args.rope_theta)
        )
        self.layers = nn.ModuleDict({str(i): TransformerBlock(args) for i in range(args.n_layers)})

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        freqs_cis = self.freqs_cis[: h.shape[1] * self.tp_degree]
        for layer in self.layers.values():
            h = layer(h, freqs_cis)
        return h


def apply_block_tp(block: TransformerBlock, tp_mesh, styles) -> None:
    """torchtitan's plan of one decoder layer (sequence parallel: ``Shard(1)`` between the layers) over
    ``styles`` (a module with ``ColwiseParallel``, ``RowwiseParallel``, ``PrepareModuleInput`` and
    ``SequenceParallel``)."""
    rowwise_parallel, colwise_parallel, prepare_module_input = (
        styles.RowwiseParallel,
        styles.ColwiseParallel,
        styles.PrepareModuleInput,
    )
    layer_plan = {
        "attention_norm": styles.SequenceParallel(),
        "attention": prepare_module_input(
            input_layouts=(Shard(1), None),
            desired_input_layouts=(Replicate(), None),
        ),
        "attention.wq": colwise_parallel(),
        "attention.wk": colwise_parallel(),
        "attention.wv": colwise_parallel(),
        "attention.wo": rowwise_parallel(output_layouts=Shard(1)),
        "ffn_norm": styles.SequenceParallel(),
        "feed_forward": prepare_module_input(
            input_layouts=(Shard(1),),
            desired_input_layouts=(Replicate(),),
        ),
        "feed_forward.w1": colwise_parallel(),
        "feed_forward.w2": rowwise_parallel(output_layouts=Shard(1)),
        "feed_forward.w3": colwise_parallel(),
    }
    parallelize_module(module=block, device_mesh=tp_mesh, parallelize_plan=layer_plan)


def apply_tp(model: Transformer, tp_mesh, styles, loss_parallel: bool = False) -> None:
    """torchtitan's ``apply_tp`` (no float8), over ``styles``: a module with ``ColwiseParallel``,
    ``RowwiseParallel``, ``PrepareModuleInput`` and ``SequenceParallel``."""
    parallelize_module(
        model,
        tp_mesh,
        {
            "tok_embeddings": styles.RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": styles.SequenceParallel(),
            "output": styles.ColwiseParallel(
                input_layouts=Shard(1),
                output_layouts=Shard(-1) if loss_parallel else Replicate(),
                use_local_output=not loss_parallel,
            ),
        },
    )
    for transformer_block in model.layers.values():
        apply_block_tp(transformer_block, tp_mesh, styles)
