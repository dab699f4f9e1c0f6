"""Hugging Face Hub access that fails fast and in one line.

Without network, `datasets` and `transformers` retry each request for tens of seconds before
giving up with a multi-line traceback. Before the first hub call we probe the endpoint with one
short TCP connect; when it is unreachable we switch the process to offline mode (HF_HUB_OFFLINE),
so cached copies still load instantly and anything uncached fails at once. Every failure becomes
a `HubUnavailableError` whose message is one line: the id, why, and how to proceed.

`resolve_revision` turns a branch or tag (`main`) into the commit sha that a feature set records:
from the hub API when online, from the local hub cache (`refs/<revision>`) when offline; a pinned
40-hex sha is used as is.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from pathlib import Path
from urllib.parse import urlparse

from huggingface_hub import HfApi, constants, try_to_load_from_cache
from huggingface_hub.file_download import repo_folder_name

PROBE_TIMEOUT_S = 3.0
_TRUE = {"1", "true", "yes", "on"}
_probe_result: bool | None = None  # cached per process
_offline_reason = ""  # why this process went offline (set once)

COMMIT_SHA = re.compile(r"[0-9a-f]{40}")
EMBEDDED_HINT = "use an embedded offline model (--model smollm2-135m or gemma3-270m)"


class HubUnavailableError(RuntimeError):
    """A hub model or dataset cannot be loaded (offline, gated, missing). The message is one line."""

    exit_code = 3  # walla's exit-code table (cli/exits.py): UNREACHABLE

    def __init__(self, message: str, items: list[tuple[str, str, str, str]] | None = None):
        super().__init__(message)
        self.items = items or []  # (kind, repo id, why, how to proceed locally)


def offline_forced() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def hub_reachable(timeout: float = PROBE_TIMEOUT_S) -> bool:
    """One TCP connect to the hub endpoint (HF_ENDPOINT or huggingface.co:443); cached per process."""
    global _probe_result
    if _probe_result is None:
        url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            with socket.create_connection((url.hostname or "huggingface.co", port), timeout=timeout):
                _probe_result = True
        except OSError:
            _probe_result = False
    return _probe_result


def set_offline() -> None:
    """Switch this process to hub offline mode, also in the already-imported hub libraries."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    for mod, attr in (
        ("huggingface_hub.constants", "HF_HUB_OFFLINE"),
        ("datasets.config", "HF_HUB_OFFLINE"),
        ("datasets.config", "HF_DATASETS_OFFLINE"),
        ("transformers.utils.hub", "HF_HUB_OFFLINE"),
    ):
        m = sys.modules.get(mod)
        if m is not None and hasattr(m, attr):
            setattr(m, attr, True)


def prepare_hub_access() -> str:
    """Call before any hub request. Returns why we are offline ("" when online)."""
    global _offline_reason
    if not _offline_reason:
        if offline_forced():
            _offline_reason = "HF_HUB_OFFLINE is set"
        elif not hub_reachable():
            _offline_reason = "no network (the hub endpoint is unreachable)"
        else:
            return ""
        set_offline()
    return _offline_reason


def describe_failure(exc: BaseException) -> str:
    """Short reason for a hub failure, from the exception type (gated, missing, offline, ...)."""
    name = type(exc).__name__
    text = str(exc).splitlines()[0] if str(exc) else name
    if name == "GatedRepoError" or "gated" in text.lower():
        return "the repository is gated (accept its license on the hub and log in with `hf auth login`)"
    if name in ("RepositoryNotFoundError", "DatasetNotFoundError") or "not found" in text.lower():
        return "not found on the hub (check the id, or log in if it is private)"
    if name in ("RevisionNotFoundError",):
        return "the requested revision does not exist"
    return f"{name}: {text[:200]}"


def unavailable(kind: str, repo_id: str, why: str, local_hint: str) -> HubUnavailableError:
    """The one-line error for a model/dataset that cannot be loaded."""
    return combine([HubUnavailableError("", [(kind, repo_id, why, local_hint)])])


def combine(errors: list[HubUnavailableError]) -> HubUnavailableError:
    """One line for every model/dataset that cannot be loaded (so a user fixes them all at once)."""
    items = [it for e in errors for it in e.items]
    whys = list(dict.fromkeys(why for _, _, why, _ in items))
    what = ", ".join(f"{kind} {repo!r}" for kind, repo, _, _ in items)
    hints = list(dict.fromkeys(h for *_, h in items))
    msg = (
        f"cannot load {what} from the Hugging Face Hub: {'; '.join(whys)}. To proceed: run where the hub is "
        "reachable (gated models also need `hf auth login`) or download once and set HF_HUB_OFFLINE=1; or "
        + "; or ".join(hints)
    )
    return HubUnavailableError(msg, items)


def is_commit_sha(revision: str | None) -> bool:
    return bool(revision) and COMMIT_SHA.fullmatch(revision) is not None


def cached_commit(kind: str, repo_id: str, revision: str, filename: str | None = None) -> str | None:
    """The commit sha that the local hub cache holds for `revision`, or None.

    With `filename`, that file must be cached too (huggingface_hub's `try_to_load_from_cache` resolves
    `refs/<revision>` and returns `snapshots/<sha>/<filename>`); without, the `refs/<revision>` file alone.
    """
    if filename is not None:
        hit = try_to_load_from_cache(repo_id, filename, revision=revision, repo_type=kind)
        if not isinstance(hit, str):
            return None
        sha = Path(hit).parents[len(Path(filename).parts) - 1].name  # snapshots/<sha>/<filename>
    else:
        ref = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type=kind) / "refs"
        sha = (ref / revision).read_text().strip() if (ref / revision).is_file() else revision
    return sha if is_commit_sha(sha) else None


def resolve_revision(
    kind: str, repo_id: str, revision: str, hint: str, filename: str | None = None
) -> str | None:
    """Commit sha of `revision` of a hub `kind` ("model" or "dataset") repository.

    A pinned sha is returned as is; online the hub API answers (a failure raises the one-line
    `HubUnavailableError`, with `hint` as the local alternative); offline the local cache does
    (`cached_commit`), and None means it does not hold this revision.
    """
    if is_commit_sha(revision):
        return revision
    if prepare_hub_access():
        return cached_commit(kind, repo_id, revision, filename)
    try:
        return HfApi().repo_info(repo_id, repo_type=kind, revision=revision).sha
    except Exception as e:  # gated, missing, network: one line
        raise unavailable(kind, repo_id, describe_failure(e), hint) from e
