"""Request and response schemas (pydantic v2), one family per resource.

Field constraints mirror ``features`` (ops, dtypes, ``m``/``n``/``k`` in [1, 2**20], world size in
[2, 8], ...), so a bad field fails here with a 422 naming it; rules across fields (divisibility,
``world_size <= gpu_count``) are checked when the ``Scenario`` is built (``service.engine``) and give
the same 422 shape. ``ALLOWED`` maps each field name to the allowed values, for error messages.
"""

from __future__ import annotations

import typing
from typing import Annotated, Any, Literal

from annotated_types import Ge, Le, MaxLen, MinLen
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.fields import FieldInfo
from typing_extensions import TypedDict

from ficco.features._validate import check_keys
from ficco.features.launch_cost import HOST_FACTOR_RANGE
from ficco.features.provenance import ModelBackend
from ficco.features.scenario import MAX_DIM, MAX_WORLD_SIZE, MIN_WORLD_SIZE, DType, Mode, Op
from ficco.training.predict.coverage import NEIGHBOUR_FACTOR, OFF_MAP_BELOW

MAX_EXPERTS = 1024
MAX_TOKEN_COUNTS = 32
HARDWARE_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"

MODE_DESCRIPTION = (
    "How the layer runs: eager (each kernel launched from Python) or graph (the layer runs inside a "
    "replayed CUDA graph); the best schedule can differ."
)
HostFactor = Annotated[float, Field(ge=HOST_FACTOR_RANGE[0], le=HOST_FACTOR_RANGE[1])]
HOST_FACTOR_DESCRIPTION = (
    "Eager mode: this machine's host time per launch over the executor's host prices (features.launch_cost; "
    "a dataset card's 'Host speed' gives a measured machine's); null = the model's training data's. A slower "
    "host moves small shapes toward schedules of fewer launches."
)

PICK_REASON_DESCRIPTION = (
    "Why schedule is not the one of highest predicted speedup: the fallback, a tie within the model's "
    "noise band, or the model's ranker ordering it first against the regressor's speedups; null when it is."
)
NEIGHBOURS_DESCRIPTION = (
    "Measured neighbours: rows of the answering model's training data with the same op, mode, world size "
    f"and dtype and m, n, k each within {NEIGHBOUR_FACTOR}x of the scenario's. Fewer than "
    f"{OFF_MAP_BELOW['graph']} in graph mode is an answer off the measured map, which the runtime planner "
    "runs serial/sm by default (docs/planner.md); null from a model that carries no coverage."
)
MODEL_BACKEND_DESCRIPTION = (
    "measured: the model was trained on GPU measurements only; simulated: on simulated rows (registered "
    "apart as <hardware>-sim, answering only when asked for by that id). See docs/models.md."
)


class SimFidelity(TypedDict):
    """How far a simulated model's training rows are from measurements: its card's ``sim_fidelity``
    (``harness.sim.sim_fidelity``; docs/simulator.md)."""

    sim_model: str
    """The simulator's model version that made the rows (``harness.sim.SIM_MODEL_VERSION``)."""
    held_out_regret: dict[str, dict[str, float]]
    """World size -> mode -> geometric-mean regret of the simulator's own picks on measured times of model
    families its fit never saw (``benchmarks/results/sim-fidelity.json``)."""
    measured_world_sizes: list[int]
    """World sizes the simulator was fitted and scored at; others extrapolate."""
    world_size_note: str
    """What the model's world size is to those: measured, or extrapolated and how far."""
    guard_min_gain: dict[str, float | None]
    """Mode -> predicted gain over serial/sm below which an answer falls back to serial: the guard against
    picks slower than serial (null: no guard)."""


SIM_FIDELITY_DESCRIPTION = (
    "A simulated model's fidelity (null for a measured one): the held-out regret of the simulator's own "
    "picks on measured times at the world sizes it was fitted at, whether this world size extrapolates, and "
    "the guard against picks slower than serial (docs/simulator.md)."
)

