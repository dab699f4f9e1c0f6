"""Training numbers pinned to TRAIN_SCHEMA (python -m walla.train.golden)."""
