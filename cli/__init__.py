"""The `walla` command: one root over every stage's command line (main.py), loaded lazily (lazy.py)."""

from __future__ import annotations

from typing import Any

import typer


def new_app(**settings: Any) -> typer.Typer:
    """A typer app of walla: help rendered as written (no rich markup eats `[ray]`, no `<bool>` after a
    flag), lines up to 110 wide. Here, not in options.py: the store's command uses it and reads no config."""
    return typer.Typer(
        add_completion=False,
        rich_markup_mode=None,
        context_settings={"max_content_width": 110},
        **settings,
    )
