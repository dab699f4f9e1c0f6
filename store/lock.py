"""The one-writer lock of a feature set: a filelock next to its directory (`<fp>.lock`).

Take it BEFORE loading a model, so a second `walla extract` of the same key refuses at once. The kernel
releases a flock when its process dies, so a killed writer never leaves a stale lock. A remote store
(store/location.py) has no flock: there, one driver per feature set is the user's promise.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import filelock
from walla.store.features import LOCK, FeatureSetSpec, LockedError
from walla.store.location import is_remote


@contextlib.contextmanager
def writer_lock(store: Path, spec: FeatureSetSpec, timeout: float = 0.0) -> Iterator[Path]:
    """Hold the one-writer lock of a feature set (take it BEFORE loading a model: a second writer refuses).

    Args:
        timeout: seconds to wait for another writer of the same key (0: fail at once; -1: wait forever).
    Yields:
        The lock file's path.
    Raises:
        LockedError: another process writes this feature set.
    """
    final = spec.path(store)
    if is_remote(final):  # object stores have no flock: one driver per feature set (store/location.py)
        yield None
        return
    final.parent.mkdir(parents=True, exist_ok=True)
    lock_path = final.with_name(final.name + LOCK)
    lock = filelock.FileLock(str(lock_path), timeout=timeout)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise LockedError(
            f"feature set {final} is being written by another process (lock {lock_path}); wait for it to finish "
            "(the lock is released automatically if that process dies)"
        ) from None
    try:
        yield lock_path
    finally:
        lock.release()
