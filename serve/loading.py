"""What `walla serve` loads, from the parts that exist: the current run, each agent's LLM and wager head.

    pool = load_pool(ServeConfig(scenario="demo-hetero-facts", runs=Path("runs"), store=Path("walla-store")))
    pool.model_id        # walla:demo-hetero-facts/walla-i/seed18@3f9c01ab (the pool's tag: pool_tag)
    pool.agents[0].head  # AgentHead: that agent's own slot of the run's state.pt

- the run: train/runs/_choice.py `choose_runs` (the runs walla-eval counts: current, lineage checked, one key);
- each agent's LLM: extract/door.py `open_for(cfg, expect=identity)`, settled to the identity the feature
  set the run was trained on recorded (its meta.json in the store), with the options the recording backend
  kind says settle to it (extract/backends/registry.py `recorded_options`; serve names no backend): another
  device kind, model file or library version stops here with one line naming the field, unless
  `other_identity` (then every answer carries the identity used). Agents of one model and identity share
  one loaded model;
- each agent's head: market/head.py `AgentHead.from_run` (its slot only), the mechanism settings the run's
  resolved config holds (variant, c1, c2, c3, pooling);
- the stored questions (for `question_id` and `walla serve --check`): the scenario assembled from the store
  as walla-train assembled it (train/runs `scenario_data`), with each agent's own extracted prompt.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from walla.extract.backends import BATCHING_KEY, TIER_KEY, Backend, Settled
from walla.extract.backends.registry import identity_difference
from walla.extract.datasets import default_template
from walla.extract.door import IdentityMismatch, open_for, recorded_config, settle_for, target_for
from walla.extract.prompts import PromptTemplate, get_template
from walla.extract.run import settled_identity
from walla.manifests.catalog import load_datasets
from walla.market.agent import recorded_inputs
from walla.market.api import RoundSettings
from walla.market.head import AgentHead
from walla.serve.config import ServeConfig
from walla.train.runs import RUN_META, STATE, RunChoice, choose_runs, scenario_data

log = logging.getLogger("walla.serve")


class ServeError(ValueError):
    """A run, store or model `walla serve` cannot serve (one line naming what and why)."""


@dataclass
class ModelSlot:
    """One loaded LLM, shared by the agents of that model and identity."""

    name: str  # the scenario's model name
    settled: Settled
    backend: Backend
    recorded: dict  # the identity the feature set recorded
    differs: str | None  # the first field where this machine's identity differs (other_identity only)

    @property
    def tier(self) -> str:
        return str(self.settled.identity.get(TIER_KEY, "?"))

    @property
    def promise(self) -> dict:
        """What this model's served features promise against its feature set's: the scope of its tier."""
        return feature_promise(self.tier, self.settled.identity.get("tolerance"))


# a served hidden state is rounded to the store's float16, as the stored one was: half an ulp of the row's
# largest value apart from its unrounded self, on each side
FLOAT16_ROUNDING = 2.0**-11


def feature_promise(tier: str, bound: dict | None = None) -> dict:
    """{"tier", "features", "bound"}: bitwise: the stored bits, in any batch; tolerance: within the bound its
    feature set recorded (option log-probs absolute, hidden states relative to the row's largest value);
    batch-recorded: no bound (the numbers depend on the batch they were scored in)."""
    if tier == "bitwise":
        return {
            "tier": tier,
            "features": "equal to the feature set's, bit for bit, in any batch",
            "bound": 0.0,
        }
    if tier == "tolerance" and bound:
        return {
            "tier": tier,
            "features": "within the bound the feature set recorded (option log-probs absolute, hidden "
            "states relative to the row's largest value)",
            "bound": {k: float(v) for k, v in bound.items()},
        }
    return {
        "tier": tier,
        "features": "depend on the batch they were scored in; no bound recorded",
        "bound": None,
    }


def pool_promise(agents: list) -> dict:
    """The promise of a pool's answers: its weakest agent's tier (bitwise < tolerance < batch-recorded)."""
    order = ["bitwise", "tolerance", "batch-recorded"]
    tiers = [a.llm.tier for a in agents]
    weakest = max(tiers, key=lambda t: order.index(t) if t in order else len(order))
    text = {
        "bitwise": "bit-identical whatever it is batched with; a stored question equals walla train's pool to "
        "its float32 storage (1e-6)",
        "tolerance": "each agent's features within the bound its feature set recorded, so an answer moves "
        "with its batch by at most what that bound allows",
    }.get(weakest, "answers move with the batch; no bound recorded")
    return {"tier": weakest, "answers": text}


@dataclass
class ServedAgent:
    slot: int
    name: str  # the ledger's agent name of this slot
    model: str  # the scenario's model name
    llm: ModelSlot
    head: AgentHead
    head_version: int = 0  # head updates taken (--learn)


@dataclass
class ServedPool:
    model_id: str  # walla:<scenario>/<method>/seed<s>@<pool tag> (pool_tag)
    choice: RunChoice
    seed: int
    run_dir: Path
    dataset: str
    template: PromptTemplate
    option_tokens: list[str] | None
    settings: RoundSettings
    agents: list[ServedAgent]
    data: object | None = None  # ScenarioData of the stored questions (None: no store given)
    row_of: dict[str, int] = field(default_factory=dict)  # question_id -> row of `data`
    files: dict[str, RunFile] = field(default_factory=dict)  # the run's watched files as loaded (WATCHED)
    created: int = 0  # the heads file's mtime when loaded (seconds): /v1/models' `created`
    selective: dict = field(default_factory=dict)  # offline accuracy-coverage (offline_selective)

    @property
    def head_digest(self) -> str:
        """The sha256 (16 hex digits) of the state.pt whose heads this pool loaded."""
        return self.files[STATE].digest if STATE in self.files else "?"

    @property
    def head_version(self) -> str:
        return ".".join(str(a.head_version) for a in self.agents)

    def close(self) -> None:
        for m in {id(a.llm): a.llm for a in self.agents}.values():
            m.backend.close()


WATCHED = (STATE, RUN_META)  # the run's heads and its identity: retraining the run key rewrites both


@dataclass
class RunFile:
    """What a run file was when the pool loaded it: its stat (a cheap check per request) and its digest."""

    stat: tuple[int, int, int]  # (st_mtime_ns, st_size, st_ino)
    digest: str  # sha256, 16 hex digits


def run_file(path: Path) -> RunFile:
    """`path`'s stat and digest (OSError when it cannot be read)."""
    st = path.stat()
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return RunFile((st.st_mtime_ns, st.st_size, st.st_ino), h.hexdigest()[:16])


def identity_tag(identity: dict) -> str:
    """A settled identity's tag: 16 hex digits of the sha256 of its canonical JSON."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


def pool_tag(fingerprints: list[str], served: list[str], head_digest: str) -> str:
    """What makes a pool this pool, beyond its run key (8 hex digits): the feature sets its agents were
    trained on (their fingerprints: model files, dtype, backend), the identities its models are served with,
    and the digest of its heads. An fp32 and a bf16 pool of one run key differ here, so their model ids,
    ledger agents and rounds differ."""
    blob = json.dumps({"features": fingerprints, "served": served, "heads": head_digest}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:8]


def agent_name(model_id: str, slot: int, model: str) -> str:
    """The ledger's name of a served agent: market agent-name rules, unique per pool and slot."""
    tag = hashlib.sha256(model_id.encode()).hexdigest()[:8]
    clean = re.sub(r"[^A-Za-z0-9_.-]", "-", model)[:40].strip("-._") or "llm"
    return f"serve-{tag}-{slot + 1}-{clean}"


def open_model(
    name: str, dataset: str, identity: dict, device: str | None, other: bool, ray=None
) -> ModelSlot:
    """The model through the one door, settled to `identity` (module docstring)."""
    cfg = recorded_config(name, dataset, identity, device)
    recorded = identity.get(BATCHING_KEY) or None
    try:
        if ray is None:
            settled, backend = open_for(cfg, expect=None if other else identity, recorded=recorded)
        else:  # settled here, checked as open_for checks, loaded on a worker (serve/remote.py)
            from walla.serve.remote import remote_backend

            settled = settle_for(cfg, target_for(cfg, check_device=False), recorded=recorded)
            diff = identity_difference(identity, settled.identity)
            if diff and not other:
                raise IdentityMismatch(
                    f"model {cfg.model}: the feature set recorded another identity: {diff}"
                )
            backend = remote_backend(settled, ray)
    except IdentityMismatch as e:
        raise ServeError(f"{e} (or pass --other-identity to serve it labelled)") from None
    return ModelSlot(name, settled, backend, identity, identity_difference(identity, settled.identity))


def load_pool(
    cfg: ServeConfig, with_models: bool = True, say: Callable[[str], None] | None = None
) -> ServedPool:
    """The run, its agents' LLMs and heads, and the stored questions (module docstring). `say` hears one line
    per load step with its time (walla serve prints them)."""

    clock = [time.perf_counter()]

    def step(what: str) -> None:
        now = time.perf_counter()
        if say is not None:
            say(f"{what} in {now - clock[0]:.1f} s")
        clock[0] = now

    choice = choose_runs(cfg.runs, cfg.scenario, cfg.method, cfg.key, seeds=None, run_flag=False)
    seeds = sorted(choice.seeds)
    seed = seeds[0] if cfg.seed is None else cfg.seed
    if seed not in choice.seeds:
        raise ServeError(
            f"--seed {seed}: {cfg.scenario}/{choice.method}/{choice.key_id} has no current run of it "
            f"(seeds {', '.join(map(str, seeds))})"
        )
    record = choice.seeds[seed]
    table = choice.table
    step(f"run {choice.method}/{choice.key_id} seed {seed} chosen (lineage checked)")
    datasets = load_datasets()
    if table.dataset not in datasets:
        raise ServeError(f"scenario {choice.scenario}: dataset {table.dataset!r} is not in datasets.yaml")
    d_entry = datasets[table.dataset]
    template = get_template(default_template(d_entry.loader, d_entry.prompt))
    wanted: dict[tuple, tuple[str, dict]] = {}  # one loaded model per (model, recorded identity)
    keys, fingerprints = [], []
    for model in table.agents:
        fp, inputs = recorded_inputs(cfg.store, table.meta, f"{model}/{table.dataset}/none")
        identity = settled_identity(inputs)
        fingerprints.append(fp)
        keys.append((model, repr(sorted(identity.items()))))
        wanted.setdefault(keys[-1], (model, identity))
    ray = None
    if cfg.ray_address and with_models:
        from walla.serve.remote import start_ray

        ray = start_ray(cfg.ray_address)
    # the heads first, then the models: loading a model in this process sets torch's default dtype for the
    # whole process while it builds the modules (transformers' from_pretrained), so a head or another model
    # built beside it may come out in the other dtype (seen: a bf16 head, pools 0.02 off the offline ones).
    # Ray workers load in their own processes, side by side.
    try:
        files = {name: run_file(Path(record.path) / name) for name in WATCHED}
    except OSError as e:
        raise ServeError(f"{record.path}: cannot read the run ({e.strerror or e})") from None
    heads = [AgentHead.from_run(record.path, i) for i in range(len(table.agents))]
    if run_file(Path(record.path) / STATE).digest != files[STATE].digest:  # rewritten while it loaded
        raise ServeError(
            f"{record.path}: {STATE} changed while loading (walla train rewriting it?): try again"
        )
    step(f"{len(heads)} heads read from {STATE} ({files[STATE].digest})")
    data = scenario_data(table, Path(cfg.store))
    step(f"{len(table.question_id)} test questions read from the store")
    wanted = wanted if with_models else {}
    workers = max(1, len(wanted)) if ray is not None else 1
    with ThreadPoolExecutor(workers) as ex:
        futs = {
            k: ex.submit(open_model, m, table.dataset, ident, cfg.device, cfg.other_identity, ray)
            for k, (m, ident) in wanted.items()
        }
        models = {}
        for k, f in futs.items():
            models[k] = f.result()
            step(f"model {models[k].name} loaded ({models[k].tier})")
    served = [identity_tag(m.settled.identity) for m in (models.get(k) for k in keys) if m is not None]
    model_id = f"walla:{choice.scenario}/{choice.method}/seed{seed}@{pool_tag(fingerprints, served, files[STATE].digest)}"
    s = heads[0].cfg
    settings = RoundSettings(variant=s.variant, c1=s.c1, c2=s.c2, c3=s.c3, pooling=s.pooling)
    agents = [
        ServedAgent(i, agent_name(model_id, i, model), model, models.get(keys[i]), heads[i])
        for i, model in enumerate(table.agents)
    ]
    row_of = {str(q): i for i, q in enumerate(data.question_id)}
    missing = [q for q in table.question_id if str(q) not in row_of]
    if missing:
        raise ServeError(
            f"--store {cfg.store}: {len(missing)} test questions of {choice.scenario} are not in it"
        )
    return ServedPool(
        model_id,
        choice,
        seed,
        record.path,
        table.dataset,
        template,
        list(d_entry.option_tokens) if d_entry.option_tokens else None,
        settings,
        agents,
        data,
        row_of,
        files,
        files[STATE].stat[0] // 1_000_000_000,
        offline_selective(record.agg_probs, table.label),
    )


def offline_selective(agg_probs, label) -> dict:
    """The served run's accuracy-coverage on its test questions, offline (walla train's pool of the served
    seed; evaluate/selective.py's fixed thresholds and coverages): what a caller reads to choose
    `abstain_below` from data. Point values of this seed; walla eval's tables give the intervals."""
    from walla.evaluate.selective import COVERAGES, THRESHOLDS, coverage_values, threshold_values

    agg = np.asarray(agg_probs, dtype=np.float64)
    conf, correct = agg.max(-1), (agg.argmax(-1) == np.asarray(label)).astype(np.float64)
    at = [threshold_values(conf, correct, t) for t in THRESHOLDS]
    return {
        "n": len(conf),
        "questions": "the run's test questions, walla train's pool of this seed",
        "thresholds": [
            {"abstain_below": t, "accuracy": None if a != a else a, "coverage": c}
            for t, (a, c) in zip(THRESHOLDS, at, strict=True)
        ],
        "coverages": [{"coverage": c, "accuracy": coverage_values(conf, correct, c)} for c in COVERAGES],
    }


def stored_question(pool: ServedPool, question_id: str) -> tuple[int, list[str], list[str]]:
    """(row, each agent's extracted prompt, option labels) of a stored question of the scenario."""
    row = pool.row_of.get(question_id)
    if row is None or pool.data.prompts is None:
        raise KeyError(question_id)
    k = int(pool.data.n_options[row])
    return row, [pool.data.prompts[a.slot][row] for a in pool.agents], [chr(65 + j) for j in range(k)]
