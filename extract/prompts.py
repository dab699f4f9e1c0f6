"""Prompt templates (SPEC §1) and the three prompt variants of a question.

Raw text, no chat template (SPEC §1.1) unless `--chat-template` is given, in which case the
rendered text becomes the single user message of the model's chat template (`format_prompt`).

The end of the module is the tokenizer half of a backend, shared by the hf and vllm backends: a prompt's
text and ids exactly as the model is fed them (both keep the model's own transformers tokenizer, so prompts,
option tokens and chat templates are handled alike whichever backend scores them):

    fmt, encode, encode_bare, encode_batch = bind_tokenizer(tok, chat_template)

Variants (schema.VARIANTS): `none` = the question alone; `relevant` = with its own context;
`irrelevant` = with the context of ANOTHER question of the SAME split, chosen by a seeded
derangement (`context_source_id` records whose). Datasets without contexts (MMLU, MedMCQA, ARC)
have only `none`.

Multiple-choice options are displayed with the letters A, B, C, ... by POSITION, whatever the
source's labels (ARC has 1-4 in some rows; the source labels stay in `option_labels`), and the
scored option strings are the same letters, so 3- and 5-option questions work end to end.

A template's text (both forms) and its option tokens are fingerprint inputs of every feature set. Which
template a dataset uses: its datasets.yaml `prompt:`, else its loader's (extract/datasets/registry.py).
"""

from __future__ import annotations

import functools
import logging
import string
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from walla.store.schema import SPLITS

log = logging.getLogger(__name__)

LETTERS = string.ascii_uppercase  # options by position: displayed, scored, and the default source labels


@dataclass(frozen=True)
class PromptTemplate:
    """Format strings with {question}, {choices}, {context}; None = no context variants."""

    name: str
    without_context: str
    with_context: str | None
    option_tokens: tuple[str, ...] | None  # scored strings per option; None = display letters by position
    choices: bool = False  # render "A) text" lines into {choices}

    def text_for(self, variant: str) -> str:
        return self.without_context if variant == "none" else self._ctx(variant)

    def _ctx(self, variant: str) -> str:
        if self.with_context is None:
            raise ValueError(f"prompt template {self.name!r} has no context: only the 'none' variant exists")
        return self.with_context

    @property
    def variants(self) -> tuple[str, ...]:
        return ("none",) if self.with_context is None else ("none", "relevant", "irrelevant")


_MC_HEAD = "Return the label of the correct answer for the question below.\n\n"
_BAYESX_ANSWER = (
    "Output exactly one character: 1 if it is more likely that the cluster will saturate, or 0 otherwise."
)

_FACTS_SHOTS = (
    "The lamp in room 5 is green. Is the lamp in room 5 green? Yes\n"
    "The lamp in room 8 is white. Is the lamp in room 8 blue? No\n"
    "Box 3 holds pens. Does box 3 hold cups? No\n"
    "Box 6 holds keys. Does box 6 hold keys? Yes\n"
    "The car of team 2 is fast. Is the car of team 2 slow? No\n"
    "The cup on desk 9 is full. Is the cup on desk 9 full? Yes\n"
)

TEMPLATES: dict[str, PromptTemplate] = {
    # SPEC §1.2: MMLU, MedMCQA, ARC-Challenge.
    "mc": PromptTemplate(
        "mc",
        without_context=_MC_HEAD + "Question: {question}\nChoices:\n{choices}\nAnswer:",
        with_context=None,
        option_tokens=None,
        choices=True,
    ),
    # Generic multiple choice with an optional private context (bring-your-own JSON lines).
    "mc_context": PromptTemplate(
        "mc_context",
        without_context=_MC_HEAD + "Question: {question}\nChoices:\n{choices}\nAnswer:",
        with_context=_MC_HEAD + "Context: {context}\nQuestion: {question}\nChoices:\n{choices}\nAnswer:",
        option_tokens=None,
        choices=True,
    ),
    # SPEC §1.3.
    "pubmedqa": PromptTemplate(
        "pubmedqa",
        without_context="Question:\n{question}\nAnswer with YES or NO. Answer:",
        with_context="Question:\n{question}\nYou are an expert in medical science and you have classified access to "
        "the following context.\nContext:\n{context}\nAnswer with YES or NO. Answer:",
        option_tokens=("YES", "NO"),
    ),
    # SPEC §1.4: question = scenario + prior, context = update rule + evidence.
    "bayesx": PromptTemplate(
        "bayesx",
        without_context="{question}\nBased on this empirical probability, answer the following question.\n"
        "Question: Is it more likely than not that the cluster will saturate? " + _BAYESX_ANSWER,
        with_context="{question}\n{context}\nQuestion:It is more likely than not that the cluster will saturate? "
        + _BAYESX_ANSWER,
        option_tokens=("1", "0"),
    ),
    # Private facts (extract/datasets/facts.py): six fixed worked examples, then "<fact> <question>" and the answer
    # token right after the "?". Measured on SmolLM2-135M, 300 generated rows: AUC 0.79, accuracy 0.76,
    # Brier 0.43 with the fact vs 0.53 / 0.51 / 0.59 without; the bare "<fact> <question>" form gives
    # 0.63 / 0.56 / 0.53 vs 0.42 / 0.44 / 0.56, and "Fact: ...\nQuestion: ...\nAnswer:" framings ~0.5.
    "facts": PromptTemplate(
        "facts",
        without_context=_FACTS_SHOTS + "{question}",
        with_context=_FACTS_SHOTS + "{context} {question}",
        option_tokens=(" Yes", " No"),
    ),
}


