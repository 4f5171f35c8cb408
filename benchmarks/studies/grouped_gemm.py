r"""The MoE ops' expert GEMM on one GPU: one ``torch.mm`` per local expert (the executor's loop,
``executor.experts.ExpertGemms``) against one ``torch._grouped_mm`` call (CUTLASS grouped GEMM on Hopper), on
the expert shapes of the MoE families of ``datasets/moe_configs`` at expert parallelism 2.

    # one GPU (about a minute on an H200): writes OUT/grouped-gemm-h200.json and .md
    python3 -m benchmarks.studies.grouped_gemm --out benchmarks/results
    # plumbing check on the CPU (tiny shapes; torch's CPU fallback of _grouped_mm)
    python3 -m benchmarks.studies.grouped_gemm --cpu-dry-run --out /tmp/grouped-dry

Per case (family, op, tokens): ``E = experts / 2`` local experts get ``tokens * top_k / 2`` routed rows,
spread evenly; ``A [rows, k] @ B[e] [k, n]`` per expert. Variants (``VARIANTS``):

- ``loop``: one ``torch.mm(out=)`` per non-empty expert, into a preallocated output;
- ``grouped``: ``torch._grouped_mm(A, B, offs)`` (``offs``: the experts' cumulative row ends, int32, on the
  device, built once per routing), a new output tensor per call;
- ``grouped_copy``: the same, copied into the preallocated output (what an ``out=`` contract costs).

Each variant is checked against ``loop`` (bf16: max error over the output's largest magnitude <= 2e-2),
then timed in ``--rounds`` rounds, variants in a freshly shuffled order each round: eager, ``CALLS``
back-to-back calls between CUDA events (the host time to issue them beside it, ``<variant>_host_us``), and
graph, one call captured into a CUDA graph and replayed ``CALLS`` times. A variant's time is the median over
rounds, in ms per call.

``--units`` times the executor's own blocks instead (``executor.experts.ExpertGemms``): for each case and
each of ``UNIT_SCHEDULES``, the expert GEMMs of every unit of rank 0's plan, as a ``loop`` (one ``torch.mm``
per segment) and ``grouped`` (one ``torch._grouped_mm`` and the row copies the unit needs), each checked
against the loop, eagerly and after a CUDA graph replay. The report prices every candidate
``GROUPED_MIN_GEMMS`` (``THRESHOLDS``) on these calls: the executor's rule is read off it.

    # one GPU (about 4 minutes on an H200): writes OUT/grouped-units-h200.json and .md
    python3 -m benchmarks.studies.grouped_gemm --units --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ficco.files import write_text_atomic
from ficco.rounds import interleaved_rounds

FAMILIES = {  # name: (experts, top_k, (n, k) of the dispatch's GEMM, (n, k) of the combine's)
    "Mixtral-8x7B": (8, 2, (28672, 4096), (4096, 14336)),
    "Qwen3-30B-A3B": (128, 8, (1536, 2048), (2048, 768)),
    "gpt-oss-120b": (128, 4, (5760, 2880), (2880, 2880)),
    "DeepSeek-V3": (256, 8, (4096, 7168), (7168, 2048)),
}
"""Expert shapes at expert parallelism 2, as ``datasets/h200x2-moe`` holds them (``a2a_gemm`` /
``gemm_a2a`` scenarios of these families)."""
TOKENS = (256, 2048, 16384)
"""Tokens per layer: decode-sized to prefill-sized."""
DRY_RUN = {"tiny": (4, 2, (32, 48), (48, 32))}
"""``--cpu-dry-run``: one tiny family."""
WORLD_SIZE = 2
"""Expert parallelism the shapes are cut for."""
CALLS = 10
"""Calls per timed repetition."""
VARIANTS = ("loop", "grouped", "grouped_copy")
UNIT_VARIANTS = ("loop", "grouped")
UNIT_SCHEDULES = ("serial/dma", "shard/dma", "finer/dma/s2/chunk", "finer/dma/s4/chunk")
"""One schedule per unit layout of a plan at two ranks (``sm`` and ``dma`` cut the GEMMs alike)."""
THRESHOLDS = (1, 2, 4, 8, 16, 32, 64, 10**9)
"""Candidate ``GROUPED_MIN_GEMMS`` priced by the ``--units`` report (10**9: never grouped)."""
TOLERANCE = 2e-2
"""Largest error of a variant against ``loop``, over the output's largest magnitude."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.studies.grouped_gemm", description=__doc__.splitlines()[0]
    )
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="folder of the JSON and .md")
    p.add_argument("--name", default=None, help="file stem (default: grouped-gemm-<gpu>)")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds per case and mode, >= 1")
    p.add_argument("--cpu-dry-run", action="store_true", help="tiny shapes on the CPU, eager only")
    p.add_argument(
        "--units", action="store_true", help="time the executor's blocks of expert GEMMs per schedule"
    )
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds must be >= 1; got {args.rounds}")
    return args


