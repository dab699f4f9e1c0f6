"""Stage 2: mechanism math, wager heads, baselines, Lightning glue, runs on disk."""
