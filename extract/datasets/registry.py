"""The loader registry: a manifest's `loader:` key -> the module function that reads that dataset.

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

from collections.abc import Callable

from walla.extract.datasets import arc, bayesx, facts, jsonl, medmcqa, mmlu, pubmedqa
from walla.extract.datasets.rows import DatasetRequest, Loaded

LOADERS: dict[str, Callable[[DatasetRequest], Loaded]] = {
    "pubmedqa": pubmedqa.load,
    "medmcqa": medmcqa.load,
    "mmlu": mmlu.load,
    "arc": arc.load,
    "jsonl": jsonl.load,
    "bayesx": bayesx.load,
    "facts": facts.load,
}
GENERATED = ("bayesx", "facts")  # loaders that generate their rows (`--size`, no `--data-file`)
