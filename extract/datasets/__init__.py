"""Dataset loaders: hub or local files (or a generator) -> the canonical question table.

One module per loader (pubmedqa, medmcqa, mmlu, arc, jsonl, and the generators bayesx, facts), the
shared row helpers (rows.py) and source readers (files.py), the registry (registry.py: the one list of
loaders, each with its default prompt template) and the table builder (table.py: splits, --limit, checks).

    from walla.extract.datasets import DatasetRequest, load_dataset_table
    table, source = load_dataset_table(DatasetRequest(name="facts", loader="facts", generator={"n": 200}))

Malformed input raises ONE ValueError naming file, line/entry and field.
"""

from walla.extract.datasets.registry import LOADERS, Loader, default_template, get_loader
from walla.extract.datasets.rows import DatasetRequest, Loaded, canonical_row
from walla.extract.datasets.table import build_table, load_dataset_table

__all__ = [
    "LOADERS",
    "DatasetRequest",
    "Loaded",
    "Loader",
    "build_table",
    "canonical_row",
    "default_template",
    "get_loader",
    "load_dataset_table",
]
