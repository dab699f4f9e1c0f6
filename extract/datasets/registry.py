"""The loader registry, the one list of dataset loaders: a datasets.yaml `loader:` name -> the function
that reads that dataset, its default prompt template, and whether it generates its rows.

| loader   | hub (real `datasets.load_dataset` code)       | local files (`--data-file`)                                   |
|----------|-----------------------------------------------|---------------------------------------------------------------|
| pubmedqa | qiaojin/PubMedQA pqa_labeled / pqa_artificial | original `ori_pqal.json` (object keyed by PubMed id)          |
| medmcqa  | openlifescienceai/medmcqa (`cop` 0-based)     | original release JSON lines (`cop` 1-based)                   |
| mmlu     | cais/mmlu, any config / split                 | original CSVs (file or folder; header optional; letter or 0-based answer) |
| arc      | allenai/ai2_arc                               | original JSON lines {id, question: {stem, choices}, answerKey} |
| jsonl    | -                                             | generic JSON lines, see jsonl.py                              |
| bayesx   | generated (bayesx.py)                         | - (`--data-file` is refused)                                  |
| facts    | generated (facts.py)                          | - (`--data-file` is refused)                                  |

Hub-format data can also be given locally (`--data-file`): a `.parquet` file (read with
`load_dataset("parquet", ...)`) or a folder written by `Dataset.save_to_disk`; both go through
the same row parser as the hub.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass

from walla.extract.datasets import arc, bayesx, facts, jsonl, medmcqa, mmlu, pubmedqa
from walla.extract.datasets.rows import DatasetRequest, Loaded


@dataclass(frozen=True)
class Loader:
    """One dataset loader: what a datasets.yaml `loader:` name reads, and how its questions are asked."""

    name: str
    load: Callable[[DatasetRequest], Loaded]
    template: str  # default prompt template (extract/prompts.py TEMPLATES); a dataset's `prompt:` wins
    generated: bool = (
        False  # generates its rows: needs a `generator:` block, takes `--size`, no `--data-file`
    )


# The one list of loaders: a new dataset format is one module and one line here.
LOADERS: dict[str, Loader] = {
    x.name: x
    for x in [
        Loader("pubmedqa", pubmedqa.load, "pubmedqa"),
        Loader("medmcqa", medmcqa.load, "mc"),
        Loader("mmlu", mmlu.load, "mc"),
        Loader("arc", arc.load, "mc"),
        Loader("jsonl", jsonl.load, "mc_context"),
        Loader("bayesx", bayesx.load, "bayesx", generated=True),
        Loader("facts", facts.load, "facts", generated=True),
    ]
}


def get_loader(name: str) -> Loader:
    """The registered loader of a datasets.yaml `loader:` name.

    Raises:
        KeyError: an unknown name, with close matches and every known loader.
    """
    if name not in LOADERS:
        close = difflib.get_close_matches(name, list(LOADERS), n=2, cutoff=0.5)
        hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
        raise KeyError(f"unknown dataset loader {name!r}{hint}; known loaders: {', '.join(LOADERS)}")
    return LOADERS[name]


def default_template(loader: str, prompt: str | None = None) -> str:
    """The prompt template name of a dataset: its datasets.yaml `prompt:`, else its loader's default."""
    return prompt or get_loader(loader).template
