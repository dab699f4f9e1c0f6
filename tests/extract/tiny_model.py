"""A tiny random-weight Llama-style model and a word-level tokenizer, built in memory (no download)."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

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


def tiny_model(vocab_size: int, seed: int = 0, tie: bool = False) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
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
                p.mul_(8.0)
    return model
