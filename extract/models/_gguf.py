"""The per-user cache under `$WALLA_CACHE` (default ~/.cache/walla) and the GGUF -> safetensors copies in it.

GGUF files (the embedded models) load through transformers' `gguf_file=` (dequantized). That load
takes 20-90 s on a small CPU, so the first load saves the dequantized model as safetensors under
`cache_root()/gguf/<sha256[:16]>/`, keyed by the GGUF file's sha256; later loads take ~1 s and give
identical weights. Both backends read that directory: hf loads it with transformers, vllm (which
reads safetensors only) is pointed at it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import shutil
import uuid
from pathlib import Path

import gguf
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging
from walla.extract.models._cache import cache_root

log = logging.getLogger(__name__)

DONE_MARKER = "walla-converted.json"


@contextlib.contextmanager
def fast_gguf_reads():
    """transformers parses the GGUF header twice and rebuilds gguf's tensor-name map once per tensor
    (~400 times, ~15 s); share one reader and memoize the map for the duration of one load."""
    orig_map, orig_reader = gguf.get_tensor_name_map, gguf.GGUFReader
    readers: dict = {}

    def reader(path, *args, **kwargs):
        key = (str(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = orig_reader(path, *args, **kwargs)
        return readers[key]

    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(orig_map)
    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.get_tensor_name_map, gguf.GGUFReader = orig_map, orig_reader


@contextlib.contextmanager
def quiet_transformers():
    """No per-tensor progress bars from transformers while we load (our own bar reports progress)."""
    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def converted_gguf_dir(gguf_path: Path, sha256: str) -> Path:
    """Safetensors copy of a GGUF model (built on first use, atomically; see module docstring)."""
    out = cache_root() / "gguf" / sha256[:16]
    if (out / DONE_MARKER).exists():
        return out
    log.warning("first load of %s: converting the GGUF to safetensors in %s (once)", gguf_path.name, out)
    with fast_gguf_reads(), quiet_transformers():
        tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
        )
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config  # weights are dequantized: load them as plain safetensors
    model.hf_quantizer = None
    tmp = out.with_name(f"{out.name}.{uuid.uuid4().hex[:8]}.incomplete")
    try:
        with quiet_transformers():
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
        (tmp / DONE_MARKER).write_text(json.dumps({"gguf": gguf_path.name, "sha256": sha256}))
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            tmp.rename(out)
        except OSError:
            if not (out / DONE_MARKER).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def local_weights_dir(rm) -> str:
    """Where a safetensors-reading loader finds a resolved model: the GGUF cache copy, or `load_from`."""
    if rm.gguf_file and rm.identity.get("source") != "hub":
        return str(converted_gguf_dir(Path(rm.load_from) / rm.gguf_file, rm.identity["gguf_sha256"]))
    return rm.load_from
