"""One-GPU tests (marker ``gpu``) of the executor's CUDA stream, event and graph-capture code at 2, 4 and 8
ranks, in a loopback world (``harness.loopback``): this process is rank 0 of a pretend world whose
collectives move nothing and whose peer memory is local and zeroed, so the side lanes, events, barriers and
captures of 4 and 8 ranks run on a machine with one GPU. Every op, case and schedule of the 2-GPU check
(``executor_gpu_check``: all 30 schedules; the MoE ops on their four routings, grouped expert GEMMs
included) runs three times eagerly, then is captured into a CUDA graph and replayed, which must write what
the eager call wrote (same inputs and output; the fake transfers leave the same bytes behind both times).
The copy-engine schedules of the dense ops must also give serial's answer for peers that hold zeros. What
the peers would have sent is not checked here: that is the 2-GPU check's. Skipped without a CUDA GPU."""

from __future__ import annotations

import executor_gpu_check as check
import pytest
import torch

from ficco import executor
from ficco.features import OP_SPECS, Routing, Scenario, candidates
from ficco.harness.loopback import loopback_world

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _zero_peers(op: str, a: torch.Tensor, b: torch.Tensor, world: int) -> torch.Tensor:
    """Serial's answer on rank 0 when every peer's input is zero: ``ag_gemm``, the gathered A holds rank 0's
    shard on top and zeros below, times ``b``; ``gemm_rs``, rank 0's block of ``a @ b`` alone."""
    if op == "ag_gemm":
        gathered = torch.zeros(a.shape[0] * world, a.shape[1], device=a.device, dtype=a.dtype)
        gathered[: a.shape[0]] = a
        return gathered @ b
    return (a @ b)[: a.shape[0] // world]


def _same(got: torch.Tensor, want: torch.Tensor) -> str:
    """'' when ``got`` equals ``want`` within bf16 tolerance with non-finite values in the same places (a
    fake receive leaves whatever its buffer held, NaN included), else the reason."""
    finite = want.isfinite()
    same_places = torch.equal(finite, got.isfinite())
    if not same_places or not torch.equal(want[~finite].isnan(), got[~finite].isnan()):
        return "non-finite values differ"
    return check._compare(torch.where(finite, got, 0), torch.where(finite, want, 0))


def _failures(op: str, scenario: Scenario, world: int, device: torch.device) -> list[str]:
    """What went wrong for each schedule of ``scenario`` (empty: nothing)."""
    routing = Routing.for_scenario(scenario) if OP_SPECS[op].moe else None
    a, b = check._inputs(scenario, 1, device)
    out = torch.zeros_like(executor.run_op(op, a, b, "serial/sm", routing=routing))
    failures = []
    for schedule in candidates(scenario):

        def run(schedule=schedule) -> None:
            executor.run_op(op, a, b, schedule, routing=routing, out=out)

        try:
            for _ in range(3):
                out.zero_()
                run()
            eager = out.clone()
            if schedule.executor == "dma" and not OP_SPECS[op].moe:
                why = check._compare(eager, _zero_peers(op, a, b, world))
                if why:
                    failures.append(f"{op} {schedule} eager: {why}")
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                run()
            out.zero_()
            graph.replay()
            torch.cuda.synchronize()
            why = _same(out, eager)
        except Exception as exc:  # report it with the others
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if why:
            failures.append(f"{op} {schedule} graph: {why}")
    return failures


@pytest.mark.parametrize("world", [2, 4, 8])
def test_every_schedule_replays_what_it_wrote_eagerly_in_a_loopback_world(world):
    failures = []
    with loopback_world(world) as device:
        for op in OP_SPECS:
            for label, scenario in check.cases(op, world):
                failures += [f"{label}: {why}" for why in _failures(op, scenario, world, device)]
                executor.clear_buffers()
    assert not failures, f"{len(failures)} failures, e.g. {failures[:5]}"