def expert_rows(tokens: int, experts: int, top_k: int) -> list[int]:
    """Routed rows per local expert of one rank: ``tokens * top_k / WORLD_SIZE`` rows over
    ``experts / WORLD_SIZE`` experts, spread evenly (the first experts take the remainder)."""
    local = experts // WORLD_SIZE
    rows = tokens * top_k // WORLD_SIZE
    return [rows // local + (e < rows % local) for e in range(local)]


def make_variants(a, b, rows: list[int]) -> dict[str, Callable[[], object]]:
    """The three variants of one case (see the module docstring), each writing or returning ``[R, n]``."""
    import torch

    from ficco.executor.experts import ExpertGemms

    out = a.new_empty((a.shape[0], b.shape[2]))
    offs = torch.tensor(np.cumsum(rows), dtype=torch.int32, device=a.device)
    gemms, weights = ExpertGemms.whole(tuple(rows)), b.unbind(0)

    def loop() -> torch.Tensor:
        gemms.dispatch(a, b, out, weights, grouped=False)
        return out

    def grouped_copy() -> torch.Tensor:
        return out.copy_(torch._grouped_mm(a, b, offs=offs))

    return {
        "loop": loop,
        "grouped": lambda: torch._grouped_mm(a, b, offs=offs),
        "grouped_copy": grouped_copy,
    }


def unit_variants(op: str, gemms, a, b, out) -> dict[str, Callable[[], object]]:
    """``loop`` and ``grouped`` of one block: the dispatch's ``a`` holds the block's rows, the combine's
    every expert-major row; both write into ``out``."""
    run = gemms.dispatch if op == "a2a_gemm" else gemms.combine
    weights = b.unbind(0)
    return {
        "loop": lambda: run(a, b, out, weights, grouped=False),
        "grouped": lambda: run(a, b, out, weights, grouped=True),
    }


def check_unit(variants: dict[str, Callable[[], object]], out, cuda: bool) -> dict[str, float]:
    """Each variant's largest error against ``loop`` over the reference's largest magnitude, ``out`` zeroed
    before each; on the GPU also ``grouped`` replayed from a CUDA graph (``grouped_graph``)."""
    import torch

    out.zero_()
    variants["loop"]()
    reference = out.float().clone()
    scale = float(reference.abs().max()) or 1.0
    errors = {}
    for name, run in variants.items():
        out.zero_()
        run()
        errors[name] = float((out.float() - reference).abs().max()) / scale
    if cuda:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            variants["grouped"]()
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        errors["grouped_graph"] = float((out.float() - reference).abs().max()) / scale
    return errors


def check(variants: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Each variant's largest error against ``loop``, over the reference's largest magnitude."""
    reference = variants["loop"]().float().clone()
    scale = float(reference.abs().max()) or 1.0
    return {name: float((run().float() - reference).abs().max()) / scale for name, run in variants.items()}


def time_case(variants: dict[str, Callable[[], object]], *, cuda: bool, rounds: int, seed: int) -> dict:
    """Per variant and mode, ms per call (median over rounds) and eager host us per call."""
    import torch

    calls = {f"{name}_eager": run for name, run in variants.items()}
    if cuda:
        for name, run in variants.items():
            run()
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                run()
            calls[f"{name}_graph"] = graph.replay
    times: dict[str, list[float]] = {key: [] for key in calls}
    host: dict[str, list[float]] = {key: [] for key in calls if key.endswith("_eager")}

    def run_round(order: list[str]) -> None:
        for key in order:
            run = calls[key]
            run()  # warm (and, first time round, compile or allocate)
            if cuda:
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            t0 = time.perf_counter()
            for _ in range(CALLS):
                run()
            issued = time.perf_counter() - t0
            if cuda:
                end.record()
                end.synchronize()
                times[key].append(start.elapsed_time(end) / CALLS)
            else:
                times[key].append(1e3 * issued / CALLS)
            if key in host:
                host[key].append(1e6 * issued / CALLS)

    interleaved_rounds(list(calls), run_round, rounds=rounds, seed=seed)
    out = {f"{key}_ms": statistics.median(v) for key, v in times.items()}
    out |= {f"{key.removesuffix('_eager')}_host_us": statistics.median(v) for key, v in host.items()}
    return out


def run(args: argparse.Namespace) -> dict:
    """Every case (``--units``: every block of every case and schedule): check, then time; the JSON and
    markdown rewritten after each."""
    import torch

    cuda = not args.cpu_dry_run
    if cuda and not torch.cuda.is_available():
        sys.exit("no CUDA GPU: run with --cpu-dry-run to check the script on the CPU")
    device = torch.device("cuda" if cuda else "cpu")
    gpu = torch.cuda.get_device_name() if cuda else "CPU (dry run)"
    kind = "units" if args.units else "gemm"
    stem = args.name or f"grouped-{kind}-{gpu_tag(gpu) if cuda else 'cpu'}"
    path = args.out / f"{stem}.json"
    data: dict = {
        "meta": {
            "device": gpu,
            "torch": torch.__version__,
            "calls": CALLS,
            "rounds": args.rounds,
            "kind": kind,
        },
        "cases": [],
    }
    measure = _unit_cases if args.units else _gemm_case
    render = render_units if args.units else render_markdown
    families = DRY_RUN if not cuda else FAMILIES
    for index, (family, (experts, top_k, dispatch, combine)) in enumerate(families.items()):
        for op, (n, k) in (("a2a_gemm", dispatch), ("gemm_a2a", combine)):
            for tokens in (16,) if not cuda else TOKENS:
                gen = torch.Generator(device=device).manual_seed(index)
                b = torch.randn(
                    experts // WORLD_SIZE, k, n, device=device, dtype=torch.bfloat16, generator=gen
                )
                b /= k**0.5
                head = {"family": family, "op": op, "tokens": tokens, "experts_local": len(b), "n": n, "k": k}
                for case in measure(
                    head, b, gen, top_k, cuda=cuda, rounds=args.rounds, seed=len(data["cases"])
                ):
                    data["cases"].append(case)
                    print(_line(case), flush=True)
                    args.out.mkdir(parents=True, exist_ok=True)
                    write_text_atomic(path, json.dumps(data, indent=1) + "\n")
                    write_text_atomic(path.with_suffix(".md"), render(data))
                del b
    print(f"wrote {path} and {path.with_suffix('.md')}")
    return data


def gpu_tag(name: str) -> str:
    """The model in a GPU's name, for file names: ``NVIDIA H100 80GB HBM3`` -> ``h100``."""
    model = re.search(r"\b[A-Z]\d{3}\b", name)
    return (model.group(0) if model else name.split()[-1]).lower()


def _gemm_case(head: dict, b, gen, top_k: int, *, cuda: bool, rounds: int, seed: int) -> list[dict]:
    """The whole expert GEMM of one case under ``VARIANTS``: one record."""
    import torch

    rows = expert_rows(head["tokens"], len(b) * WORLD_SIZE, top_k)
    a = torch.randn(sum(rows), head["k"], device=b.device, dtype=b.dtype, generator=gen)
    variants = make_variants(a, b, rows)
    case = head | {"rows": sum(rows), "error": check(variants)}
    case["ok"] = max(case["error"].values()) <= TOLERANCE
    return [case | time_case(variants, cuda=cuda, rounds=rounds, seed=seed)]


def _unit_cases(head: dict, b, gen, top_k: int, *, cuda: bool, rounds: int, seed: int):
    """Every block of rank 0's plan of each of ``UNIT_SCHEDULES`` under ``UNIT_VARIANTS``, the routing
    balanced: one record each (yielded as measured)."""
    import torch

    from benchmarks.support.expert_blocks import executor_units
    from ficco.features import Routing

    op, k, n = head["op"], head["k"], head["n"]
    tokens, experts = head["tokens"], len(b) * WORLD_SIZE
    routing = Routing.synthetic(
        tokens=tokens // WORLD_SIZE, top_k=top_k, experts=experts, world_size=WORLD_SIZE
    )
    received = sum(routing.received(0))
    for schedule in UNIT_SCHEDULES:
        for unit, gemms in enumerate(executor_units(op, routing, schedule)):
            if op == "a2a_gemm":  # the block's rows in, every expert-major row out
                a = torch.randn(gemms.rows, k, device=b.device, dtype=b.dtype, generator=gen)
                out = torch.empty(received, n, device=b.device, dtype=b.dtype)
            else:  # every expert-major row in, the block's rows out
                a = torch.randn(received, k, device=b.device, dtype=b.dtype, generator=gen)
                out = torch.empty(gemms.rows, n, device=b.device, dtype=b.dtype)
            variants = unit_variants(op, gemms, a, b, out)
            case = head | {"schedule": schedule, "unit": unit, "segments": len(gemms.segments),
                           "rows": gemms.rows, "error": check_unit(variants, out, cuda)}  # fmt: skip
            case["ok"] = max(case["error"].values()) <= TOLERANCE
            yield case | time_case(variants, cuda=cuda, rounds=rounds, seed=seed + unit)
            del a, out, variants


def _line(case: dict) -> str:
    times = ", ".join(f"{key} {value:.4g}" for key, value in case.items() if key.endswith(("_ms", "_us")))
    where = (
        f" {case['schedule']} unit {case['unit']} ({case['segments']} GEMMs)" if "schedule" in case else ""
    )
    return f"{case['family']} {case['op']} tokens {case['tokens']}{where}: {times}"


def render_markdown(data: dict) -> str:
    """One row per case: each variant's eager and graph ms per call, eager host us, and the speedups of
    ``grouped_copy`` over ``loop``."""
    meta = data["meta"]
    modes = [m for m in ("eager", "graph") if data["cases"] and f"loop_{m}_ms" in data["cases"][0]]
    head = ["family", "op", "tokens", "experts", "rows", "n x k"]
    head += [f"{v} {m} ms" for m in modes for v in VARIANTS] + [f"{v} host us" for v in VARIANTS]
    head += [f"loop / grouped_copy {m}" for m in modes] + ["max error"]
    lines = [
        f"# Expert GEMM: torch.mm per expert against torch._grouped_mm ({meta['device']}, {meta['torch']})",
        "",
        f"{meta['rounds']} interleaved rounds of {meta['calls']} calls; ms per call, median over rounds.",
        "",
        "| " + " | ".join(head) + " |",
        "|---" * len(head) + "|",
    ]
    for c in data["cases"]:
        cells = [c["family"], c["op"], str(c["tokens"]), str(c["experts_local"]), str(c["rows"]),
                 f"{c['n']}x{c['k']}"]  # fmt: skip
        cells += [f"{c[f'{v}_{m}_ms']:.4f}" for m in modes for v in VARIANTS]
        cells += [f"{c[f'{v}_host_us']:.0f}" for v in VARIANTS]
        cells += [f"{c[f'loop_{m}_ms'] / c[f'grouped_copy_{m}_ms']:.2f}x" for m in modes]
        cells.append(f"{max(c['error'].values()):.1e}" + ("" if c["ok"] else " (over the tolerance)"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def threshold_rows(cases: list[dict], modes: list[str]) -> list[dict]:
    """Per candidate threshold (``THRESHOLDS``) and mode, over the measured calls (family, op, tokens,
    schedule): each call's time with a block grouped when it holds at least that many GEMMs, over the
    call's best (each block its faster way), and the loop's time over it; geomean and extremes."""
    import pandas as pd
    from scipy.stats import gmean

    frame = pd.DataFrame(cases)
    rows = []
    for mode in modes:
        loop, grouped = frame[f"loop_{mode}_ms"], frame[f"grouped_{mode}_ms"]
        for threshold in THRESHOLDS:
            calls = (
                frame.assign(
                    rule=np.where(frame["segments"] >= threshold, grouped, loop),
                    best=np.minimum(loop, grouped),
                    loop=loop,
                )
                .groupby(["family", "op", "tokens", "schedule"])[["rule", "best", "loop"]]
                .sum()
            )
            over_best, speedup = calls["rule"] / calls["best"], calls["loop"] / calls["rule"]
            rows.append({
                "mode": mode, "threshold": threshold, "calls": len(calls),
                "over_best_geomean": float(gmean(over_best)), "over_best_max": float(over_best.max()),
                "loop_over_rule_geomean": float(gmean(speedup)), "loop_over_rule_min": float(speedup.min()),
            })  # fmt: skip
    return rows


def render_units(data: dict) -> str:
    """The candidate thresholds priced on the measured calls, then one row per block: segments, rows and
    each variant's eager and graph ms and eager host us."""
    from ficco.executor.experts import GROUPED_MIN_GEMMS

    meta, cases = data["meta"], data["cases"]
    modes = [m for m in ("eager", "graph") if cases and f"loop_{m}_ms" in cases[0]]
    lines = [
        f"# The executor's blocks of expert GEMMs: loop against grouped ({meta['device']}, {meta['torch']})",
        "",
        f"{meta['rounds']} interleaved rounds of {meta['calls']} calls; ms per call, median over rounds.",
        "A call is one schedule's expert GEMMs on rank 0 (two ranks, balanced routing), the sum over",
        "its blocks; `rule`: each block grouped when it holds at least `threshold` GEMMs; `best`: each",
        "block its faster way.",
        f"The executor groups a block of at least `GROUPED_MIN_GEMMS` = {GROUPED_MIN_GEMMS} GEMMs.",
        "",
        "| mode | threshold | calls | rule / best: geomean, max | loop / rule: geomean, min |",
        "|---|---|---|---|---|",
    ]
    for r in threshold_rows(cases, modes) if cases else []:
        never = r["threshold"] == THRESHOLDS[-1]
        lines.append(
            f"| {r['mode']} | {'never' if never else r['threshold']} | {r['calls']} "
            f"| {r['over_best_geomean']:.3f}, {r['over_best_max']:.3f} "
            f"| {r['loop_over_rule_geomean']:.3f}, {r['loop_over_rule_min']:.3f} |"
        )
    head = ["family", "op", "tokens", "schedule", "unit", "GEMMs", "rows", "n x k"]
    head += [f"{v} {m} ms" for m in modes for v in UNIT_VARIANTS] + [f"{v} host us" for v in UNIT_VARIANTS]
    head += ["max error"]
    lines += ["", "| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for c in cases:
        cells = [c["family"], c["op"], str(c["tokens"]), c["schedule"], str(c["unit"]), str(c["segments"]),
                 str(c["rows"]), f"{c['n']}x{c['k']}"]  # fmt: skip
        cells += [f"{c[f'{v}_{m}_ms']:.4f}" for m in modes for v in UNIT_VARIANTS]
        cells += [f"{c[f'{v}_host_us']:.0f}" for v in UNIT_VARIANTS]
        cells.append(f"{max(c['error'].values()):.1e}" + ("" if c["ok"] else " (over the tolerance)"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    return run(parse_args(argv))


if __name__ == "__main__":
    main()
