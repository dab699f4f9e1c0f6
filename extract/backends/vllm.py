"""vLLM backend (GPU only): the same three outputs as the hf backend through vLLM's offline API.

Written against vllm 0.11.x (`pip install "walla[vllm]"`; the V1 engine). There is no GPU on the
machine this was developed on, so this module has NOT been run end to end: its pure parts
(request building, output parsing, ordering checks, option log-probs from hidden states) are
unit-tested with fake vLLM output objects (tests/extract/test_vllm_backend.py), and the engine
calls follow the documented API. Check them on your pinned version before a large run.

Two passes over the same token-id prompts (`TokensPrompt`, so both see exactly our tokenization):
1. generate runner, `SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0, logprobs=1,
   detokenize=False)`: `prompt_logprobs` holds log p(token_t | prefix) of every real prompt token
   -> the prompt NLL (no pads exist in vLLM, so it matches hf's real-token NLL); the 1 generated
   token's log-prob = the top-1 log-prob at the last position (used as a consistency check).
2. pooling runner, `runner="pooling"` with `PoolerConfig(pooling_type="LAST", normalize=False)`:
   the final-norm hidden state of the last prompt token (what vLLM feeds its LM head).
Option log-probs: vLLM returns only top-k log-probs (options may fall outside the top k), so we
apply the checkpoint's LM head (read from its safetensors) to the pooled hidden state ourselves:
log_softmax(cap(h @ W^T))[option ids] over the FULL vocabulary, exactly like the hf backend. The
max of that distribution must equal pass 1's top-1 log-prob (checked per row, tolerance 2e-2 in
bf16), which proves the pooled hidden state and our head agree with vLLM's own logits.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from walla.extract.backends import Progress, ScoreResult
from walla.extract.models import ResolvedModel

log = logging.getLogger(__name__)

TARGET_VERSION = "0.11"  # the vLLM minor version this adapter follows
GENERATE_PARAMS = {
    "max_tokens": 1,
    "temperature": 0.0,
    "prompt_logprobs": 0,
    "logprobs": 1,
    "detokenize": False,
}
TOP1_TOL = 2e-2  # |our top-1 log-prob - vLLM's| allowed (bf16 logits)


def vllm_usable() -> tuple[bool, str]:
    if importlib.util.find_spec("vllm") is None:
        return False, "vllm is not installed (GPU only: pip install 'walla[vllm]')"
    if not torch.cuda.is_available():
        return False, "no CUDA GPU is available"
    return True, ""


def vllm_identity(dtype: str, chat_template: bool) -> dict:
    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return {
        "backend": "vllm",
        "vllm": version,
        "dtype": dtype,
        "chat_template": bool(chat_template),
        "nll": "real-tokens",
        "hidden": "pooling LAST, not normalized",
    }


# ----------------------------------------------------------------------------- pure parts (unit-tested)


def build_requests(token_ids: Sequence[Sequence[int]]) -> list[dict]:
    """TokensPrompt dicts (a TypedDict in vLLM, so plain dicts are accepted)."""
    return [{"prompt_token_ids": list(ids)} for ids in token_ids]


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


def parse_generate_output(out, prompt_ids: Sequence[int]) -> tuple[float, int, float]:
    """(mean prompt NLL over real tokens, n tokens, top-1 log-prob at the last position) of one output.

    `out.prompt_logprobs[t]` is {token_id: Logprob} for position t (None at t = 0) and always holds
    the actual prompt token; `out.outputs[0].logprobs[0]` holds the generated (greedy = top-1) token.
    """
    plp = out.prompt_logprobs
    n = len(prompt_ids)
    if plp is None or len(plp) != n:
        raise RuntimeError(
            f"vLLM returned {None if plp is None else len(plp)} prompt log-probs for {n} prompt tokens"
        )
    nll = [-_logprob_value(plp[t][prompt_ids[t]]) for t in range(1, n)]
    gen = out.outputs[0]
    step = gen.logprobs[0]
    top1 = _logprob_value(step[gen.token_ids[0]])
    return (float(np.mean(nll)) if nll else 0.0), n, top1


def parse_pooling_output(out) -> np.ndarray:
    """Hidden state [H] from an EmbeddingRequestOutput (`.outputs.embedding`) or PoolingRequestOutput (`.outputs.data`)."""
    o = out.outputs
    vec = o.embedding if hasattr(o, "embedding") else o.data
    if isinstance(vec, torch.Tensor):
        return vec.float().cpu().numpy()
    return np.asarray(vec, dtype=np.float32)


def option_logprobs_from_hidden(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    token_ids: Sequence[int],
    softcap: float | None = None,
    bias: torch.Tensor | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Full-vocabulary log-probs of the candidate tokens and the top-1 log-prob: [n, d] -> [n, U], [n]."""
    z = hidden.to(weight.dtype) @ weight.T  # [n, V]
    if bias is not None:
        z = z + bias
    z = z.float()
    if softcap:
        z = torch.tanh(z / softcap) * softcap
    lp = torch.log_softmax(z, dim=-1)  # [n, V]
    cand = torch.as_tensor(list(token_ids), device=lp.device)
    return lp[:, cand].cpu().numpy(), lp.max(dim=-1).values.cpu().numpy()


def check_top1(ours: np.ndarray, theirs: np.ndarray, tol: float = TOP1_TOL) -> None:
    bad = np.flatnonzero(np.abs(ours - theirs) > tol)
    if bad.size:
        i = int(bad[0])
        raise RuntimeError(
            f"vLLM consistency check failed on {bad.size} prompt(s) (e.g. row {i}: top-1 log-prob "
            f"{theirs[i]:.4f} from vLLM vs {ours[i]:.4f} from the pooled hidden state + LM head); "
            "the pooling runner's hidden state is not the final-norm state on this vLLM version"
        )