def get_template(name: str) -> PromptTemplate:
    if name not in TEMPLATES:
        raise KeyError(f"unknown prompt template {name!r}; available: {sorted(TEMPLATES)}")
    return TEMPLATES[name]


def option_strings(template: PromptTemplate, n_options: int, override: list[str] | None = None) -> list[str]:
    """The strings scored for a question with n_options options (SPEC §1.5).

    `override` (the manifest's option_tokens) wins over the template's; with neither, the display
    letters A, B, C, ... by position.
    """
    toks = list(override) if override else (list(template.option_tokens) if template.option_tokens else None)
    if toks is None:
        if n_options > len(LETTERS):
            raise ValueError(f"{n_options} options: at most {len(LETTERS)} display letters exist")
        return list(LETTERS[:n_options])
    if len(toks) != n_options:
        raise ValueError(
            f"option_tokens {toks} has {len(toks)} entries but the question has {n_options} options"
        )
    return toks


def render(
    template: PromptTemplate,
    question: str,
    options: list[str],
    context: str | None = None,
    description: str = "",
) -> str:
    """One prompt. `context` None renders the without-context form."""
    choices = "\n".join(f"{LETTERS[i]}) {text}" for i, text in enumerate(options)) if template.choices else ""
    if context is None:
        body = template.without_context.format(question=question.strip(), choices=choices)
    else:
        body = template._ctx("relevant").format(question=question.strip(), choices=choices, context=context)
    return f"{description}\n\n{body}" if description else body  # SPEC §1.1: description is empty by default


def derangement_sources(
    question_ids: list[str], splits: list[str], has_context: list[bool], seed: int
) -> list[int | None]:
    """For each row, the index of the row whose context it shows in the `irrelevant` variant.

    Within each split, the rows that have a context are put in a seeded random order and each takes
    the context of the next one in that cycle: a derangement (nobody gets their own), from the SAME
    split. A split with a single context row takes a source from the other splits (warned), so tiny
    `--limit` runs still work. Rows without a context get None.
    """
    rng = np.random.RandomState(seed)
    src: list[int | None] = [None] * len(question_ids)
    all_ctx = [i for i, h in enumerate(has_context) if h]
    for split in SPLITS:
        idx = [i for i in all_ctx if splits[i] == split]
        if len(idx) >= 2:
            order = rng.permutation(idx)
            for a, b in zip(order, np.roll(order, -1), strict=True):
                src[int(a)] = int(b)
        elif len(idx) == 1:
            others = [j for j in all_ctx if j != idx[0]]
            if not others:
                raise ValueError("the irrelevant variant needs at least 2 questions with a context")
            src[idx[0]] = int(others[rng.randint(len(others))])
            log.warning(
                "split %r has one question with a context: its irrelevant context comes from another split",
                split,
            )
    return src


@dataclass(frozen=True)
class RenderedPrompt:
    question_id: str
    text: str
    options: list[str]  # scored option strings
    context_source_id: str | None


def build_prompts(
    table,
    template: PromptTemplate,
    variant: str,
    *,
    option_tokens: list[str] | None = None,
    seed: int = 0,
    description: str = "",
) -> list[RenderedPrompt]:
    """Render every question of a question table (polars) for one variant, in table order.

    Raises:
        ValueError: a context variant on a template or question without a context.
    """
    if variant not in template.variants:
        raise ValueError(
            f"variant {variant!r} is not available for prompt template {template.name!r} "
            f"(available: {', '.join(template.variants)})"
        )
    qids = table["question_id"].to_list()
    questions = table["question"].to_list()
    options = table["options"].to_list()
    contexts = table["context"].to_list()
    if variant != "none":
        missing = [q for q, c in zip(qids, contexts, strict=True) if not c]
        if missing:
            raise ValueError(
                f"variant {variant!r} needs a context on every question; {len(missing)} have none "
                f"(e.g. {missing[0]!r})"
            )
    sources: list[int | None] = [None] * len(qids)
    if variant == "irrelevant":
        sources = derangement_sources(qids, table["split"].to_list(), [bool(c) for c in contexts], seed)
    out = []
    for i, qid in enumerate(qids):
        ctx, src_id = None, None
        if variant == "relevant":
            ctx = contexts[i]
        elif variant == "irrelevant":
            ctx, src_id = contexts[sources[i]], qids[sources[i]]
        out.append(
            RenderedPrompt(
                qid,
                render(template, questions[i], options[i], ctx, description),
                option_strings(template, len(options[i]), option_tokens),
                src_id,
            )
        )
    return out


# the tokenizer half of a backend (module docstring): plain functions of (tokenizer, chat template on?)


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


def bind_tokenizer(tok, chat_template: bool) -> tuple[Callable, Callable, Callable, Callable]:
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
