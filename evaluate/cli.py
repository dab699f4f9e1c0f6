"""Command line of the `evaluate` stage (typer). Thin: parse, validate, call run()."""

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="walla evaluate stage")


@app.callback()
def _root() -> None:
    """walla evaluate stage."""


def main() -> None:
    app()
