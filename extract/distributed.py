"""Extraction over many workers: Ray actors (one model each) fill the row ranges of one feature set.

    walla extract --model smollm2-135m --dataset arc-challenge --workers 2               # local Ray
    walla extract --model aloe --dataset medmcqa --backend vllm --device cuda --dtype bfloat16 \\
        --ray-address auto --workers 8 --store s3://bucket/walla-store                    # a GPU cluster

The driver (the `walla extract` process) resolves everything a fingerprint needs, writes the question
table and opens each feature set's writer (store/features/_writer.py) exactly as the single-process path
does; then, instead of scoring itself:
1. it starts N actors (`RangeWorker`); each settles the driver's `Settled` again on its own machine and
   stops with one line naming the field when it settles another identity (another GPU model, another
   torch), then loads the model once through the same door (`open_backend`) and renders prompts with the
   same `prepare_variant` (extract/variant.py), so every row is computed by the same code as without Ray;
2. it cuts the rows no durable shard holds into ranges of whole zarr chunks (`FeatureSetWriter.missing`)
   and hands them out one at a time; a worker scores its range and writes it as one durable shard
   (hidden rows into their own chunks, then the shard's Parquet file);
3. a worker that dies (killed, OOM, node lost) has its range handed to another one, and a replacement
   actor is started; a rerun of the whole command skips every finished range;
4. when every range is in, the driver commits (meta.json last).
Ray is an optional dependency (`pip install 'walla[ray]'`): it is imported inside the functions that run
only when --workers/--ray-address is given, or inside an actor.
On CPUs an actor gets `cpus // N` threads; on GPUs `--tensor-parallel-size` GPUs (vLLM) or 1 (HF).
"""

from __future__ import annotations

import os
import socket
import time
from collections import deque
from pathlib import Path

import torch
from walla.extract.backends import BackendKind, Settled
from walla.extract.backends.registry import backend_kind, backend_names, open_backend, register_backend
from walla.extract.command import reproduce_command
from walla.extract.config import ExtractConfig
from walla.extract.progress import Progress
from walla.extract.variant import PreparedVariant, prepare_variant, score_range
from walla.store.features import attach_writer, default_chunk_rows, open_writer

# replacements before giving up: a worker that always dies (OOM) is not retried forever
MAX_DEATHS_PER_WORKER = 2


class RangeWorker:
    """One Ray actor: a loaded backend that scores row ranges and writes them into the store."""

    def __init__(self, kind: BackendKind, settled: Settled, check_device: bool, threads: int | None):
        if threads:
            torch.set_num_threads(threads)
        if settled.kind not in backend_names():  # registered at run time in the driver (the tests' fake)
            register_backend(kind)
        if check_device:  # on a cluster, each worker checks its own device (the driver's may differ)
            kind.check_device(settled.device)
        self.backend = open_backend(settled, resettle=True)  # another identity here: one line, no rows
        self.device = settled.device
        self.call_rows = settled.shard_rows  # score() calls cut at its multiples, as in the single process
        self.prepared: dict[str, PreparedVariant] = {}

    def info(self) -> dict:
        return {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "hidden_size": self.backend.hidden_size,
            "n_params_non_embedding": self.backend.n_params,
            "device": self.device,
        }

    def prepare(self, spec, context: list) -> int:
        """Render the prompts of `spec`'s variant once per actor; returns the number of rows."""
        if spec.fingerprint not in self.prepared:
            import ray  # optional dependency (walla[ray]); this method only ever runs inside a Ray actor

            table, template, option_tokens, seed = ray.get(context[0])  # in a list: fetched only when needed
            self.prepared[spec.fingerprint] = prepare_variant(
                self.backend, table, template, spec.variant, option_tokens, seed
            )
        return len(self.prepared[spec.fingerprint].prompts)

    def run(self, store, spec, pieces: list[tuple[int, int]], context: list) -> tuple[int, int]:
        """Score and store the row ranges `pieces` (one chunk-aligned block); returns (rows, tokens)."""
        self.prepare(spec, context)
        w = attach_writer(store, spec)
        rows = tokens = 0
        for a, b in pieces:
            df, hidden = score_range(
                self.backend, self.prepared[spec.fingerprint], a, b, call_rows=self.call_rows
            )
            w.write_range(a, df, hidden)
            rows += b - a
            tokens += int(df["n_prompt_tokens"].sum())
        return rows, tokens

    def close(self) -> None:
        self.backend.close()


