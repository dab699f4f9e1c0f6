"""Column contracts shared by every stage: the canonical question table and a feature set's rows.

Changing any of these is a schema change: bump FEATURE_SCHEMA_VERSION (readers then refuse
older stores loudly and say to re-extract).
"""

from __future__ import annotations

FEATURE_SCHEMA_VERSION = 1

SPLITS = ("train", "val", "test")
VARIANTS = ("none", "relevant", "irrelevant")  # prompt variants; index = int8 code used in arrays
VARIANT_CODE = {v: i for i, v in enumerate(VARIANTS)}

# Canonical question table (one per dataset, polars DataFrame, stored once under questions/).
QUESTION_COLUMNS: dict[str, str] = {
    "question_id": "str   unique within the dataset",
    "split": "str   one of SPLITS, assigned deterministically by the loader (8:1:1 by default)",
    "question": "str   question text as shown to the model",
    "options": "list[str]   option texts, 2..5 of them, in display order",
    "option_labels": "list[str]   labels as in the source (A-E, 1-4, YES/NO, 1/0), same order",
    "label": "i64   0-based index of the correct option",
    "gold_dist": "list[f64] | null   soft ground truth over options (BayesX posterior), sums to 1",
    "context": "str | null   the private context (abstract, evidence); null if the dataset has none",
    "subject": "str | null   subject / topic, for per-subject breakdowns",
}

# rows.parquet of one feature set = (model, dataset, variant); row order == hidden.zarr row order.
ROW_COLUMNS: dict[str, str] = {
    "question_id": "str   joins to the question table",
    "n_options": "i32   K_q of this question (ARC has 3..5)",
    "option_logprobs": "list[f32]   log-probs renormalized over the K_q options (logsumexp == 0)",
    "raw_option_logprobs": "list[f32]   full-vocabulary log-probs of each option's token",
    "prompt_nll": "f32   mean next-token NLL of the prompt tokens (PackLLM: ppl = exp(prompt_nll))",
    "n_prompt_tokens": "i32   number of prompt tokens incl. BOS",
    "context_source_id": "str | null   question_id whose context was shown (irrelevant variant), else null",
}

# Optional rows.parquet columns, after ROW_COLUMNS when present (all shards of a feature set agree).
OPTIONAL_ROW_COLUMNS: dict[str, str] = {
    "prompt": "str   the exact prompt text the model saw (fills ScenarioData.prompts for context routers)",
}
