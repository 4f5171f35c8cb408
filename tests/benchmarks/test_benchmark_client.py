"""benchmarks/service.py's load generator never hangs: refused connections are counted as errors
(issue 15 item 9)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CODE = """
import json
from benchmarks.service import _free_port, load_phase, random_scenarios
print(json.dumps(load_phase(_free_port(), 50, random_scenarios(10, seed=1))))
"""


def test_load_phase_against_a_closed_port_reports_errors_instead_of_hanging():
    done = subprocess.run([sys.executable, "-c", CODE], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    phase = json.loads(done.stdout.strip().splitlines()[-1])
    assert phase["errors"] == 10
    assert any("refused" in e.lower() for e in phase["error_examples"]), phase["error_examples"]