def _worker_error(e: BaseException) -> str:
    """The one line a worker raised while starting (e.g. another identity), out of Ray's wrapped error."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    for ln in reversed(lines):
        for prefix in ("ValueError: ", "RuntimeError: "):
            if ln.startswith(prefix):
                return "a Ray worker could not start: " + ln.removeprefix(prefix)
    return f"a Ray worker could not start: {lines[-1] if lines else type(e).__name__}"


def _after_range(pool: WorkerPool, pieces: list[tuple[int, int]]) -> None:
    """Called by the driver after each finished range (module-level so fault tests can interpose)."""


class WorkerPool:
    """N RangeWorker actors; hands out ranges, redoes the range of a worker that died, replaces it."""

    def __init__(self, ray, worker_args: tuple, n: int, options: dict, threads: int | None, out):
        self.ray, self.worker_args, self.out = ray, worker_args, out  # worker_args: RangeWorker's first three
        self.options, self.threads, self.n = options, threads, n
        self.deaths = 0
        self.actors = [self._start() for _ in range(n)]
        try:
            infos = ray.get([a.info.remote() for a in self.actors])
        except Exception as e:  # noqa: BLE001 - an actor's constructor failed: its own one line, not Ray's
            raise RuntimeError(_worker_error(e)) from None
        self.info = dict(zip(self.actors, infos, strict=True))
        self.hidden_size = infos[0]["hidden_size"]

    def _start(self):
        return self.ray.remote(RangeWorker).options(**self.options).remote(*self.worker_args, self.threads)

    def describe(self, actor) -> str:
        i = self.info.get(actor)
        return f"pid {i['pid']} on {i['host']}" if i else "a new worker"

    def run(self, store, spec, tasks: list[list[tuple[int, int]]], context: list, bar) -> None:
        """Every task done (or an exception): each task is a list of row ranges inside one block."""
        from ray.exceptions import RayActorError, RayTaskError, WorkerCrashedError  # optional: walla[ray]

        pending, running, idle = deque(tasks), {}, list(self.actors)
        while pending or running:
            while pending and idle:
                actor, task = idle.pop(0), pending.popleft()
                running[actor.run.remote(store, spec, task, context)] = (actor, task)
            ready, _ = self.ray.wait(list(running), num_returns=1)
            actor, task = running.pop(ready[0])
            try:
                rows, tokens = self.ray.get(ready[0])
            except (RayActorError, WorkerCrashedError) as e:
                self.deaths += 1
                self.out(
                    f"worker {self.describe(actor)} died during rows {task[0][0]}-{task[-1][1]} "
                    f"({type(e).__name__}); the range is redone by another worker"
                )
                if self.deaths > MAX_DEATHS_PER_WORKER * self.n:
                    raise RuntimeError(
                        f"Ray workers died {self.deaths} times (last during rows {task[0][0]}-{task[-1][1]}); "
                        "giving up -- check the workers' memory/devices, then rerun to resume"
                    ) from None
                pending.appendleft(task)
                self.actors.remove(actor)
                new = self._start()
                self.actors.append(new)
                idle.append(new)
                continue
            except RayTaskError as e:  # the worker raised: the same error the single process would
                cause = e.cause if isinstance(getattr(e, "cause", None), BaseException) else None
                raise (cause or RuntimeError(str(e).splitlines()[-1])) from None
            idle.append(actor)
            bar.advance(rows, tokens)
            _after_range(self, task)

    def close(self) -> None:
        for a in self.actors:
            try:
                self.ray.get(a.close.remote(), timeout=60)
            except Exception:  # noqa: BLE001 - a dead actor has nothing to close
                pass
            self.ray.kill(a)


def _ray_start(cfg: ExtractConfig, out):
    """Import Ray and connect (cluster) or start a local one; returns (ray, started_here)."""
    try:
        import ray  # optional dependency, needed only for --workers/--ray-address
    except ImportError:
        raise RuntimeError(
            "--workers/--ray-address need Ray, which is not installed: pip install 'walla[ray]'"
        ) from None
    if ray.is_initialized():  # e.g. a test or a notebook started it
        return ray, False
    common = {"include_dashboard": False, "log_to_driver": False, "logging_level": "WARNING"}
    if cfg.ray_address:
        ray.init(address=cfg.ray_address, **common)
    else:
        ray.init(num_cpus=max(cfg.workers or 1, os.cpu_count() or 1), **common)
    return ray, True


def _resources(ray, cfg: ExtractConfig, settled: Settled) -> tuple[int, dict, int | None]:
    """(actors, actor options, torch threads per actor) for this cluster and device."""
    total = ray.cluster_resources()
    if settled.device.startswith("cuda"):
        gpus = backend_kind(settled.kind).gpus_per_worker(settled)
        n = cfg.workers or max(1, int(total.get("GPU", 0)) // gpus)
        return n, {"num_gpus": gpus, "num_cpus": 1}, None
    n = cfg.workers or 1
    threads = max(1, int(total.get("CPU", 1)) // n)
    return n, {"num_cpus": threads}, threads


def extract_parallel(todo, table, template, d_entry, cfg: ExtractConfig, settled: Settled, out) -> list[Path]:
    """Extract the variants in `todo` [(variant, spec)] with Ray actors; return the feature-set paths.

    The caller holds each spec's writer lock (extract/run.py); every actor opens `settled` (re-settled there).
    """
    ray, started = _ray_start(cfg, out)
    pool = None
    try:
        n_workers, options, threads = _resources(ray, cfg, settled)
        t_load = time.perf_counter()
        worker_args = (backend_kind(settled.kind), settled, bool(cfg.ray_address))
        pool = WorkerPool(ray, worker_args, n_workers, options, threads, out)
        where = f"Ray cluster {cfg.ray_address}" if cfg.ray_address else "a local Ray"
        out(
            f"{n_workers} workers on {where} ({', '.join(pool.describe(a) for a in pool.actors)}), "
            f"model loaded in {time.perf_counter() - t_load:.1f} s"
        )
        context = [ray.put((table, template, d_entry.option_tokens, cfg.context_seed))]
        paths = []
        with Progress(cfg.progress) as bar:
            for variant, spec in todo:
                t0 = time.perf_counter()
                n = ray.get(pool.actors[0].prepare.remote(spec, context))
                h = pool.hidden_size
                command = reproduce_command(cfg, [variant], settled.kind, list(settled.command_args))
                chunk = min(default_chunk_rows(h, n), settled.shard_rows)  # ranges never share a chunk
                with open_writer(
                    cfg.store,
                    spec,
                    hidden_size=h,
                    total_rows=n,
                    chunk_rows=chunk,
                    command=command,
                    locked=True,
                ) as w:
                    block = -(-settled.shard_rows // w.chunk_rows) * w.chunk_rows
                    tasks = w.missing(block)
                    todo_rows = sum(b - a for t in tasks for a, b in t)
                    if todo_rows < n:
                        out(
                            f"resuming {spec.model}/{spec.dataset}/{spec.variant}: {n - todo_rows} rows of "
                            f"finished ranges kept, {len(tasks)} ranges of {block} rows to do"
                        )
                    bar.task(f"{spec.model} {spec.dataset}/{spec.variant}", n, n - todo_rows)
                    pool.run(cfg.store, spec, tasks, context, bar)
                    first = next(iter(pool.info.values()), {})
                    w.stats = {  # compute accounting, as the single process records it (meta.json "compute")
                        "n_params_non_embedding": first.get("n_params_non_embedding"),
                        "wall_s": time.perf_counter() - t0,
                        "device": first.get("device") or settled.device,
                        "workers": n_workers,
                    }
                    path = w.commit()
                out(
                    f"wrote {spec.model}/{spec.dataset}/{spec.variant}: {n} rows in "
                    f"{time.perf_counter() - t0:.1f} s with {n_workers} workers, fingerprint {spec.fingerprint}\n"
                    f"  {path}"
                )
                paths.append(path)
        return paths
    finally:
        if pool is not None:
            pool.close()
        if started:
            ray.shutdown()
