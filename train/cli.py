"""Command line of the `train` stage (typer). Thin: parse, validate, call run()."""

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="walla train stage")


@app.callback()
def _root() -> None:
    """walla train stage."""


def main() -> None:
    app()
