"""The exact `walla extract` command line that re-creates one feature set (recorded in its meta.json).

Store readers quote it in their 'corrupt / stale / inconsistent' errors after `walla store rm`, so the
remedy rebuilds the same question table and the same fingerprint: every option that changes the bytes
is repeated (the resolved backend and its own options, --size of a generated dataset, --data-file, ...).
"""

from __future__ import annotations

import shlex

from walla.extract.config import ExtractConfig


def reproduce_command(
    cfg: ExtractConfig, variants: list[str] | tuple[str, ...], backend: str, backend_args: list[str]
) -> str:
    """`walla extract ...` for these variants with every content-changing option of `cfg` spelled out.

    `backend_args` are what the backend settled (`Settled.command_args`: e.g. `--dtype float32 --device cpu
    --backend-arg compile=on`).
    """
    argv = ["walla", "extract", "--model", cfg.model, "--dataset", cfg.dataset]
    argv += ["--variants", ",".join(variants)]
    argv += ["--store", str(cfg.store), "--backend", backend, *backend_args]
    optional = {
        "--data-file": cfg.data_file,
        "--split": cfg.split,
        "--hub-config": cfg.hub_config,
        "--limit": cfg.limit,
        "--sample": cfg.sample,
        "--size": cfg.size,
    }  # --device, --dtype and the batching come with the backend's args: they are part of its identity
    for flag, value in optional.items():
        if value is not None:
            argv += [flag, str(value)]
    if cfg.chat_template is not None:
        argv.append("--chat-template" if cfg.chat_template else "--no-chat-template")
    if "irrelevant" in variants and cfg.context_seed:
        argv += ["--context-seed", str(cfg.context_seed)]
    return shlex.join(argv)
