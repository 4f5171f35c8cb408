"""Scenario: one collective + GEMM pair, with its sizes, dtype, world size and hardware.

Ops ``ag_gemm``, ``gemm_rs``, ``a2a_gemm`` and ``gemm_a2a``; shapes are per rank (``OP_SPECS`` gives each
op's collective, order and shapes). The split rows (``Scenario.rows``) are ``m``, or ``m * top_k`` for the
MoE ops. See docs/shapes.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from ficco.features._roundtrip import JsonRoundTrip
from ficco.features._validate import check_choice, check_float, check_int
from ficco.features.hardware import DEFAULT_HARDWARE_ID, HardwareProfile, get_hardware
from ficco.features.ops import OP_SPECS

Op = Literal["ag_gemm", "gemm_rs", "a2a_gemm", "gemm_a2a"]
DType = Literal["bf16", "fp16", "fp32"]
Mode = Literal["eager", "graph"]

OPS: tuple[str, ...] = get_args(Op)
MOE_OPS: tuple[str, ...] = tuple(name for name, spec in OP_SPECS.items() if spec.moe)
DENSE_OPS: tuple[str, ...] = tuple(op for op in OPS if op not in MOE_OPS)
"""The tensor-parallel ops (``ag_gemm``, ``gemm_rs``)."""
DTYPES: tuple[str, ...] = get_args(DType)
DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4}
MODES: tuple[str, ...] = get_args(Mode)
"""Execution modes a schedule is measured and recommended in: ``eager`` (each call launched from Python)
or ``graph`` (the calls replayed from a captured CUDA graph); the best schedule can differ."""
MIN_WORLD_SIZE, MAX_WORLD_SIZE = 2, 8
MAX_DIM = 1 << 20
"""Largest m, n or k accepted (2**20): far past any layer, small enough to catch unit mistakes."""


def default_world_size(hardware: HardwareProfile) -> int:
    """The world size a request that names none is for: ``hardware``'s GPU count (within
    ``[MIN_WORLD_SIZE, MAX_WORLD_SIZE]``), so an answer never assumes fewer GPUs than the hardware named
    without being asked to (docs/models.md)."""
    return max(MIN_WORLD_SIZE, min(MAX_WORLD_SIZE, hardware.gpu_count))


@dataclass(frozen=True, kw_only=True, slots=True)
class Scenario(JsonRoundTrip):
    """One communication + GEMM pair as a runtime meets it (shapes: docs/shapes.md)."""

    op: Op = "ag_gemm"
    """Which pair: ``ag_gemm``, ``gemm_rs``, ``a2a_gemm`` or ``gemm_a2a``."""
    m: int = 4096
    """Rows: tokens (gathered, for ``ag_gemm``; before the scatter, for ``gemm_rs``; per rank, for MoE)."""
    n: int = 4096
    """Output features of the GEMM on one rank."""
    k: int = 4096
    """Reduction dimension of the GEMM on one rank."""
    dtype: DType = "bf16"
    """Element type of A, B and C."""
    world_size: int = 2
    """Ranks in the tensor/expert-parallel group, in [2, 8]."""
    hardware: HardwareProfile = field(default_factory=lambda: get_hardware(DEFAULT_HARDWARE_ID))
    """The machine; ``world_size`` may not exceed its ``gpu_count``."""
    experts: int = 0
    """MoE only: experts in the layer (a multiple of ``world_size``); 0 for dense ops."""
    top_k: int = 0
    """MoE only: experts each token is routed to, in [1, experts]; 0 for dense ops."""
    imbalance: float = 1.0
    """MoE only: busiest rank's routed rows over the mean, in [1, world_size]; 1.0 for dense ops."""

    def __post_init__(self) -> None:
        check_choice("Scenario", "op", self.op, OPS)
        for name in ("m", "n", "k"):
            check_int("Scenario", name, getattr(self, name), 1, MAX_DIM)
        check_choice("Scenario", "dtype", self.dtype, DTYPES)
        check_int("Scenario", "world_size", self.world_size, MIN_WORLD_SIZE, MAX_WORLD_SIZE)
        if not isinstance(self.hardware, HardwareProfile):
            raise ValueError(
                f"Scenario.hardware must be a HardwareProfile; got {type(self.hardware).__name__}"
            )
        if self.world_size > self.hardware.gpu_count:
            raise ValueError(
                f"Scenario.world_size must be <= hardware.gpu_count={self.hardware.gpu_count} "
                f"({self.hardware.id}); got {self.world_size}"
            )
        if self.op in MOE_OPS:
            self._check_moe()
        else:
            for name, dense_value in (("experts", 0), ("top_k", 0), ("imbalance", 1.0)):
                if getattr(self, name) != dense_value:
                    raise ValueError(
                        f"Scenario.{name} applies only to MoE ops {list(MOE_OPS)}; "
                        f"for op {self.op!r} it must be {dense_value}; got {getattr(self, name)!r}"
                    )
        if self.rows % self.world_size:
            if self.op in MOE_OPS:
                raise ValueError(
                    f"Scenario.m * top_k must be divisible by world_size={self.world_size} for op "
                    f"{self.op!r} (each rank sends m * top_k / world_size rows to each peer); "
                    f"got m={self.m}, top_k={self.top_k}"
                )
            raise ValueError(
                f"Scenario.m must be divisible by world_size={self.world_size} for op {self.op!r} "
                f"(each rank owns m / world_size rows); got {self.m}"
            )

    def _check_moe(self) -> None:
        check_int("Scenario", "experts", self.experts, self.world_size, 1024)
        if self.experts % self.world_size:
            raise ValueError(
                f"Scenario.experts must be a multiple of world_size={self.world_size}; got {self.experts}"
            )
        check_int("Scenario", "top_k", self.top_k, 1, self.experts)
        check_float("Scenario", "imbalance", self.imbalance, 1.0, float(self.world_size))

    # Derived sizes --------------------------------------------------------------------------------

    @property
    def rows(self) -> int:
        """Rows the communication is split along: ``m`` (dense) or ``m * top_k`` (MoE)."""
        return self.m * self.top_k if self.op in MOE_OPS else self.m

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def gemm_flops(self) -> float:
        """Multiply-add FLOPs of the GEMM work on one rank (2 * rows * n * k; MoE: the busiest rank)."""
        return 2.0 * self.rows * self.n * self.k * (self.imbalance if self.op in MOE_OPS else 1.0)

    @property
    def comm_bytes(self) -> float:
        """Bytes one rank (for MoE the busiest) receives from its peers: ``(w-1)/w`` of the split rows, of
        width :attr:`comm_width` (``ag_gemm``: A's peer shards; ``gemm_rs``: C's partial row blocks)."""
        w = self.world_size
        load = self.imbalance if self.op in MOE_OPS else 1.0
        return (w - 1) / w * self.rows * self.comm_width * self.dtype_bytes * load

    @property
    def comm_width(self) -> int:
        """Columns of a communicated row: ``k`` when the collective feeds the GEMM, ``n`` when the GEMM
        feeds it (``OpSpec.comm_width``)."""
        return OP_SPECS[self.op].comm_width(self.k, self.n)

    @property
    def gemm_bytes(self) -> float:
        """Fewest device-memory bytes of the GEMM: A, B (per local expert for MoE) and C once each."""
        weights = self.k * self.n * (self.experts // self.world_size if self.op in MOE_OPS else 1)
        return (self.rows * self.k + weights + self.rows * self.n) * self.dtype_bytes

    def key(self) -> str:
        """A readable, unique id, e.g. ``ag_gemm-m8192-n14336-k4096-bf16-w2-h200x2``."""
        moe = f"-e{self.experts}-t{self.top_k}-i{self.imbalance:g}" if self.op in MOE_OPS else ""
        return (
            f"{self.op}-m{self.m}-n{self.n}-k{self.k}-{self.dtype}-w{self.world_size}{moe}-{self.hardware.id}"
        )

    # JSON round trip -------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        # JsonRoundTrip's by name: a zero-argument super() fails in a slots=True dataclass before Python 3.14
        return {**JsonRoundTrip.to_dict(self), "hardware": self.hardware.to_dict()}

    @classmethod
    def _from_json_values(cls, data: dict[str, Any]) -> dict[str, Any]:
        """``hardware`` may be a full profile object or a built-in id."""
        data = dict(data)
        hw = data.get("hardware")
        if isinstance(hw, str):
            data["hardware"] = get_hardware(hw)
        elif isinstance(hw, dict):
            data["hardware"] = HardwareProfile.from_dict(hw)
        return data

    def shape_dict(self) -> dict[str, Any]:
        """The fields of :data:`SHAPE_FIELDS` as plain values (a dataset row's scenario columns)."""
        return {name: kind(getattr(self, name)) for name, kind in SHAPE_FIELDS.items()}


SHAPE_FIELDS: dict[str, type] = {
    f.name: type(f.default) for f in dataclasses.fields(Scenario) if f.name != "hardware"
}
"""Every field of ``Scenario`` but ``hardware``, in declaration order, with its Python type: the scenario's
columns in a dataset (``features.dataset``), which rebuilds a scenario from them and a hardware profile."""
