"""The `hf` backend kind: how walla extract settles, fingerprints and loads a transformers model.

    settled = HF.settle(request, HFOptions(compile="auto", batch_invariant="auto"))
    backend = HF.load(settled)

The scoring itself is extract/backends/hf/_backend.py; this is the registry's view of it. `settle` decides, in
this order and before anything loads: the dtype (`auto` measured once per machine, extract/dtype_probe.py),
`compile` (by device and job size, extract/backends/hf/_compile.py), `batch_invariant` (by dtype and device,
hf/modes.py), the batch tokens and shard rows (free memory and the model's shape on CUDA, extract/sizing.py), and
from those the determinism tier and the identity, so the fingerprint records what the model runs with:

- `bitwise`: batch-invariant scoring: a packed stream on the CPU (hf/packed.py), fixed-shape packs on
  CUDA or with `batch_invariant=fixed` (hf/fixed.py, the constants recorded as `fixed_shapes`): a prompt's
  numbers do not depend on its batch or shard (a probe at load picks packs of several prompts or one each;
  both give the same bits);
- `batch-recorded`: reduced precision on padded batches: the numbers depend on which prompts share a
  pass and on the kernels the accelerator picks, so the batching and the accelerator model are recorded;
- `tolerance`: float32 on padded batches: batch composition moves results by float32 GEMM rounding only;
  the batching is not recorded, and `FP32_PADDED_BOUND` (checked by tests/extract/test_settle.py) states
  how far two batchings of one prompt may differ.

The device kind (cpu, cuda, mps) is in every identity: the same dtype on a CPU and a GPU rounds differently.
A `bitwise` or `batch-recorded` set also records its kernel path (`kernels`: extract/device.py
`kernel_identity`: on a CPU ATen's vector ISA, the bf16/AMX features and any ONEDNN_MAX_CPU_ISA cap; on CUDA
the GPU, its compute capability and the CUDA/cuDNN/cuBLAS versions): the same dtype and library versions on
another path compute other bits (issue 37: bf16 SmolLM2-135M, AVX512-bf16 vs oneDNN capped at AVX2, option
log-probs up to 0.197 apart), so a set is never continued, nor reported complete, by another path
(extract/run.py refuses it naming the field). A `tolerance` set (float32, padded) does not record it: its
promise is a bound, not bits, and another kernel path moves float32 results by float32 rounding only (other
vector widths sum in another order, as another batching does), inside `FP32_PADDED_BOUND`: measured on
SmolLM2-135M, 80 facts rows, AVX512 vs oneDNN and ATen capped at AVX2: max |d option log-prob| 2.1e-5, |d NLL|
9.1e-6, hidden rows 2.0e-4 of their largest value (0 of 80 rows bit-equal); tests/extract/test_kernels.py checks
the bound under the cap on a tiny model. So float32 padded sets keep their fingerprints.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch
from walla.extract import device as devices
from walla.extract import sizing
from walla.extract.backends import BATCHING_KEY, TIER_KEY, BackendRequest, CheckpointKind, Settled
from walla.extract.backends.hf import _lm_head as lm_head
from walla.extract.models import ResolvedModel
from walla.manifests.validate import check, config

if TYPE_CHECKING:
    from walla.extract.backends.hf._backend import HFBackend

# The scoring modules (hf/backend.py, hf/modes.py, hf/load.py and the hf_*.py they import: transformers' modeling
# code, 1.5-3 s) are imported where they are first used, in settle/load: `walla extract`'s inputs phase asks
# this kind only for the device and the model's revision, and a few thousand questions then read in under a
# second (issue 39).

# float32 on padded batches (`tolerance` tier): how far one prompt's outputs may move between two batchings
# (batch tokens, shard rows). Measured (issue 27): SmolLM2-135M, 40 rows, --shard-rows 5 --batch-tokens 200
# vs the defaults: max |d option log-prob| 1.05e-5, hidden rows up to 9.8e-4 apart (|h| up to ~10^2);
# tests/extract/test_settle.py checks the bound on a tiny model (test_kernels.py: across CPU kernel paths too).
# Hidden states are stored as float16 (a relative step of ~1e-3), so the hidden bound is relative to the row's
# largest value.
FP32_PADDED_BOUND = {"option_logprobs": 1e-4, "prompt_nll": 1e-4, "hidden_relative": 1e-3}


@config
class HFOptions:
    """`--backend-arg` keys of the hf backend (`auto` is decided by `HF.settle`)."""

    compile: str = "auto"  # torch.compile the decoder layers: auto (by device and job size) | on | off
    # batch-invariant scoring: auto (on in reduced precision; on CUDA as hf_modes.CUDA_INVARIANT_BY_DEFAULT)
    # | on (the device's path: packed on a CPU, fixed shapes on CUDA) | off | fixed (the fixed-shape path on any
    # device)
    batch_invariant: str = "auto"
    # prompts per forward pass at most (0: as many as the batch tokens hold); `walla check`'s `hf batch=1` row.
    # Recorded where it changes numbers (padded batches: in `batching`); a bitwise tier's numbers do not move
    max_batch_rows: int = 0

    def __post_init__(self) -> None:
        from walla.extract.backends.hf._compile import COMPILE_MODES
        from walla.extract.backends.hf._modes import BATCH_INVARIANT_MODES  # scoring modules: see the imports

        check(self.compile in COMPILE_MODES, "compile", "auto, on or off", self.compile)
        check(self.max_batch_rows >= 0, "max_batch_rows", ">= 0 (0: no limit)", self.max_batch_rows)
        check(
            self.batch_invariant in BATCH_INVARIANT_MODES,
            "batch_invariant",
            "auto, on, off or fixed",
            self.batch_invariant,
        )


def model_shape(rm: ResolvedModel, dtype: str) -> sizing.ModelShape:
    """The model's shape from its config alone (no weights read).

    Raises:
        OSError, ValueError: the config cannot be read, or lacks a field the sizing needs.
    """
    from transformers import AutoConfig  # scoring modules: see the imports
    from walla.extract.models import local_weights_dir, quiet_transformers

    kwargs: dict = {"trust_remote_code": rm.trust_remote_code}
    if rm.identity.get("source") == "hub":
        kwargs |= {k: v for k, v in (("gguf_file", rm.gguf_file), ("revision", rm.revision)) if v}
    with quiet_transformers():
        config = AutoConfig.from_pretrained(local_weights_dir(rm), **kwargs)
    return sizing.ModelShape.from_config(config, dtype)


def scoring_fixed_bytes(shape: sizing.ModelShape) -> int:
    """Device bytes of the scoring path that do not grow with the batch: the last-position head's
    HEAD_ROWS x V logits (model dtype + float32 + log-softmax) and one prompt-NLL chunk of logits."""
    head = lm_head.HEAD_ROWS * shape.vocab * (shape.dtype_bytes + 8)
    return head + lm_head.CHUNK_ELEMS_CUDA * (2 * shape.dtype_bytes + 8)


def device_figures(
    rm: ResolvedModel, dtype: str, device: str
) -> tuple[sizing.ModelShape | None, int | None, str]:
    """(model shape, free bytes of `device`, why either is missing) for the CUDA sizing."""
    if not torch.cuda.is_available():
        return (
            None,
            None,
            "CUDA is not visible from this process; --batch-tokens sizes it for the workers' GPUs",
        )
    free, _total = torch.cuda.mem_get_info(torch.device(device))
    try:
        return model_shape(rm, dtype), int(free), ""
    except (OSError, ValueError) as e:
        return None, int(free), f"model shape unknown: {' '.join(str(e).split())[:160]}"


def determinism_tier(dtype: torch.dtype, invariant: bool) -> str:
    """The tier of hf scoring with this dtype and batch invariance (module docstring)."""
    if invariant:
        return "bitwise"
    return "tolerance" if dtype == torch.float32 else "batch-recorded"


def _sizes(request: BackendRequest, recorded: dict, dtype_name: str) -> sizing.Sizes:
    """Batch tokens and shard rows: as asked, else as `recorded`, else sized for the device."""
    bt = request.batch_tokens or recorded.get("batch_tokens")
    sr = request.shard_rows or recorded.get("shard_rows")
    shape, free, unknown = None, None, ""
    if request.device.startswith("cuda") and (bt is None or sr is None):
        shape, free, unknown = device_figures(request.model, dtype_name, request.device)
    fixed = scoring_fixed_bytes(shape) if shape else 0
    sizes = sizing.settle_sizes(request.device, bt, sr, shape, free, fixed, unknown)
    if recorded and (request.batch_tokens is None or request.shard_rows is None):
        why = f"batch tokens {sizes.batch_tokens:,}, shard rows {sizes.shard_rows:,}: as recorded"
        sizes = replace(sizes, why=why)
    return sizes


class HFKind(CheckpointKind):
    """transformers on a CPU or a GPU; safetensors or GGUF weights."""

    name = "hf"
    Options = HFOptions

    def usable(self) -> tuple[bool, str]:
        return True, ""  # transformers and torch are core dependencies

    def settle(self, request: BackendRequest, options: HFOptions, recorded: dict | None = None) -> Settled:
        from walla.extract.backends.hf import _fixed as hf_fixed  # scoring modules: see the imports
        from walla.extract.backends.hf._compile import explain_compile
        from walla.extract.backends.hf._modes import (
            DTYPES,
            batching_identity,
            explain_batch_invariant,
            explain_dtype,
            hf_identity,
            invariant_path,
        )

        device_kind = devices.check_device_name(request.device)
        dtype_name, dtype_why = explain_dtype(request.dtype, request.device)
        dtype = DTYPES[dtype_name]
        est = request.est_tokens() if options.compile == "auto" and request.est_tokens else 0
        compiled, compile_why = explain_compile(options.compile, est, request.device)
        invariant, inv_why = explain_batch_invariant(options.batch_invariant, dtype, request.device)
        path = invariant_path(options.batch_invariant, request.device) if invariant else "off"
        sizes = _sizes(request, recorded or {}, dtype_name)
        tier = determinism_tier(dtype, invariant)
        batching = batching_identity(dtype, invariant, sizes.batch_tokens, sizes.shard_rows)
        if batching and options.max_batch_rows:
            batching = {**batching, "max_batch_rows": options.max_batch_rows}
        fixed = hf_fixed.fixed_identity(device_kind, dtype) if path == "fixed" else None
        identity = {
            "model": request.model.identity,
            **hf_identity(dtype, request.chat_template, compiled, invariant, batching, fixed),
            "device": device_kind,
            TIER_KEY: tier,
            **({"accelerator": devices.accelerator(request.device)} if tier == "batch-recorded" else {}),
            **({"kernels": devices.kernel_identity(request.device)} if tier != "tolerance" else {}),
            **({"tolerance": FP32_PADDED_BOUND} if tier == "tolerance" else {}),
        }
        args = ["--dtype", dtype_name, "--device", device_kind]
        args += ["--backend-arg", f"compile={'on' if compiled else 'off'}"]
        mode = {"off": "off", "packed": "on", "fixed": "fixed"}[path]  # re-settles to this path on any device
        args += ["--backend-arg", f"batch_invariant={mode}"]
        if options.max_batch_rows:
            args += ["--backend-arg", f"max_batch_rows={options.max_batch_rows}"]
        if BATCHING_KEY in identity:  # the sizes that fix which prompts share a pass
            args += ["--batch-tokens", str(sizes.batch_tokens), "--shard-rows", str(sizes.shard_rows)]
        return Settled(
            kind=self.name,
            request=replace(
                request,
                dtype=dtype_name,
                batch_tokens=sizes.batch_tokens,
                shard_rows=sizes.shard_rows,
                est_tokens=None,
            ),
            options=HFOptions(
                compile="on" if compiled else "off",
                batch_invariant=mode,
                max_batch_rows=options.max_batch_rows,
            ),
            tier=tier,
            identity=identity,
            why=(f"dtype {dtype_why}", compile_why, inv_why, sizes.why, f"determinism: {tier}"),
            command_args=tuple(args),
            environment=("device", "accelerator", "kernels", "torch", "transformers"),
            # what follows from the device through auto/on: the invariant path (packed on a CPU, fixed on CUDA)
            derived=(
                TIER_KEY,
                BATCHING_KEY,
                "tolerance",
                "batch_invariant",
                "invariant_scoring",
                "fixed_shapes",
                "compile",
            ),
        )

    def recorded_options(self, identity: dict) -> dict:
        """compile, the invariant path (`fixed` where fixed shapes are recorded, else on or off) and, where
        the batching records it, max_batch_rows (a bitwise set's numbers do not depend on it)."""
        path = "fixed" if "fixed_shapes" in identity else ("on" if identity.get("batch_invariant") else "off")
        rows = (identity.get(BATCHING_KEY) or {}).get("max_batch_rows")
        return {
            "compile": "on" if identity.get("compile") else "off",
            "batch_invariant": path,
            **({"max_batch_rows": rows} if rows else {}),
        }

    def gpus_per_worker(self, settled: Settled) -> int:
        return 1

    def load(self, settled: Settled) -> HFBackend:
        from walla.extract.backends.hf._load import load_hf_backend  # scoring modules: see the imports
        from walla.extract.models import non_embedding_params

        backend = load_hf_backend(
            settled.model,
            dtype=settled.dtype,
            device=settled.device,
            batch_tokens=settled.batch_tokens,
            chat_template=settled.request.chat_template,
            compiled=settled.options.compile == "on",
            batch_invariant=settled.options.batch_invariant in ("on", "fixed"),
            shard_rows=settled.shard_rows,
            fixed_shapes=settled.options.batch_invariant == "fixed",
            max_batch_rows=settled.options.max_batch_rows or None,
        )
        backend.n_params = non_embedding_params(backend.model)
        return backend


HF = HFKind()
