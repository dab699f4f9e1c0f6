"""What a feature set is: `FeatureSetSpec` (model, dataset, variant + every resolved input) and its key.

The fingerprint covers every input that shaped the bytes (see store/fingerprint.py for the rules); the
directory is `<store>/features/<model>/<dataset>/<variant>/<fp>/` (readable path, hash last).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from walla.store.features._layout import FEATURES_DIR, check_name
from walla.store.fingerprint import canonical, fingerprint
from walla.store.location import as_location
from walla.store.schema import FEATURE_SCHEMA_VERSION, VARIANTS


@dataclass(frozen=True)
class FeatureSetSpec:
    """What a feature set is: (model, dataset, variant) plus every resolved input that shaped its bytes.

    `inputs` comes from the extract stage: model id + revision or GGUF file hash, backend + version,
    dtype, dataset source + split, prompt template text, option tokens, and `questions_fp` (the
    fingerprint write_question_table returned; required -- assembly joins on it). Anything that changes
    which rows are extracted (e.g. a row limit) must be in it too.
    """

    model: str
    dataset: str
    variant: str
    inputs: dict = field(hash=False)

    def __post_init__(self) -> None:
        check_name(self.model, "model")
        check_name(self.dataset, "dataset")
        if self.variant not in VARIANTS:
            raise ValueError(f"variant {self.variant!r} is not one of {VARIANTS}")
        if not isinstance(self.inputs, dict):
            raise TypeError(f"FeatureSetSpec.inputs must be a dict, got {type(self.inputs).__name__}")
        qfp = self.inputs.get("questions_fp")
        if not isinstance(qfp, str) or not qfp:
            raise ValueError(
                "FeatureSetSpec.inputs must contain 'questions_fp': the fingerprint returned by "
                "write_question_table for the question table these rows were extracted from"
            )
        canonical(self.inputs)  # fail now, not at commit, on unhashable inputs

    def fingerprint_inputs(self) -> dict:
        """Everything hashed into the key (recorded verbatim in meta.json and the zarr attrs)."""
        return {
            "kind": "features",
            "model": self.model,
            "dataset": self.dataset,
            "variant": self.variant,
            "inputs": self.inputs,
            "schema_version": FEATURE_SCHEMA_VERSION,
        }

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.fingerprint_inputs())

    def path(self, store: Path) -> Path:
        return as_location(store) / FEATURES_DIR / self.model / self.dataset / self.variant / self.fingerprint


def question_ids_sha256(ids: list[str]) -> str:
    """Hash of the row order: readers compare it between rows.parquet, meta.json and the zarr attrs."""
    return hashlib.sha256("\n".join(ids).encode("utf-8")).hexdigest()
