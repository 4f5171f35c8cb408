"""torch.compile runs ficco's schedules, model code unchanged: an Inductor pass that rewrites what PyTorch's
micro-pipeline TP pass (async-TP) rewrites into ficco's ops: ``report = ficco.runtime.compile.enable()``
before the first ``torch.compile``; ``report.table()`` says what was rewritten, what was left and why.

:class:`FiccoPass` (on ``torch._inductor.config.post_grad_custom_post_pass``) finds the sites with
``runtime.compile_sites`` and decides each op's schedule at compile time: once for a static token count, a
token-range table over ``token_points`` for a dynamic one. What it rewrites, the report's reasons and
Inductor's graph cache: docs/runtimes.md ("Use with torch.compile").
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

from ficco.features import Mode, Schedule
from ficco.runtime.compile_report import QUIET, CompileReport, Left, Rewrite
from ficco.runtime.compile_sites import Site, Skipped, find_sites
from ficco.runtime.planner import (
    DEFAULT_TOKEN_POINTS,
    Direction,
    OpRequest,
    Schedules,
    as_planner,
    deprecated_timeout,
    token_table,
)

log = logging.getLogger(__name__)

_FILES = tuple(
    str(Path(__file__).with_name(f)) for f in ("compile.py", "compile_sites.py", "planner.py", "sources.py")
)
"""What a rewrite depends on besides the schedule source: the pass, its patterns and the planner's rules."""


class FiccoPass(CustomGraphPass):
    """The Inductor pass :func:`enable` installs; its :attr:`report` fills as graphs compile. The parameters
    are :func:`enable`'s."""

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
        cache) for a source decided collectively (a rank that found a graph cached would leave the others
        waiting in the agreement) or whose answers may depend on state (docs/runtimes.md)."""
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
            shape = {"op": site.op, "n": sum(site.n), "k": site.k, "dtype": site.dtype, "world_size": w}
            layer = ",".join(site.layers)
            requests += [OpRequest(m=m, layer=layer, direction=direction, **shape) for m in points]
        answers = self._schedules(requests) if requests else []
        out = []
        for start, points in spans:
            picks = answers[start : start + len(points)]
            notes = sorted({note for _, note in picks if note})
            out.append((token_table(points, [s for s, _ in picks]), "; ".join(notes)))
        return out

    def _schedules(self, requests: list[OpRequest]) -> list[tuple[Schedule, str]]:
        """Each request's schedule and, where the planner fell back to serial, why: decided in one batch
        (rank 0 of the planner's group asks a collective source, every rank agrees)."""
        planner = self.planner
        planner.prepare(requests)
        return [(planner.schedule(r), planner.decisions[planner.key(r)].reason or "") for r in requests]


def _rewrite(site: Site, index: int, direction: Direction, schedule: str, note: str) -> Rewrite:
    """The report's entry of a rewrite made, logged in one line."""
    shared = {
        f: getattr(site, f) for f in ("op", "layers", "found", "group", "world_size", "n", "k", "dtype")
    }
    m = int(site.m) if is_concrete_int(site.m) else None
    r = Rewrite(graph=index, direction=direction, m=m, schedule=schedule, note=note, **shared)
    what = f"{r.op} {','.join(r.layers)} on group {r.group} (w={r.world_size}): {r.shape} -> {schedule}"
    what += f" ({note})" if note else ""
    log.info("ficco.runtime.compile: graph %d (%s) %s", index, direction, what)
    return r


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
        Where each op's schedule comes from, in any form ``runtime.as_planner`` takes (a function is asked
        ``(op, m, n, k, dtype, world_size)`` on every rank, ``n`` summed over the weights of one gather;
        None: this machine's measured model, else ``serial/sm`` with one warning).
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


__all__ = ["DEFAULT_TOKEN_POINTS", "CompileReport", "FiccoPass", "Left", "Rewrite", "disable", "enable"]
