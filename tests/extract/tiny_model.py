"""A tiny random-weight Llama-style model and a word-level tokenizer, built in memory (no download), and
the steps tests take to use one as a catalog model over a local jsonl dataset."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from walla.extract.backends.hf import _load as hf_load
from walla.manifests import catalog

CORPUS = [
    "Return the label of the correct answer for the question below .",
    "Question : Which gas do plants take in ? Choices : A ) B ) C ) D ) E ) Answer :",
    "Question : Is the door of room 42 painted red ? Yes No YES NO 1 0",
    "The door of room 7 is painted blue . Answer with YES or NO . Context : expert medical science",
    "oxygen carbon dioxide nitrogen helium water light sun moon star tree leaf root",
    "Fact : the cat sat on the mat and the dog ran in the park with a ball",
]


def tiny_tokenizer(bos: bool = True) -> PreTrainedTokenizerFast:
    """Word-level tokenizer trained on CORPUS; adds <s> at the start when `bos`."""
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        CORPUS, trainers.WordLevelTrainer(special_tokens=["<unk>", "<pad>", "<s>", "</s>"])
    )
    if bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", bos_token="<s>", eos_token="</s>"
    )


def tiny_model(
    vocab_size: int,
    seed: int = 0,
    tie: bool = False,
    hidden_size: int = 32,
    weight_scale: float = 8.0,
    num_layers: int = 2,
) -> LlamaForCausalLM:
    """`weight_scale` multiplies the default init of every matrix (1.0: small logits, as a real model's)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=tie,
        pad_token_id=1,
        bos_token_id=2,
        eos_token_id=3,
    )
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # larger weights than the default init: sharper, more distinct outputs per position
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(weight_scale)
    return model


def save_tiny_checkpoint(mdir: Path, **model_kw) -> Path:
    """tiny_model(**model_kw) and tiny_tokenizer() saved as a local transformers checkpoint in `mdir`."""
    tok = tiny_tokenizer()
    tiny_model(len(tok), **model_kw).save_pretrained(mdir)
    tok.save_pretrained(mdir)
    return mdir


def register_local_model(monkeypatch, name: str, mdir: Path, hidden_size: int) -> None:
    """Model `name` (a local checkpoint in `mdir`) added to the catalog for this test."""
    models = dict(catalog.load_models())
    models[name] = catalog.ModelEntry(name=name, source="local", path=str(mdir), hidden_size=hidden_size)
    monkeypatch.setattr(catalog, "load_models", lambda: models)


def register_jsonl_dataset(monkeypatch, path: Path, rows: list[dict], name: str = "mine") -> Path:
    """`rows` written to `path` as jsonl (the first two in val, the rest in test) and added to the catalog as
    multiple-choice dataset `name` with the splits given."""
    path.write_text(
        "\n".join(json.dumps(dict(r, split="val" if i < 2 else "test")) for i, r in enumerate(rows)) + "\n"
    )
    datasets_ = dict(catalog.load_datasets())
    datasets_[name] = catalog.DatasetEntry(
        name=name, loader="jsonl", split_protocol={"mode": "given"}, prompt="mc"
    )
    monkeypatch.setattr(catalog, "load_datasets", lambda: datasets_)
    return path


def register_tiny_catalog(tmp_path: Path, monkeypatch, questions: list[tuple[str, str]], seed: int) -> Path:
    """Catalog model `tiny` (a random local checkpoint of `seed`, hidden 32) and dataset `mine` (one jsonl row
    per (question, context), options oxygen/helium/water), with a private WALLA_CACHE; returns the data file."""
    register_local_model(
        monkeypatch, "tiny", save_tiny_checkpoint(tmp_path / "tiny", seed=seed), hidden_size=32
    )
    rows = [
        {"id": f"r{i}", "question": q, "options": ["oxygen", "helium", "water"], "label": i % 3, "context": c}
        for i, (q, c) in enumerate(questions)
    ]
    data = register_jsonl_dataset(monkeypatch, tmp_path / "mine.jsonl", rows)
    monkeypatch.setenv("WALLA_CACHE", str(tmp_path / "cache"))
    return data


def spy_from_pretrained(monkeypatch) -> list[dict]:
    """The keyword arguments of every AutoModelForCausalLM.from_pretrained call the hf backend makes."""
    seen: list[dict] = []
    orig = hf_load.AutoModelForCausalLM.from_pretrained

    def spy(*a, **k):
        seen.append(k)
        return orig(*a, **k)

    monkeypatch.setattr(hf_load.AutoModelForCausalLM, "from_pretrained", spy)
    return seen


def compile_runs(tmp_path: Path, device: str, dtypes: list[str], **model_kw) -> tuple[list[dict], list[str]]:
    """load_hf_backend(compiled=True) of one tiny checkpoint once per dtype in `dtypes`, as separate runs would
    (dynamo reset before each: only torch's on-disk caches carry over), with WALLA_CACHE = `tmp_path` set by
    the caller: ([load_times of each], [TORCHINDUCTOR_CACHE_DIR after each]); each folder is checked to be
    the model's and dtype's own and to hold files. `model_kw` go to tiny_model (default: seed 5)."""
    from walla.extract.backends.hf import _compile as hf_compile
    from walla.extract.models import ResolvedModel

    mdir = save_tiny_checkpoint(tmp_path / "tiny", **({"seed": 5} | model_kw))
    local_tiny = ResolvedModel("tiny", str(mdir), None, None, {"source": "local", "files_sha256": "abc"})
    times, folders = [], []
    for dtype in dtypes:
        torch._dynamo.reset()  # a new run: nothing compiled in memory, only what the disk caches hold
        be = hf_load.load_hf_backend(local_tiny, dtype=dtype, device=device, batch_tokens=64, compiled=True)
        times.append(be.load_times)
        folders.append(os.environ["TORCHINDUCTOR_CACHE_DIR"])
        want = hf_compile.compile_cache_dir(local_tiny.identity, dtype, device, tmp_path)
        assert folders[-1] == str(want) and any(want.rglob("*")), (folders[-1], want)
        be.close()
    return times, folders
