"""`walla market agent` and `walla market replay` (registered on walla.market.cli.app when the CLI runs)."""

from __future__ import annotations