RANGE_NOTE_DESCRIPTION = (
    "Null when the scenario's m (tokens) lies within the model's training data (within 2x of it); else a "
    "note that the answer extrapolates past it, naming how far."
)

WORLD_SIZE_RULE = (
    f"[{MIN_WORLD_SIZE}, {MAX_WORLD_SIZE}] bounds every hardware profile; null (or absent): the hardware's "
    "GPU count, so an answer never assumes fewer GPUs than the hardware named. A hardware's model answers "
    "only the world sizes it was trained at (its card's world_sizes in GET /v1/models: 2 for h200x2, 4 "
    "for h200x4), a world size named explicitly may be answered by the measured model of the same GPU "
    "trained at it (the answer's substitution says so), and another gets a 422 whose 'allowed' names the "
    "world sizes that hardware is answered at."
)
WORLD_SIZE_DESCRIPTION = "Ranks in the tensor/expert-parallel group. " + WORLD_SIZE_RULE

Dim = Annotated[int, Field(strict=True, ge=1, le=MAX_DIM)]
WorldSize = Annotated[int, Field(strict=True, ge=MIN_WORLD_SIZE, le=MAX_WORLD_SIZE)]
Experts = Annotated[int, Field(strict=True, ge=0, le=MAX_EXPERTS)]
HardwareId = Annotated[str, Field(pattern=HARDWARE_PATTERN)]


class _Request(BaseModel):
    """Base of request bodies: unknown fields are refused with the list of allowed ones."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _check_keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.keys() <= cls.model_fields.keys():  # fast path: all known
            check_keys(cls.__name__, data, cls.model_fields)
        return data


# Scenario: one communication + GEMM pair as a runtime meets it (features.Scenario, hardware by id)
class ScenarioIn(_Request):
    op: Op = Field(description="Which pair: ag_gemm, gemm_rs, a2a_gemm or gemm_a2a.")
    m: Dim = Field(description="Rows (tokens); see features/scenario.py for each op's convention.")
    n: Dim = Field(description="Output features of the GEMM on one rank.")
    k: Dim = Field(description="Reduction dimension of the GEMM on one rank.")
    dtype: DType = Field(default="bf16", description="Element type: bf16, fp16 or fp32.")
    world_size: WorldSize | None = Field(default=None, description=WORLD_SIZE_DESCRIPTION)
    hardware: HardwareId | None = Field(
        default=None, description="Hardware id (e.g. h200x2); null = the server's default hardware."
    )
    experts: Experts = Field(default=0, description="MoE only: experts; 0 dense.")
    top_k: Experts = Field(default=0, description="MoE only: experts per token.")
    imbalance: float = Field(
        default=1.0,
        strict=True,
        ge=1.0,
        le=float(MAX_WORLD_SIZE),
        description="MoE only: busiest / mean load.",
    )
    mode: Mode = Field(default="eager", description=MODE_DESCRIPTION)
    host_factor: HostFactor | None = Field(default=None, description=HOST_FACTOR_DESCRIPTION)

    def cache_key(self) -> tuple:
        """The fields that decide a model's answer (the hardware picks the model, so it is not included)."""
        return (
            self.op,
            self.m,
            self.n,
            self.k,
            self.dtype,
            self.world_size,
            self.experts,
            self.top_k,
            self.imbalance,
            self.mode,
            self.host_factor,
        )


# Recommendation: the model's answer for one scenario (frozen: cached answers are shared)
class SubstitutionPublic(BaseModel):
    """Another hardware's model answers: which, and how its hardware differs from the one named."""

    model_config = ConfigDict(frozen=True)

    requested_hardware: str = Field(description="The hardware id the request named (or the default).")
    answered_hardware: str = Field(description="The hardware id of the model that answers.")
    world_size: int = Field(description="The world size answered, as the request named it.")
    reason: str = Field(description="Why, in one line (the text of hardware_substitution).")
    differs: dict[str, list[Any]] = Field(
        description="The profile figures that differ: field -> [requested hardware's, answering model's], "
        "e.g. {'gpu_count': [8, 2]}."
    )


