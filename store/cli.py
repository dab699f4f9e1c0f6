"""Command line of the `store` stage (typer). Thin: parse, validate, call run()."""

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="walla store stage")


@app.callback()
def _root() -> None:
    """walla store stage."""


def main() -> None:
    app()
