"""Fuzz the live service with schemathesis, every check on, and count its answers by status.

    python -m benchmarks.service_fuzz                # the models/ registry, 100 per operation
    python -m benchmarks.service_fuzz --max-examples 300 --seed 7

Starts ``ficco serve`` of this checkout on a free port (``benchmarks.service``'s ``served``, with a
reload token the fuzzer does not know, so the reload endpoint is on), runs ``schemathesis run`` against its
``/openapi.json`` over HTTP with ``--checks all`` and a HAR report, and counts the responses by status
code from the HAR. Writes ``benchmarks/results/service-fuzz.json`` and ``.md`` (``--out``): the command,
the counts, the 5xx responses (the goal: none) and the tail of schemathesis's own summary, whose other
checks may fail by design (``positive_data_acceptance``: a schema-valid scenario can still break a rule
across fields that OpenAPI cannot state, e.g. ``m`` divisible by ``world_size``, and is rightly 422).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import REPO
from benchmarks.service import _free_port, served

SUMMARY_LINES = 60
"""Lines of schemathesis's output kept in the results (its summary)."""


def statuses(har: Path) -> dict[str, collections.Counter]:
    """``{"METHOD path": Counter(status code -> responses)}`` of a HAR file's entries."""
    out: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for entry in json.loads(har.read_text())["log"]["entries"]:
        path = entry["request"]["url"].split("://", 1)[-1].split("/", 1)[-1].split("?", 1)[0]
        out[f"{entry['request']['method']} /{path}"][str(entry["response"]["status"])] += 1
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-root", type=Path, default=REPO / "models", help="model registry to serve")
    parser.add_argument("--max-examples", type=int, default=100, help="test cases per operation and phase")
    parser.add_argument("--seed", type=int, default=35, help="schemathesis's random seed")
    parser.add_argument(
        "--out", type=Path, default=REPO / "benchmarks/results/service-fuzz", help="results stem"
    )
    args = parser.parse_args()

    port = _free_port()
    work = Path(tempfile.mkdtemp(prefix="ficco-fuzz-"))
    os.environ["FICCO_RELOAD_TOKEN"] = secrets.token_hex(16)
    har = work / "fuzz.har"
    command = [
        sys.executable, "-m", "schemathesis.cli", "run", f"http://127.0.0.1:{port}/openapi.json",
        "--checks", "all", "--max-examples", str(args.max_examples), "--seed", str(args.seed),
        "--workers", "1", "--continue-on-failure", "--suppress-health-check", "all", "--no-color",
        "--request-timeout", "30",
        "--report", "har", "--report-har-path", str(har),
    ]  # fmt: skip
    with served(args.model_root, port, work / "serve.log", stop_timeout_s=30.0):
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, cwd=work)
        elapsed = time.perf_counter() - start
    by_operation = statuses(har)
    shutil.rmtree(work, ignore_errors=True)
    total = sum((c for c in by_operation.values()), collections.Counter())
    server_errors = {op: {s: n for s, n in c.items() if s.startswith("5")} for op, c in by_operation.items()}
    server_errors = {op: c for op, c in server_errors.items() if c}
    import schemathesis

    shown = " ".join(shlex.quote(part) for part in ["schemathesis", *command[3:]]).replace(
        str(har), "fuzz.har"
    )
    results = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "schemathesis": schemathesis.__version__,
        "command": f"python -m benchmarks.service_fuzz --max-examples {args.max_examples} --seed {args.seed}",
        "schemathesis_command": shown.replace(f"127.0.0.1:{port}", "127.0.0.1:PORT"),
        "elapsed_s": round(elapsed, 1),
        "responses": sum(total.values()),
        "by_status": dict(sorted(total.items())),
        "by_operation": {op: dict(sorted(c.items())) for op, c in sorted(by_operation.items())},
        "responses_5xx": sum(sum(c.values()) for c in server_errors.values()),
        "server_errors": server_errors,
        "schemathesis_exit_code": done.returncode,
        "schemathesis_summary": done.stdout.splitlines()[-SUMMARY_LINES:],
    }
    rows = "\n".join(
        f"| {op} | {sum(c.values())} | " + ", ".join(f"{s}: {n}" for s, n in sorted(c.items())) + " |"
        for op, c in sorted(by_operation.items())
    )
    md = (
        f"# Service fuzzing (schemathesis {results['schemathesis']}, every check)\n\n{results['when']}: "
        f"`{results['command']}`, which runs\n\n    {results['schemathesis_command']}\n\n"
        f"against `ficco serve` over HTTP. {results['responses']} responses in {results['elapsed_s']:g} s; "
        f"**{results['responses_5xx']} with a 5xx status** (goal: 0).\n\n"
        f"| operation | responses | by status |\n|---|---|---|\n{rows}\n\n"
        "schemathesis's summary (its other checks may fail by design: `positive_data_acceptance` counts a "
        "schema-valid body that breaks a rule across fields, answered 422, as a failure):\n\n```\n"
        + "\n".join(results["schemathesis_summary"])
        + "\n```\n"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(md)
    print(md)
    sys.exit(1 if results["responses_5xx"] else 0)


if __name__ == "__main__":
    main()