def substitution_public(requested: str, world_size: int, substitution: Any) -> SubstitutionPublic | None:
    """The answer's ``substitution`` for a ``service.core.store.Substitution`` (None: none)."""
    if substitution is None:
        return None
    return SubstitutionPublic(
        requested_hardware=requested,
        answered_hardware=substitution.answered_hardware,
        world_size=world_size,
        reason=substitution.reason,
        differs={k: list(v) for k, v in substitution.differs.items()},
    )


SUBSTITUTION_DESCRIPTION = (
    "Null when the requested hardware's own model answered; else which model did, for which world size, and "
    "the profile figures in which its hardware differs. Only a world size the request names explicitly is "
    "answered by another hardware's model of another GPU count."
)


class RecommendationPublic(BaseModel):
    model_config = ConfigDict(frozen=True)

    schedule: str = Field(description="The recommended schedule, e.g. finer/dma/s4/chunk.")
    mode: str = Field(description="Execution mode the answer is for: eager or graph (CUDA-graph replay).")
    predicted_speedups: dict[str, float] = Field(
        description="Predicted serial time / schedule time of every schedule valid for the scenario."
    )
    predicted_speedup: float | None = Field(description="Predicted serial time / recommended time, if known.")
    fallback: bool = Field(description="True when the safe fallback (serial) replaced the model's choice.")
    fallback_reason: str | None = Field(description="Why the fallback fired.")
    pick_reason: str | None = Field(default=None, description=PICK_REASON_DESCRIPTION)
    model_version: str = Field(description="Version of the model that answered.")
    hardware_id: str = Field(description="Hardware profile of the model that answered.")
    world_size: int | None = Field(
        default=None,
        description="The world size the answer is for: the request's, or the hardware's GPU count when it "
        "named none; null only from servers that predate it.",
    )
    model_backend: ModelBackend | None = Field(
        default=None, description=MODEL_BACKEND_DESCRIPTION + " Null only from servers that predate it."
    )
    host_factor: float | None = Field(
        default=None,
        description="The host factor the answer is for (the model's training data's unless the request "
        "named one); null from servers that predate it.",
    )
    neighbours: int | None = Field(default=None, description=NEIGHBOURS_DESCRIPTION)
    sim_fidelity: SimFidelity | None = Field(default=None, description=SIM_FIDELITY_DESCRIPTION)
    requested_hardware: str = Field(description="Hardware id the request named (or the server default).")
    hardware_substitution: str | None = Field(
        description="Null when the requested hardware's own model answered; else the profile used and why "
        "(substitution gives the same as fields)."
    )
    substitution: SubstitutionPublic | None = Field(default=None, description=SUBSTITUTION_DESCRIPTION)
    range_note: str | None = Field(default=None, description=RANGE_NOTE_DESCRIPTION)


class RecommendBatchRequest(_Request):
    scenarios: list[ScenarioIn] = Field(
        min_length=1,
        description="Scenarios to answer (1 to the server's MAX_BATCH); each is validated and answered on "
        "its own (a bad one is an error item, the others are answered).",
    )


# Errors: every 4xx body
class FieldErrorPublic(BaseModel):
    loc: list[str | int] = Field(description="Where the bad value is, e.g. ['body', 'scenarios', 3, 'op'].")
    field: str = Field(description="The same as a dotted path without 'body', e.g. 'scenarios.3.op'.")
    input: Any = Field(description="The bad value (long values are shortened).")
    msg: str
    type: str
    allowed: str | None = Field(description="What the field accepts.")


class ValidationErrorPublic(BaseModel):
    detail: list[FieldErrorPublic]


class RecommendationItemPublic(BaseModel):
    index: int = Field(description="Position of the scenario in the request's scenarios.")
    status: Literal["ok", "error"] = Field(description="ok: answered (result); error: refused (errors).")
    result: RecommendationPublic | None = Field(description="The answer, as POST /v1/recommend gives it.")
    errors: list[FieldErrorPublic] | None = Field(
        description="Why the scenario was refused, located in the request (e.g. scenarios.3.m), with the "
        "status a single request would get: 422 items, and for a hardware id nobody knows the type "
        "unknown_hardware (404 alone)."
    )


