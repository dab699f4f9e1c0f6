"""On-disk layout of training runs: the contract between `walla-train` and `walla-eval`.

    <runs>/<scenario>/scenario.parquet          one row per question: question_id, split, label,
                                                 target [K], option_mask [K], agent_probs [M*K] (flat,
                                                 agent-major), variant [M], plus scenario.json beside it
                                                 (agents, dataset, soft_target, K, M, fingerprints).
    <runs>/<scenario>/<method>/seed=<s>/
        predictions.parquet  question_id, split, weights [M], agg_probs [K],
                             wagers [M] | null, payouts [M] | null, advantage [M] | null,
                             pred_score [M] | null, pred_baseline [M] | null  (diagnostic heads),
                             agent_probs [M*K] | null (only when the method changes agent probs, e.g.
                             calibrated: the per-agent probs it actually pooled)
        train_log.parquet    per training batch: step, epoch, n_seen, metric columns (may be empty)
        run.json             resolved config, method, display_name, group (individual |
                             learning_free | learning_based | walla), seed, store fingerprints,
                             wall time. Written LAST: its presence marks the run complete.

Every file is written to a temp name in the same directory and os.replace'd into place.
"""

from __future__ import annotations

SCENARIO_TABLE = "scenario.parquet"
SCENARIO_META = "scenario.json"
PREDICTIONS = "predictions.parquet"
TRAIN_LOG = "train_log.parquet"
RUN_META = "run.json"  # completion marker, written last

METHOD_GROUPS = ("individual", "learning_free", "learning_based", "walla")
