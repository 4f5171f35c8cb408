"""torch.compile runs ficco's schedules, model code unchanged: an Inductor pass that rewrites what PyTorch's
micro-pipeline TP pass (async-TP) rewrites into ficco's ops.

    import ficco.runtime.compile

    report = ficco.runtime.compile.enable()             # this machine's measured model (runtime.as_planner)
    model = torch.compile(model)                        # a DTensor tensor-parallel plan, e.g. torchtitan's
    model(tokens).sum().backward()                      # compiles; each rewrite logs one line
    print(report.table())                               # what was rewritten, what was left and why

The pass (:class:`FiccoPass`, on ``torch._inductor.config.post_grad_custom_post_pass``) runs on every graph
Inductor compiles (forward, backward, inference) and rewrites, on a tensor-parallel group of 2 to 8 ranks
(``runtime.compile_sites`` has the patterns, PyTorch's own):

- all-gather -> wait -> one or more matmuls of the gathered input into ``torch.ops.ficco.all_gather_matmul``
  (matmuls that share one gather, ``wq/wk/wv`` or ``w1/w3``, become one op with several weights);
- matmul -> reduce-scatter into ``torch.ops.ficco.matmul_reduce_scatter``;
- matmuls whose outputs are summed -> reduce-scatter (a column-parallel input gradient whose weights share
  the input: q/k/v, gate/up) into one ``matmul_reduce_scatter`` of the concatenated operands;
- PyTorch's ``symm_mem.fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter``, where the micro-pipeline
  pass (``torch._inductor.config._micro_pipeline_tp``) already produced them, into the same ficco ops.

Each op gets its schedule at compile time (:func:`enable`'s ``schedules``: anything ``runtime.as_planner``
takes): a static token count once, a dynamic one at each of ``token_points``, giving a token-range table
(``features.ScheduleTable``) the op resolves per call without a host round trip. Every other collective
of the graph is in the report with the reason it was left (``runtime.compile_report``); a graph with a
group's collectives beside matmuls and nothing rewritten gets a warning. The pass's ``uuid`` keys
Inductor's FX graph cache on the schedule source; a source that decides collectively (a measured model,
the service) bypasses the cache. docs/runtimes.md has the reasons, the cache rules and the measurements.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from torch._inductor import config as inductor_config
from torch._inductor import custom_graph_pass
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files
from torch.fx.experimental.symbolic_shapes import is_concrete_int

from ficco.features import Mode, Schedule, ScheduleTable
from ficco.features.schedule import range_starts
from ficco.runtime.compile_report import QUIET, CompileReport, Left, Rewrite
from ficco.runtime.compile_sites import Site, Skipped, find_sites
from ficco.runtime.planner import Direction, OpRequest, Schedules, as_planner, deprecated_timeout

log = logging.getLogger(__name__)

DEFAULT_TOKEN_POINTS: tuple[int, ...] = tuple(2**i for i in range(6, 18))
"""Token counts (the op's ``m``) a dynamic-shape op is decided at: 64 to 131072, doubling. The table
switches schedule at the geometric mean of two neighbouring points that decided differently."""
_FILES = tuple(
    str(Path(__file__).with_name(f)) for f in ("compile.py", "compile_sites.py", "planner.py", "sources.py")
)
"""What a rewrite depends on besides the schedule source: the pass, its patterns and the planner's rules."""


# Schedule sources -------------------------------------------------------------------------------------------


def _table(points: Sequence[int], schedules: Sequence[Schedule]) -> str:
    """One schedule string, or a token-range table that switches at the geometric mean of two neighbouring
    ``points`` that decided differently (``features.schedule.range_starts``, the rule ``ficco export``'s
    tables share), its first range from 0."""
    firsts, starts = range_starts(points, schedules)
    bounds = (0, *starts[1:])
    return str(ScheduleTable(bounds=bounds, schedules=tuple(schedules[i] for i in firsts)))


# The pass ---------------------------------------------------------------------------------------------------


class FiccoPass(CustomGraphPass):
    """The Inductor pass :func:`enable` installs (the module docstring says what it rewrites); its
    :attr:`report` fills as graphs compile. The parameters are :func:`enable`'s."""

    def __init__(
        self,
        schedules: Schedules = None,
        *,
        mode: Mode = "eager",
        hardware: str | None = None,
        token_points: Sequence[int] = DEFAULT_TOKEN_POINTS,
    ) -> None:
        points = tuple(token_points)
        valid = all(isinstance(p, int) and p >= 1 for p in points) and list(points) == sorted(set(points))
        if not (points and valid):
            raise ValueError(f"token_points must be increasing positive ints; got {list(token_points)!r}")
        self.planner = as_planner(schedules, mode=mode, hardware=hardware)
        self.token_points = points
        from torch._dynamo.utils import counters

        self.report = CompileReport(cache_hits_at_start=counters["inductor"]["fxgraph_cache_hit"])

    def uuid(self) -> bytes | None:
        """Keys the FX graph cache on the pass's files, the schedule source and the token points; None (no
        cache) for a source decided collectively (a model, the service: a rank that found a graph cached
        while another compiled it would leave the other waiting in the agreement) or whose answers may
        depend on state (a closure, a bound method, global data a function reads)."""
        source = self.planner.source
        key = getattr(source, "cache_key", None) if getattr(source, "deterministic", False) else None
        if key is None:
            return None
        return get_hash_for_files(_FILES, f"{key} mode={self.planner.mode} points={self.token_points}")

    def __call__(self, graph: torch.fx.Graph) -> None:
        index = self.report.graphs
        self.report.graphs += 1
        direction: Direction = "bwd-input" if _is_backward(graph) else "fwd"
        found = find_sites(graph)
        sites = [s for s in found if isinstance(s, Site)]
        left = [s.left(index, direction) for s in found if isinstance(s, Skipped)]
        rewritten = []
        for site, (schedule, note) in zip(sites, self._decide(sites, direction), strict=True):
            site.apply(schedule)
            rewritten.append(_rewrite(site, index, direction, schedule, note))
        if sites:
            graph.lint()
        self.report.rewritten += rewritten
        self.report.left += left
        _warn_unrewritten(index, direction, rewritten, left)

    def _decide(self, sites: list[Site], direction: Direction) -> list[tuple[str, str]]:
        """Each site's schedule string (a table for a dynamic token count) and note, asked in one batch."""
        requests, spans = [], []
        for site in sites:
            w = site.world_size
            points = (
                [int(site.m)]
                if is_concrete_int(site.m)
                else sorted({-(-p // w) * w for p in self.token_points})  # rows divide among the ranks
            )
            spans.append((len(requests), points))
            requests += [
                OpRequest(
                    op=site.op,
                    m=m,
                    n=sum(site.n),
                    k=site.k,
                    dtype=site.dtype,
                    world_size=w,
                    layer=",".join(site.layers),
                    direction=direction,
                )
                for m in points
            ]
        answers = self._schedules(requests) if requests else []
        out = []
        for start, points in spans:
            picks = answers[start : start + len(points)]
            notes = sorted({note for _, note in picks if note})
            out.append((_table(points, [s for s, _ in picks]), "; ".join(notes)))
        return out

    def _schedules(self, requests: list[OpRequest]) -> list[tuple[Schedule, str]]:
        """Each request's schedule and, where the planner fell back to serial, why: decided in one batch
        (rank 0 of the planner's group asks a collective source, every rank agrees)."""
        planner = self.planner
        planner.prepare(requests)
        return [(planner.schedule(r), planner.decisions[planner.key(r)].reason or "") for r in requests]


def _rewrite(site: Site, index: int, direction: Direction, schedule: str, note: str) -> Rewrite:
    """The report's entry of a rewrite made, logged in one line."""
    m = int(site.m) if is_concrete_int(site.m) else None
    log.info(
        "ficco.runtime.compile: graph %d (%s) %s %s on group %s (w=%d): m=%s n=%s k=%d %s -> %s%s",
        index,
        direction,
        site.op,
        ",".join(site.layers),
        site.group,
        site.world_size,
        "dyn" if m is None else m,
        "+".join(map(str, site.n)),
        site.k,
        site.dtype,
        schedule,
        f" ({note})" if note else "",
    )
    return Rewrite(
        op=site.op,
        graph=index,
        direction=direction,
        layers=site.layers,
        found=site.found,
        group=site.group,
        world_size=site.world_size,
        m=m,
        n=site.n,
        k=site.k,
        dtype=site.dtype,
        schedule=schedule,
        note=note,
    )


def _is_backward(graph: torch.fx.Graph) -> bool:
    """A backward graph takes the output gradients (AOTAutograd names them ``tangents_*``)."""
    return any(n.op == "placeholder" and n.name.startswith("tangents") for n in graph.nodes)


def _warn_unrewritten(index: int, direction: str, rewritten: list[Rewrite], left: list[Left]) -> None:
    """Warn for each group whose collectives the graph has beside matmuls (or as all-reduces) but none of
    which was rewritten (a collective beside no matmul is listed in the report, not warned about)."""
    done = {r.group for r in rewritten}
    missed = [x for x in left if x.reason not in QUIET]
    for group in sorted({x.group for x in missed} - done):
        reasons = sorted({f"{x.reason} ({x.detail})" for x in missed if x.group == group})
        message = (
            f"ficco.runtime.compile: graph {index} ({direction}) has tensor-parallel collectives beside "
            f"matmuls on group {group!r} but none was rewritten: {'; '.join(reasons)}"
        )
        log.warning(message)
        warnings.warn(message, RuntimeWarning, stacklevel=2)


# Installing -------------------------------------------------------------------------------------------------


def enable(
    schedules: Schedules = None,
    *,
    mode: Mode = "eager",
    hardware: str | None = None,
    token_points: Sequence[int] = DEFAULT_TOKEN_POINTS,
    timeout_s: float | None = None,
) -> CompileReport:
    """Install :class:`FiccoPass` on ``torch._inductor.config.post_grad_custom_post_pass`` for every later
    ``torch.compile`` (beside the passes already there; a previous ficco pass is replaced).

    Parameters
    ----------
    schedules : Planner, ScheduleSource, Schedule, str, callable or None, default=None
        Where each op's schedule comes from, as ``runtime.as_planner`` takes it: a ``runtime.Planner`` (its
        mode, hardware and group); a ``ScheduleSource`` (``PredictorSource``, ``ServiceSource``,
        ``TableSource``, ``FixedSource``, ``FunctionSource``), behind a planner of ``mode`` and ``hardware``;
        one schedule or token-range table for every op (``"shard/dma"``); a function ``(op, m, n, k, dtype,
        world_size) -> schedule`` (``features.Scenario`` conventions, ``n`` summed over the weights of one
        gather), asked on every rank; None: the measured model of this machine's GPUs in the local registry
        (``serial/sm`` with one warning where there is none).
    mode : {"eager", "graph"}, default="eager"
        The execution mode a source is asked about (``graph`` for a step captured with
        ``runtime.GraphedCall``); a planner keeps its own.
    hardware : str, optional
        Hardware id a source is asked about (default: the source's own, else ``h200x2`` at the group's
        size); a planner keeps its own.
    token_points : sequence of int, default=DEFAULT_TOKEN_POINTS
        Token counts, increasing, at which a dynamic-shape op is decided.
    timeout_s : deprecated
        Does nothing (the source bounds its own wait: ``ServiceClient(timeout_s=...)``); goes in the next
        release.

    Returns
    -------
    CompileReport
        Filled as graphs compile: what was rewritten, what was left and why.
    """
    deprecated_timeout("ficco.runtime.compile.enable(timeout_s=...)", timeout_s)
    ficco_pass = FiccoPass(schedules, mode=mode, hardware=hardware, token_points=token_points)
    others = [p for p in _installed() if not isinstance(p, FiccoPass)]
    if others and not hasattr(custom_graph_pass, "get_custom_graph_passes"):
        raise ValueError(
            f"torch {torch.__version__} takes one post_grad_custom_post_pass and {others[0]!r} is installed; "
            "remove it (newer torch versions run several)"
        )
    inductor_config.post_grad_custom_post_pass = ficco_pass if not others else (*others, ficco_pass)
    return ficco_pass.report


def disable() -> None:
    """Remove the ficco pass (other custom passes stay)."""
    others = [p for p in _installed() if not isinstance(p, FiccoPass)]
    inductor_config.post_grad_custom_post_pass = (
        None if not others else others[0] if len(others) == 1 else tuple(others)
    )


def _installed() -> list:
    current = inductor_config.post_grad_custom_post_pass
    if current is None:
        return []
    return list(current) if isinstance(current, list | tuple) else [current]


__all__ = [
    "DEFAULT_TOKEN_POINTS",
    "CompileReport",
    "FiccoPass",
    "Left",
    "Rewrite",
    "disable",
    "enable",
]
