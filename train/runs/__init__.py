"""The runs-on-disk contract: layout, identity, keys, writer, reader, lineage.

Rooms (private: import their public names from this door):
- `_choice`: Which trained runs a replay uses: the seeds of ONE run key of one method, named by the user when needed.
- `_identity`: A run's identity: its run key, the key's directory name (key id) and the inputs ids it holds.
- `_keys`: The one place a run key is made: `plan_key` (run_plan, and train/join.py for the base runs a joined run must continue), and `Continued`, what a joined method's runs continue from.
- `_layout`: Where training runs live on disk: file and directory names, and listing them.
- `_lineage`: Whether a saved run still counts: staleness (its inputs and schema) and lineage (a joined run's base).
- `_pending`: Which runs of a run key are still to train, and what else lies beside them (train/run.py's step 4).
- `_reader`: The ONE reader of the run format (walla eval, the market, serve, joining): scenario tables, runs, key files, a scenario's data.
- `_writer`: The ONE writer of the run format (walla train): scenario table, key file, run (layout: train/runs/_layout.py).
"""

from __future__ import annotations

from walla.cli.lazy import door

_ROOMS = {
    "_choice": ("RunChoice", "RunChoiceError", "choose_runs"),
    "_identity": ("TRAIN_SCHEMA", "VALIDITY", "inputs_id", "jsonable", "key_id", "run_key"),
    "_keys": ("Continued", "plan_key"),
    "_layout": (
        "LOCK",
        "METHOD_GROUPS",
        "PREDICTIONS",
        "RUN_META",
        "RunDir",
        "RunFormatError",
        "SCENARIO_META",
        "STATE",
        "TRAIN_LOG",
        "is_complete",
        "key_dir",
        "list_run_dirs",
        "list_scenarios",
        "run_dir",
        "scenario_dir",
    ),
    "_lineage": (
        "lineage_reason",
        "read_current_run_meta",
        "retrain_command",
        "run_seed",
        "stale_run_reason",
        "train_command",
    ),
    "_pending": ("keys_beside", "pending_runs"),
    "_reader": (
        "RunRecord",
        "ScenarioTable",
        "list_matrix",
        "read_key_file",
        "read_run",
        "read_run_meta",
        "read_scenario_meta",
        "read_scenario_table",
        "scenario_data",
    ),
    "_writer": ("write_key_file", "write_run", "write_scenario_table"),
}
__getattr__, __all__ = door(__name__, _ROOMS)