def lm_head_tensor_name(config: dict, weight_map: dict[str, str]) -> str:
    """Which checkpoint tensor is the LM head (the embedding when tied)."""
    tied = config.get("tie_word_embeddings", False) or "lm_head.weight" not in weight_map
    for name in (["lm_head.weight"] if not tied else []) + [
        "model.embed_tokens.weight",
        "model.language_model.embed_tokens.weight",
    ]:
        if name in weight_map:
            return name
    raise RuntimeError(f"cannot find the LM head in the checkpoint (tensors like {sorted(weight_map)[:3]})")


# ----------------------------------------------------------------------------- the engine (GPU only)


def load_lm_head(model_dir: Path, device: str) -> tuple[torch.Tensor, float | None]:
    """(LM head weight [V, d], final logit soft-cap) from a downloaded safetensors checkpoint."""
    from safetensors import safe_open

    config = json.loads((model_dir / "config.json").read_text())
    text_cfg = config.get("text_config", config)
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
    else:
        with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
            weight_map = {k: "model.safetensors" for k in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
    name = lm_head_tensor_name(
        text_cfg | {"tie_word_embeddings": config.get("tie_word_embeddings", False)}, weight_map
    )
    with safe_open(str(model_dir / weight_map[name]), "pt", device=device) as f:
        weight = f.get_tensor(name)
    return weight, text_cfg.get("final_logit_softcapping")


class VLLMBackend:
    """Two vLLM engines (generate + pooling) on one GPU; see the module docstring."""

    name = "vllm"

    def __init__(
        self,
        rm: ResolvedModel,
        *,
        dtype: str = "auto",
        chat_template: bool = False,
        gpu_memory_utilization: float = 0.42,
        max_model_len: int | None = None,
    ):
        from huggingface_hub import snapshot_download
        from vllm import LLM

        if rm.gguf_file:
            raise ValueError(
                f"model {rm.name!r} is a GGUF file: use --backend hf (the vllm backend reads safetensors)"
            )
        common = {
            "model": rm.load_from,
            "revision": rm.revision,
            "dtype": dtype,
            "trust_remote_code": rm.trust_remote_code,
            "gpu_memory_utilization": gpu_memory_utilization,
            "max_model_len": max_model_len,
            "seed": 0,
        }
        self.gen = LLM(**common)
        self.pool = _pooling_llm(LLM, common)
        self.tok = self.gen.get_tokenizer()
        self.chat_template = chat_template
        local = Path(
            snapshot_download(rm.load_from, revision=rm.revision, allow_patterns=["*.json", "*.safetensors"])
        )
        self.weight, self.softcap = load_lm_head(local, "cuda")
        self.hidden_size = int(self.weight.shape[1])
        self._dtype = dtype

    def identity(self) -> dict:
        return vllm_identity(self._dtype, self.chat_template)

    def format_prompt(self, text: str) -> str:
        if not self.chat_template:
            return text
        return self.tok.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=not self.chat_template)["input_ids"])

    def encode_bare(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def score(
        self, prompts: list[str], token_ids: list[int], progress: Progress | None = None
    ) -> ScoreResult:
        from vllm import SamplingParams

        ids = [self.encode(p) for p in prompts]
        requests = build_requests(ids)
        gen_out = self.gen.generate(requests, SamplingParams(**GENERATE_PARAMS), use_tqdm=False)
        check_order(gen_out, ids, "generate")
        pool_out = self.pool.embed(requests, use_tqdm=False)
        check_order(pool_out, ids, "pooling")
        parsed = [parse_generate_output(o, p) for o, p in zip(gen_out, ids, strict=True)]
        hidden = np.stack([parse_pooling_output(o) for o in pool_out])  # [n, H]
        raw, top1 = option_logprobs_from_hidden(
            torch.from_numpy(hidden).cuda(), self.weight, token_ids, self.softcap
        )
        check_top1(top1, np.array([p[2] for p in parsed]))
        if progress is not None:
            progress(len(prompts), sum(len(x) for x in ids))
        return ScoreResult(
            raw.astype(np.float32),
            hidden.astype(np.float32),
            np.array([p[0] for p in parsed], dtype=np.float32),
            np.array([p[1] for p in parsed], dtype=np.int32),
        )

    def close(self) -> None:
        self.gen = self.pool = None
        torch.cuda.empty_cache()


def _pooling_llm(llm_cls, common: dict):
    """The pooling engine; the pooler-config keyword was renamed across vLLM releases."""
    from vllm.config import PoolerConfig

    pooler = PoolerConfig(pooling_type="LAST", normalize=False)
    for kw in (
        {"runner": "pooling", "convert": "embed", "pooler_config": pooler},
        {"runner": "pooling", "convert": "embed", "override_pooler_config": pooler},
        {"task": "embed", "override_pooler_config": pooler},
    ):
        try:
            return llm_cls(**common, **kw)
        except TypeError:
            continue
    raise RuntimeError("this vLLM version accepts none of the known pooling-runner arguments; pin vllm 0.11")


def load_vllm_backend(rm: ResolvedModel, *, dtype: str = "auto", chat_template: bool = False) -> VLLMBackend:
    ok, why = vllm_usable()
    if not ok:
        raise RuntimeError(f"--backend vllm cannot run here: {why}; use --backend hf")
    return VLLMBackend(rm, dtype=dtype, chat_template=chat_template)