class RecommendationsPublic(BaseModel):
    data: list[RecommendationItemPublic] = Field(description="One item per scenario, in the request's order.")
    count: int
    failed: int = Field(default=0, description="Items whose status is error.")


class ErrorPublic(BaseModel):
    detail: str


class UnknownHardwarePublic(BaseModel):
    detail: str
    known_ids: list[str]


# Score: a Hugging Face model config -> its layers' pairs, schedules and projected savings
KvLayout = Literal["megatron", "vllm"]
KV_LAYOUT_DESCRIPTION = (
    "How KV heads split over more tensor-parallel ranks than there are heads: megatron refuses (as "
    "Megatron-LM does), vllm replicates one KV head per rank (as vLLM does)."
)
MAX_SCORE_CONFIGS = 64
"""Most model configs in one POST /v1/score/batch."""
MAX_TABLE_SHAPES = 64
"""Most shapes one POST /v1/tables may ask for (listed, or a posted config's): a table asks the model at
about 1,500 token counts per shape, so 64 shapes are ~10^5 decisions (seconds of a worker's CPU)."""


class ScoreSettings(_Request):
    """How the model configs of a score request are split and run."""

    tp: WorldSize | None = Field(
        default=None, description="Tensor-parallel degree (the pairs' world size). " + WORLD_SIZE_RULE
    )
    tokens: list[Dim] = Field(
        min_length=1, max_length=MAX_TOKEN_COUNTS, description="Token counts (m of the pairs) to score."
    )
    dtype: DType = Field(default="bf16", description="Element type: bf16, fp16 or fp32.")
    hardware: HardwareId | None = Field(default=None, description="Hardware id; null = the server default.")
    mode: Mode = Field(default="eager", description=MODE_DESCRIPTION)
    host_factor: HostFactor | None = Field(default=None, description=HOST_FACTOR_DESCRIPTION)
    kv_layout: KvLayout = Field(default="megatron", description=KV_LAYOUT_DESCRIPTION)


class NamedConfig(_Request):
    config: dict[str, Any] = Field(description="The model's Hugging Face config.json, as an object.")
    name: Annotated[str, Field(min_length=1, max_length=200)] | None = Field(
        default=None, description="Model name for the answer; null = config's _name_or_path or 'model'."
    )


class ScoreRequest(NamedConfig, ScoreSettings):
    """One model config and how to split it."""


class ScoreBatchRequest(ScoreSettings):
    configs: list[NamedConfig] = Field(
        min_length=1, max_length=MAX_SCORE_CONFIGS, description="The model configs, each scored alike."
    )


class ScenarioPublic(BaseModel):
    op: str
    m: int
    n: int
    k: int
    dtype: str
    world_size: int
    experts: int
    top_k: int
    imbalance: float


class PairScore(BaseModel):
    name: str = Field(
        description="Pair in the layer: qkv, attn_out, mlp_up, mlp_down, moe_dispatch, moe_combine, "
        "shared_up, shared_down (shared experts); a parallel attention+MLP block (Cohere) is scored as two "
        "pairs, qkv_mlp_up (QKV and gate/up fused along n) and attn_mlp_out (attention-out and down fused "
        "along k)."
    )
    per_layer: int = Field(description="Times the pair runs in one transformer layer (forward).")
    layers: int = Field(
        description="Layers of the model the pair runs in (an MoE model's dense first layers have the MLP "
        "pairs, its other layers the expert pairs)."
    )
    scenario: ScenarioPublic
    measured: bool = Field(
        description="False when the model has no measured data for this pair's op (e.g. MoE all-to-all): "
        "then schedule is 'not measured' and no time or saving is projected for it."
    )
    schedule: str
    predicted_speedup: float | None
    fallback: bool
    fallback_reason: str | None
    pick_reason: str | None = Field(default=None, description=PICK_REASON_DESCRIPTION)
    neighbours: int | None = Field(default=None, description=NEIGHBOURS_DESCRIPTION)
    serial_us: float = Field(
        description="Estimated serial time of one call, microseconds (see serial_time_estimate)."
    )
    predicted_us: float | None = Field(description="serial_us / predicted_speedup; null without a speedup.")
    saved_us_per_layer: float | None = Field(description="(serial_us - predicted_us) * per_layer.")


