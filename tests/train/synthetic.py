"""Synthetic private-context scenarios for training tests and benchmarks (no LLM, no store).

    from synthetic import make_private_context_scenario        # inside tests/train (pytest puts
    data = make_private_context_scenario(n=600, m=4, h=32)     # this folder on sys.path)

Per question exactly one agent slot is "informed" (variant `relevant`, the others `none`), chosen
uniformly at random. A fixed random direction u_i of each agent's hidden space carries the marker
(+1 informed, -1 not), so a wager head that reads its own hidden state can learn when it holds the
evidence -- the comparative advantage WALLA must discover.

Two regimes:
- default (PubMedQA-like): the informed agent is confident and right most of the time; the
  uninformed agents guess (small random logits), 15% of them confidently wrong. Hard one-hot targets.
- `informed_less_confident=True` (BayesX-like, soft targets): a prior answer `a` and an evidence
  answer `b != a`; the soft ground truth puts ~0.5-0.68 on `b`. Uninformed agents follow the prior
  confidently (~0.9 on `a`, i.e. confidently wrong-ish); the informed agent reports a noisy copy of
  the posterior (less confident, but right). Confidence-based weighting picks the wrong agents.

`meta["informed"]` ([N] int) records the informed slot for assertions.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from walla.store.scenario import ScenarioData
from walla.store.schema import VARIANT_CODE
from walla.train import run as train_run


def _softmax(x: np.ndarray) -> np.ndarray:
    z = x - x.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def make_private_context_scenario(
    n: int = 600,
    m: int = 4,
    k: int = 2,
    h: int | list[int] = 32,
    seed: int = 0,
    informed_less_confident: bool = False,
    marker_strength: float = 2.0,
    min_options: int | None = None,
    hidden_dtype: str = "float32",
    name: str | None = None,
) -> ScenarioData:
    """Build a ScenarioData where one agent per question holds private, informative context.

    Args:
        n: number of questions (split 8:1:1 at random with `seed`).
        m: number of agent slots.
        k: number of options (K). With `min_options`, each question has n_options in
            [min_options, k]; the extra options get probability 0 and option_mask False.
        h: hidden size of every agent, or a list of M sizes (heterogeneous ensembles).
        seed: seeds everything (labels, routing, predictions, hidden states).
        informed_less_confident: BayesX-like regime (soft targets, see module docstring).
        marker_strength: norm of the informed/uninformed marker in hidden space (noise is N(0, 1)
            per coordinate), i.e. how easy the wager head's job is.
        min_options: smallest option count (None = every question has k options).
        hidden_dtype: "float32" or "float16" (the store keeps float16).
        name: scenario name (default "synthetic-private-context[-bayesx]").

    Returns:
        ScenarioData with probs [N, M, K], hidden [M] x [N, H_i], meta["informed"] [N].

    Raises:
        ValueError: on sizes that cannot form a scenario.
    """
    hs = [h] * m if isinstance(h, int) else list(h)
    if m < 2:
        raise ValueError(f"m must be >= 2 agents, got {m}")
    if k < 2:
        raise ValueError(f"k must be >= 2 options, got {k}")
    if n < 10:
        raise ValueError(f"n must be >= 10 questions (8:1:1 split), got {n}")
    if len(hs) != m or min(hs) < 2:
        raise ValueError(f"h must be an int >= 2 or a list of {m} ints >= 2, got {h!r}")
    if min_options is not None and not 2 <= min_options <= k:
        raise ValueError(f"min_options must be in [2, {k}], got {min_options}")
    rng = np.random.default_rng(seed)

    # ---- questions, splits, option counts -------------------------------------------------------
    perm = rng.permutation(n)
    n_train, n_val = int(0.8 * n), int(0.1 * n)
    split = np.empty(n, dtype=object)
    split[perm[:n_train]] = "train"
    split[perm[n_train : n_train + n_val]] = "val"
    split[perm[n_train + n_val :]] = "test"
    split = split.astype(str)
    if min_options is None:
        n_options = np.full(n, k, dtype=np.int64)
    else:
        n_options = rng.integers(min_options, k + 1, size=n)
    option_mask = np.arange(k)[None, :] < n_options[:, None]  # [N, K]
    neg_inf = np.where(option_mask, 0.0, -np.inf)  # [N, K] added to logits to drop absent options
    informed = rng.integers(0, m, size=n)  # [N] slot holding the context
    is_inf = np.arange(m)[None, :] == informed[:, None]  # [N, M]

    # ---- predictions and ground truth -----------------------------------------------------------
    logits = np.zeros((n, m, k))
    if not informed_less_confident:
        label = (rng.random(n) * n_options).astype(np.int64)  # [N] uniform over present options
        target = np.eye(k, dtype=np.float32)[label]  # [N, K] one-hot
        logits = rng.normal(0.0, 0.7, size=(n, m, k))  # uninformed: mostly unsure guesses ...
        wrong = (
            label[:, None] + 1 + (rng.random((n, m)) * (n_options[:, None] - 1)).astype(np.int64)
        ) % n_options[:, None]
        halluc = rng.random((n, m)) < 0.15  # ... but 15% confidently wrong (hurts confidence weighting)
        logits[halluc, wrong[halluc]] += 3.0
        sharp = rng.uniform(2.5, 4.5, size=n)  # informed agent's confidence
        inf_logits = rng.normal(0.0, 1.0, size=(n, k))
        inf_logits[np.arange(n), label] += sharp
        logits[np.arange(n), informed] = inf_logits
    else:
        prior_ans = (rng.random(n) * n_options).astype(np.int64)  # [N] answer the prior favours
        shift = 1 + (rng.random(n) * (n_options - 1)).astype(np.int64)
        ev_ans = (prior_ans + shift) % n_options  # [N] answer the evidence favours (!= prior)
        post = rng.uniform(0.52, 0.68, size=n)  # posterior mass on the evidence answer
        target = np.zeros((n, k))
        rest = (1.0 - post) / (n_options - 1)  # spread over the other present options
        target[option_mask] = np.repeat(rest, n_options)
        target[np.arange(n), ev_ans] = post
        target = (target / target.sum(1, keepdims=True)).astype(np.float32)
        label = target.argmax(1).astype(np.int64)  # == ev_ans
        # uninformed: ~0.9 on the prior answer (confidently wrong-ish)
        prior_p = np.full((n, k), 1e-3)
        prior_p[option_mask] = np.repeat(0.1 / np.maximum(n_options - 1, 1), n_options)
        prior_p[np.arange(n), prior_ans] = 0.9
        base = np.log(prior_p)[:, None, :]  # [N, 1, K]
        logits = base + rng.normal(0.0, 0.2, size=(n, m, k))
        # informed: noisy posterior (less confident, but right)
        inf_logits = np.log(np.clip(target, 1e-3, 1.0)) + rng.normal(0.0, 0.1, size=(n, k))
        logits[np.arange(n), informed] = inf_logits
    probs = _softmax(logits + neg_inf[:, None, :]).astype(np.float32)  # [N, M, K], 0 where masked

    # ---- hidden states: noise + marker along a fixed per-agent direction -----------------------
    hidden = []
    for i, hi in enumerate(hs):
        u = rng.normal(size=hi)
        u *= marker_strength / np.linalg.norm(u)  # [H_i] marker direction
        sign = np.where(is_inf[:, i], 1.0, -1.0)[:, None]  # [N, 1]
        x = rng.normal(size=(n, hi)) + sign * u[None, :]  # [N, H_i]
        hidden.append(x.astype(hidden_dtype))

    # ---- text and prompt NLL (routers, PackLLM) -------------------------------------------------
    question_id = np.array([f"q{j:05d}" for j in range(n)])
    question = [f"Synthetic question {j}: which of the {n_options[j]} options is right?" for j in range(n)]
    prompts = [
        [f"Context: private evidence {j}. {question[j]}" if is_inf[j, i] else question[j] for j in range(n)]
        for i in range(m)
    ]
    prompt_nll = (2.0 - 0.3 * is_inf + rng.normal(0.0, 0.2, size=(n, m))).astype(np.float32)  # [N, M]
    variant = np.where(is_inf, VARIANT_CODE["relevant"], VARIANT_CODE["none"]).astype(np.int8)

    regime = "bayesx" if informed_less_confident else "pubmedqa"
    return ScenarioData(
        name=name or ("synthetic-private-context" + ("-bayesx" if informed_less_confident else "")),
        dataset=f"synthetic-{regime}",
        agents=[f"synth{i}" for i in range(m)],
        question_id=question_id,
        split=split,
        question=question,
        prompts=prompts,
        n_options=n_options.astype(np.int64),
        option_mask=option_mask,
        probs=probs,
        label=label,
        target=target.astype(np.float32),
        soft_target=informed_less_confident,
        prompt_nll=prompt_nll,
        variant=variant,
        hidden=hidden,
        fingerprints={f"synth{i}/mixed": f"{seed:04d}{i:012d}" for i in range(m)},
        meta={"informed": informed, "seed": seed, "regime": regime, "context_rule": "one_relevant"},
    )


def with_agents(data: ScenarioData, slots: list[int], name: str) -> ScenarioData:
    """The scenario restricted to some agent slots (in that order), named `name`."""
    kept = {data.agents[i] for i in slots}
    return dataclasses.replace(
        data,
        name=name,
        agents=[data.agents[i] for i in slots],
        probs=data.probs[:, slots],
        prompt_nll=data.prompt_nll[:, slots],
        variant=data.variant[:, slots],
        hidden=[data.hidden[i] for i in slots],
        prompts=None if data.prompts is None else [data.prompts[i] for i in slots],
        fingerprints={k: v for k, v in data.fingerprints.items() if k.split("/")[0] in kept},
    )


def synthetic_scenario_file(tmp_path: Path, monkeypatch, text: str) -> Path:
    """`text` written as <tmp_path>/synth.yaml, its assembly swapped for a synthetic 100-question scenario
    (walla train's CLI, plan, runs and report stay real); an empty <tmp_path>/store for --store."""
    data = make_private_context_scenario(n=100, m=3, k=2, h=6, seed=2, name="synth")
    monkeypatch.setattr(train_run, "assemble_scenario", lambda spec, store: data)
    (tmp_path / "store").mkdir()
    path = tmp_path / "synth.yaml"
    path.write_text(text)
    return path
