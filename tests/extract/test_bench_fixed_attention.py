"""benchmarks/fixed_attention.py at a small pack on the CPU: it runs end to end, and the bits it checks (a
prompt's rows at another offset among other prompts, and with 3 key steps where its own needs 1, eager and
compiled) are the same."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "fixed_attention.py"


@pytest.mark.heavy
def test_fixed_attention_benchmark_runs_and_keeps_the_bits():
    cmd = [sys.executable, str(BENCH), "--device", "cpu", "--tokens", "512", "--repeat", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = proc.stdout.strip().splitlines()[-1]
    assert result.startswith("RESULT device=cpu tokens=512 ") and "same_bits=True" in result, proc.stdout