class TokenScore(BaseModel):
    tokens: int
    pairs: list[PairScore]
    serial_us_per_layer: float = Field(
        description="Serial time of one forward pass's pairs (serial_us * per_layer * layers, summed) over "
        "the model's layers: the mean layer (an MoE model's dense and expert layers run different pairs)."
    )
    saved_us_per_layer: float = Field(
        description="saved_us_per_step over the model's layers: the mean layer's saving (null ones count 0)."
    )
    saved_us_per_step: float = Field(
        description="Sum over the pairs of saved_us_per_layer * the pair's layers: one forward pass."
    )
    saved_fraction: float = Field(description="saved_us_per_step / the step's serial time.")
    range_note: str | None = Field(default=None, description=RANGE_NOTE_DESCRIPTION)


class ScorePublic(BaseModel):
    model: str
    layers: int = Field(description="num_hidden_layers of the config.")
    tp: int
    dtype: str
    mode: Mode = Field(default="eager", description=MODE_DESCRIPTION)
    model_version: str
    hardware_id: str
    model_backend: ModelBackend | None = Field(
        default=None, description=MODEL_BACKEND_DESCRIPTION + " Null only from servers that predate it."
    )
    sim_fidelity: SimFidelity | None = Field(default=None, description=SIM_FIDELITY_DESCRIPTION)
    requested_hardware: str
    hardware_substitution: str | None
    substitution: SubstitutionPublic | None = Field(default=None, description=SUBSTITUTION_DESCRIPTION)
    config_note: str | None = Field(
        default=None,
        description="Null, or what of the config is not scored as given: e.g. a quantization_config (fp8 "
        "weights) scored at the request's dtype.",
    )
    serial_time_estimate: Literal["roofline"] = Field(
        description="How serial_us is estimated: roofline = features.roofline_gemm_us + roofline_comm_us."
    )
    estimate_note: str
    data: list[TokenScore]
    count: int


class ScoreItemPublic(BaseModel):
    index: int = Field(description="Position of the config in the request's configs (or the files given).")
    name: str = Field(description="The model's name: the request's, else _name_or_path, else 'model'.")
    status: Literal["ok", "error"] = Field(description="ok: scored (result); error: refused (errors).")
    result: ScorePublic | None = Field(description="The config's answer, as POST /v1/score gives it.")
    errors: list[FieldErrorPublic] | None = Field(
        description="Why the config was refused, located in the request (e.g. configs.3.config)."
    )


class ScoresPublic(BaseModel):
    data: list[ScoreItemPublic] = Field(description="One item per config, in the request's order.")
    count: int
    failed: int = Field(description="Items whose status is error.")


# Models: what the registry holds and what is being served


class ModelVersionPublic(BaseModel):
    version: str
    current: bool = Field(description="True for the version CURRENT names (the promoted one).")
    serving: bool = Field(description="True for the version this process answers with.")
    card: dict[str, Any] = Field(description="The model card: data hash, metrics, feature schema, ...")


class HardwareModelsPublic(BaseModel):
    hardware_id: str
    current: str | None
    serving: str | None
    versions: list[ModelVersionPublic]


class ModelsPublic(BaseModel):
    data: list[HardwareModelsPublic]
    count: int


class ReloadPublic(BaseModel):
    outcomes: dict[str, str] = Field(
        description="hardware id -> 'loaded V', 'unchanged V' or 'failed V: error'."
    )
    serving: dict[str, str]
    last_reload_error: str | None


# Health: liveness and readiness
class HealthPublic(BaseModel):
    status: Literal["ok"] = "ok"


