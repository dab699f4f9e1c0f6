"""The tokenizer half of a backend, shared by hf/backend.py and vllm/backend.py: a prompt's text and ids exactly as the model is
fed them (both keep the model's own transformers tokenizer, so prompts, option tokens and chat templates are
handled alike whichever backend scores them).

    fmt, encode, encode_bare, encode_batch = prompt_tokens.bind(tok, chat_template)

Plain functions of (tokenizer, chat template on?); `bind` gives a backend its four Backend methods at once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable


def check_chat_template(tok, chat_template: bool) -> None:
    """Raises ValueError where a chat template is asked of a tokenizer that has none."""
    if chat_template and not getattr(tok, "chat_template", None):
        raise ValueError("--chat-template was asked but this tokenizer has no chat template")


def format_prompt(tok, chat_template: bool, text: str) -> str:
    """Raw text, or the model's chat template around it (one user turn, generation prompt added)."""
    if not chat_template:
        return text
    return tok.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )


def encode(tok, chat_template: bool, text: str) -> list[int]:
    """Token ids of a formatted prompt; with a chat template its special tokens are in the text already."""
    return list(tok(text, add_special_tokens=not chat_template)["input_ids"])


def encode_bare(tok, text: str) -> list[int]:
    """Token ids of a string alone, without special tokens (option-token fallback)."""
    return list(tok(text, add_special_tokens=False)["input_ids"])


def encode_batch(tok, chat_template: bool, texts: list[str]) -> list[list[int]]:
    """`encode` of many prompts in one tokenizer call."""
    return [list(x) for x in tok(texts, add_special_tokens=not chat_template)["input_ids"]]


def bind(tok, chat_template: bool) -> tuple[Callable, Callable, Callable, Callable]:
    """(format_prompt, encode, encode_bare, encode_batch) of one tokenizer and chat-template setting.

    Raises:
        ValueError: a chat template asked of a tokenizer without one.
    """
    check_chat_template(tok, chat_template)
    return (
        functools.partial(format_prompt, tok, chat_template),
        functools.partial(encode, tok, chat_template),
        functools.partial(encode_bare, tok),
        functools.partial(encode_batch, tok, chat_template),
    )
