"""Agents' LLMs on Ray workers: one actor per loaded model, heads and pool stay in the server.

    walla serve ... --ray-address auto        # a running cluster (`ray start --head`), as walla extract has it
    walla serve ... --ray-address local       # a Ray started in this process

The server settles each model as without Ray (extract/door.py `settle_for`, checked against the feature
set's recorded identity); the actor settles that `Settled` again on its own machine and stops with one line
naming the field when it settles another identity (extract/distributed.py's rule: `open_backend(resettle=True)`),
then scores the batcher's passes with the same code as in-process (extract/scoring.py `score_prompts`). Ray is
optional (`pip install 'walla[ray]'`): imported only when --ray-address is given.
"""

from __future__ import annotations

from walla.extract.backends import Settled
from walla.extract.backends.registry import open_backend
from walla.extract.scoring import Item, score_prompts


class ModelWorker:
    """One Ray actor: a model loaded through the backend door; scores a pass of prompts."""

    def __init__(self, settled: Settled, threads: int | None = None) -> None:
        if threads:
            import torch

            torch.set_num_threads(threads)
        self.backend = open_backend(settled, resettle=True)  # another identity on this machine: one line

    def format_prompt(self, text: str) -> str:
        return self.backend.format_prompt(text)

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text)

    def features(self, items: list[Item]) -> list:
        return score_prompts(self.backend, items)

    def close(self) -> None:
        self.backend.close()


class RemoteBackend:
    """The server's handle on a ModelWorker: what forecast.py (`format_prompt`, `encode` for the prompt cap) and
    the batcher (`features`, one remote call per pass) use in place of a local backend."""

    def __init__(self, actor, ray) -> None:
        self.actor, self.ray = actor, ray

    def format_prompt(self, text: str) -> str:
        return self.ray.get(self.actor.format_prompt.remote(text))

    def encode(self, text: str) -> list[int]:
        return self.ray.get(self.actor.encode.remote(text))

    def features(self, items: list[Item]) -> list:
        return self.ray.get(self.actor.features.remote(list(items)))

    def close(self) -> None:
        try:
            self.ray.get(self.actor.close.remote(), timeout=30)
        finally:
            self.ray.kill(self.actor)


def start_ray(address: str):
    """ray, initialized: `local` starts one in this process, anything else is a cluster address."""
    try:
        import ray
    except ImportError:
        raise ValueError(
            "--ray-address needs Ray, which is not installed: pip install 'walla[ray]'"
        ) from None
    if not ray.is_initialized():
        common = {"include_dashboard": False, "log_to_driver": False, "logging_level": "WARNING"}
        if address == "local":
            ray.init(**common)
        else:
            ray.init(address=address, **common)
    return ray


def remote_backend(settled: Settled, ray, num_cpus: float = 1) -> RemoteBackend:
    """A ModelWorker actor for `settled`, started and loaded (its load errors raised here as one line)."""
    actor = ray.remote(ModelWorker).options(num_cpus=num_cpus).remote(settled)
    handle = RemoteBackend(actor, ray)
    try:
        handle.format_prompt("")  # waits for the load; a worker that cannot settle the identity says so
    except Exception as e:  # noqa: BLE001 - Ray wraps the worker's error: its last line is the reason
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        ray.kill(actor)
        raise ValueError(f"a Ray worker could not load the model: {lines[-1] if lines else e}") from None
    return handle