class ReadyPublic(BaseModel):
    ready: bool = Field(
        description="True when a model is loaded, every batch worker is warm and (FICCO_TABLE_PREFETCH) the "
        "grid tables GET /v1/tables serves for the versions served at start-up are ready."
    )
    serving: dict[str, str] = Field(description="hardware id -> version being served.")
    batch_workers_ready: bool = Field(
        default=True,
        description="True when every batch worker process has loaded its models and answered a warm-up "
        "batch (batches sent before wait for it).",
    )
    grid_tables_ready: bool = Field(
        default=True,
        description="True once the grid tables of the versions served at start-up are loaded from the "
        "model's folder or built (always true with FICCO_TABLE_PREFETCH off: built on first request).",
    )
    grid_tables_pending: list[str] = Field(
        default_factory=list,
        description="Grid tables not ready yet, e.g. 'h200x2 tp=2 graph bf16' (a newly promoted version's "
        "too: those do not hold readiness back).",
    )
    default_hardware: str
    last_reload_error: str | None = Field(description="The latest failed load, if the last one failed.")


# Tables
class TableQuery(BaseModel):
    """GET /v1/tables/{hardware_id}'s query, and what every table request names: which table."""

    tp: int | None = Field(
        None,
        ge=MIN_WORLD_SIZE,
        le=MAX_WORLD_SIZE,
        description="World size (tensor-parallel degree); null: the hardware's GPU count. A table comes only "
        "from the hardware's own model, at a world size it was trained at.",
    )
    mode: Mode = Field("graph", description=MODE_DESCRIPTION)
    dtype: DType = Field("bf16", description="Element type.")
    allow_simulated: bool = Field(
        False, description="Serve the table of a model trained on simulated data, marked simulated."
    )


class TableRequest(_Request, TableQuery):
    """POST /v1/tables/{hardware_id}: which table, for which shapes."""

    config: dict[str, Any] | None = Field(None, description="A Hugging Face config.json: its layers' shapes.")
    shapes: list[str] | None = Field(
        None,
        max_length=MAX_TABLE_SHAPES,
        description=f"op:n:k (dense) or op:n:k:experts:top_k (MoE) shapes, at most {MAX_TABLE_SHAPES} (with "
        "a config's).",
    )


def _num(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def _allowed(info: FieldInfo) -> str:
    """Describe what a field accepts from its annotation and constraints, e.g. 'an int in [1, 1048576]'."""
    annotation, args = info.annotation, typing.get_args(info.annotation)
    limits = {type(c): c for c in info.metadata}
    if type(None) in args:
        inner = next(a for a in args if a is not type(None))
        return f"{_allowed(FieldInfo.from_annotation(inner))} or null"
    if typing.get_origin(annotation) is Literal:
        return f"one of {list(args)}"
    if typing.get_origin(annotation) is list:
        lo, hi = getattr(limits.get(MinLen), "min_length", 0), getattr(limits.get(MaxLen), "max_length", None)
        count = f"{lo} to {hi}" if hi is not None else f"at least {lo}"
        return f"a list of {count} items, each {_allowed(FieldInfo.from_annotation(args[0]))}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"a {annotation.__name__} object"
    if Ge in limits and Le in limits:
        kind = "an int" if annotation is int else "a number"
        return f"{kind} in [{_num(limits[Ge].ge)}, {_num(limits[Le].le)}]"
    pattern = next((c.pattern for c in info.metadata if getattr(c, "pattern", None)), None)
    if pattern:
        return f"a string matching {pattern}"
    if annotation is str:
        lo, hi = getattr(limits.get(MinLen), "min_length", 0), getattr(limits.get(MaxLen), "max_length", None)
        return f"a string of {lo} to {hi} characters"
    return "a JSON object" if typing.get_origin(annotation) is dict else str(annotation)


ALLOWED: dict[str, str] = {
    name: _allowed(info)
    for model in (TableRequest, ScenarioIn, RecommendBatchRequest, ScoreRequest)
    for name, info in model.model_fields.items()
}
"""Field name -> what it accepts; the field names are unique across the request schemas."""
