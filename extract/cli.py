"""Command line of the `extract` stage (typer). Thin: parse, validate, call run()."""

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="walla extract stage")


@app.callback()
def _root() -> None:
    """walla extract stage."""


def main() -> None:
    app()
