"""Dataset loaders: hub or local files (or a generator) -> the canonical question table.

One module per loader (pubmedqa, medmcqa, mmlu, arc, jsonl, and the generators bayesx, facts), the
shared row helpers (rows.py) and source readers (files.py), the registry (registry.py: the
manifest's `loader:` key -> loader) and the table builder (table.py: splits, --limit, checks).

    from walla.extract.datasets import DatasetRequest, load_dataset_table
    table, source = load_dataset_table(DatasetRequest(name="facts", loader="facts", generator={"n": 200}))

Malformed input raises ONE ValueError naming file, line/entry and field.
"""

from walla.extract.datasets.registry import GENERATED, LOADERS
from walla.extract.datasets.rows import DatasetRequest, Loaded, canonical_row
from walla.extract.datasets.table import build_table, load_dataset_table

__all__ = [
    "GENERATED",
    "LOADERS",
    "DatasetRequest",
    "Loaded",
    "build_table",
    "canonical_row",
    "load_dataset_table",
]
