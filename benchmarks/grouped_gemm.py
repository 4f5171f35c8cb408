r"""The MoE ops' expert GEMM on one GPU: one ``torch.mm`` per local expert (``executor.experts.
grouped_matmul`` as shipped) against one ``torch._grouped_mm`` call (CUTLASS grouped GEMM on Hopper), on the
expert shapes of the MoE families of ``datasets/moe_configs`` at expert parallelism 2.

    # one GPU (about a minute on an H200): writes OUT/grouped-gemm-h200.json and .md
    python3 benchmarks/grouped_gemm.py --out benchmarks/results
    # plumbing check on the CPU (tiny shapes; torch's CPU fallback of _grouped_mm)
    python3 benchmarks/grouped_gemm.py --cpu-dry-run --out /tmp/grouped-dry

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
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from ficco.files import write_text_atomic  # noqa: E402 (needs the path above)

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
TOLERANCE = 2e-2
"""Largest error of a variant against ``loop``, over the output's largest magnitude."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="benchmarks/grouped_gemm.py", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="folder of the JSON and .md")
    p.add_argument("--name", default=None, help="file stem (default: grouped-gemm-<gpu>)")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds per case and mode, >= 1")
    p.add_argument("--cpu-dry-run", action="store_true", help="tiny shapes on the CPU, eager only")
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

    from ficco.executor.experts import grouped_matmul

    out = a.new_empty((a.shape[0], b.shape[2]))
    offs = torch.tensor(np.cumsum(rows), dtype=torch.int32, device=a.device)

    def grouped_copy() -> torch.Tensor:
        return out.copy_(torch._grouped_mm(a, b, offs=offs))

    return {
        "loop": lambda: grouped_matmul(a, b, rows, out),
        "grouped": lambda: torch._grouped_mm(a, b, offs=offs),
        "grouped_copy": grouped_copy,
    }


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
    rng = np.random.default_rng(seed)
    for _ in range(rounds):
        for key in rng.permutation(list(calls)):
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
    out = {f"{key}_ms": statistics.median(v) for key, v in times.items()}
    out |= {f"{key.removesuffix('_eager')}_host_us": statistics.median(v) for key, v in host.items()}
    return out


def run(args: argparse.Namespace) -> dict:
    """Every case: check, then time; the JSON and markdown rewritten after each."""
    import torch

    cuda = not args.cpu_dry_run
    if cuda and not torch.cuda.is_available():
        sys.exit("no CUDA GPU: run with --cpu-dry-run to check the script on the CPU")
    device = torch.device("cuda" if cuda else "cpu")
    gpu = torch.cuda.get_device_name() if cuda else "CPU (dry run)"
    stem = args.name or ("grouped-gemm-" + gpu.split()[-1].lower() if cuda else "grouped-gemm-cpu")
    path = args.out / f"{stem}.json"
    data: dict = {
        "meta": {"device": gpu, "torch": torch.__version__, "calls": CALLS, "rounds": args.rounds},
        "cases": [],
    }
    families = DRY_RUN if not cuda else FAMILIES
    for index, (family, (experts, top_k, dispatch, combine)) in enumerate(
        (f, spec) for f, spec in families.items()
    ):
        for op, (n, k) in (("a2a_gemm", dispatch), ("gemm_a2a", combine)):
            for tokens in (16,) if not cuda else TOKENS:
                rows = expert_rows(tokens, experts, top_k)
                gen = torch.Generator(device=device).manual_seed(index)
                a = torch.randn(sum(rows), k, device=device, dtype=torch.bfloat16, generator=gen)
                b = torch.randn(len(rows), k, n, device=device, dtype=torch.bfloat16, generator=gen) / k**0.5
                variants = make_variants(a, b, rows)
                case = {"family": family, "op": op, "tokens": tokens, "experts_local": len(rows),
                        "rows": sum(rows), "n": n, "k": k, "error": check(variants)}  # fmt: skip
                case["ok"] = max(case["error"].values()) <= TOLERANCE
                case |= time_case(variants, cuda=cuda, rounds=args.rounds, seed=len(data["cases"]))
                data["cases"].append(case)
                print(_line(case), flush=True)
                del a, b, variants
                args.out.mkdir(parents=True, exist_ok=True)
                write_text_atomic(path, json.dumps(data, indent=1) + "\n")
                write_text_atomic(path.with_suffix(".md"), render_markdown(data))
    print(f"wrote {path} and {path.with_suffix('.md')}")
    return data


def _line(case: dict) -> str:
    times = ", ".join(f"{key} {value:.4g}" for key, value in case.items() if key.endswith(("_ms", "_us")))
    return f"{case['family']} {case['op']} tokens {case['tokens']}: {times}"


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


def main(argv: list[str] | None = None) -> dict:
    return run(parse_args(argv))


if __name__ == "__main__":
    main()
