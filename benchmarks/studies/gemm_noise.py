r"""How far a lone GEMM's time moves between input draws and between processes: the floor of graph-mode noise.

    python3 -m benchmarks.studies.gemm_noise --out OUT/gemm-noise-a.json      # one GPU; run it twice, then:
    python3 -m benchmarks.studies.gemm_noise --compare OUT/gemm-noise-a.json OUT/gemm-noise-b.json

In ``datasets/h200x2``'s re-measure (another process, other inputs) the GEMM alone, one cuBLAS call replayed
from a CUDA graph, moved by a median 1.06% (p90 3.9%) in graph mode, about as much as the schedules did
(1.23%, 3.6%). This separates the two things that change between those runs. Per shape of ``SHAPES`` (GEMMs
of the dataset's sizes, bf16) and per input draw (``--seeds``: ``torch.randn`` under each seed, as the harness
draws its inputs), a block of calls is captured into one CUDA graph; every round replays every (shape, draw)
block once, in a new shuffled order, queued on the device between CUDA events as the harness's graph rounds
are. Per shape it reports each draw's median time and the spread between draws (slowest over fastest
median): the draws' own effect, within one process. ``--compare`` puts two runs side by side: per (shape,
draw) the second's median over the first's, the same inputs in another process.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from ficco.files import write_text_atomic
from ficco.rounds import interleaved_rounds
from ficco.tables import text_table

SHAPES: tuple[tuple[int, int, int], ...] = (
    (1024, 4096, 6144),
    (4096, 4096, 14336),
    (8192, 8192, 28672),
    (16384, 8192, 8192),
    (2048, 16384, 53248),
    (512, 28672, 8192),
)
"""(m, n, k) of the GEMMs timed: ``[m, k] @ [k, n]``, from the dataset's model layers (about 0.05-3 ms)."""
TARGET_MS = 2.0
"""Calls per captured block: enough that a block lasts about this long."""


def measure(seeds: list[int], rounds: int) -> dict:
    """Every (shape, seed) block timed in ``rounds`` shuffled rounds on the current GPU; the JSON body."""
    import torch

    device = torch.device("cuda")
    blocks, calls = {}, {}
    for m, n, k in SHAPES:
        for seed in seeds:
            gen = torch.Generator(device=device).manual_seed(seed)
            a = torch.randn(m, k, device=device, dtype=torch.bfloat16, generator=gen)
            b = torch.randn(k, n, device=device, dtype=torch.bfloat16, generator=gen)
            out = torch.empty(m, n, device=device, dtype=torch.bfloat16)
            torch.mm(a, b, out=out)
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.mm(a, b, out=out)
            end.record()
            end.synchronize()
            count = max(1, round(TARGET_MS / max(start.elapsed_time(end), 1e-3)))
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(count):
                    torch.mm(a, b, out=out)
            key = f"{m}x{n}x{k}/seed{seed}"
            blocks[key], calls[key] = (graph, (a, b, out)), count
    times: dict[str, list[float]] = {key: [] for key in blocks}

    def run_round(keys: list[str]) -> None:
        events = []
        torch.cuda._sleep(2_000_000)  # the GPU busy while the host queues the round
        for key in keys:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            blocks[key][0].replay()
            end.record()
            events.append((key, start, end))
        torch.cuda.synchronize()
        for key, start, end in events:
            times[key].append(start.elapsed_time(end) / calls[key])

    interleaved_rounds(list(blocks), run_round, rounds=rounds, seed=0)
    return {
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "seeds": seeds,
        "rounds": rounds,
        "median_ms": {key: statistics.median(ms) for key, ms in times.items()},
        "round_ms": times,
    }


def by_shape(body: dict) -> list[list[str]]:
    """Per shape: each draw's median (ms) and the spread between draws."""
    rows = []
    for m, n, k in SHAPES:
        medians = [body["median_ms"][f"{m}x{n}x{k}/seed{s}"] for s in body["seeds"]]
        cells = [f"{x:.4f}" for x in medians]
        rows.append([f"{m}x{n}x{k}", *cells, f"{max(medians) / min(medians):.4f}"])
    return rows


def compare(first: dict, second: dict) -> list[list[str]]:
    """Per (shape, draw) in both: the second run's median over the first's."""
    rows = []
    for key, ms in first["median_ms"].items():
        if key in second["median_ms"]:
            rows.append(
                [key, f"{ms:.4f}", f"{second['median_ms'][key]:.4f}", f"{second['median_ms'][key] / ms:.4f}"]
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3], help="input draws per shape")
    parser.add_argument("--rounds", type=int, default=30, help="shuffled rounds")
    parser.add_argument("--out", type=Path, help="JSON file to write")
    parser.add_argument("--compare", type=Path, nargs=2, metavar="JSON", help="two runs' JSON side by side")
    args = parser.parse_args()
    if args.compare:
        first, second = (json.loads(path.read_text()) for path in args.compare)
        print(text_table(["shape/draw", "first ms", "second ms", "second/first"], compare(first, second)))
        return
    if args.out is None:
        parser.error("--out is required (or --compare A B)")
    if not 1 <= args.rounds <= 1000 or len(args.seeds) < 2:
        parser.error(f"--rounds must be 1-1000 and --seeds at least two; got {args.rounds}, {args.seeds}")
    body = measure(args.seeds, args.rounds)
    write_text_atomic(args.out, json.dumps(body) + "\n")
    head = ["shape", *(f"seed {s} ms" for s in body["seeds"]), "slowest/fastest"]
    print(text_table(head, by_shape(body)))


if __name__ == "__main__":
    main()
