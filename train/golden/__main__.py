"""`python -m walla.train.golden [--write] [--device cuda]`: the golden check (train/golden/_check.py)."""

import typer
from walla.train.golden._check import main

if __name__ == "__main__":
    typer.run(main)
