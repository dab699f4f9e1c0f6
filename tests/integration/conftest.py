"""Integration tests reuse the tiny random model of tests/extract (built in memory, no download)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "extract"))
