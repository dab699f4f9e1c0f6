"""The live agent: features of a round's question -> its head's wager -> a report; learns from its own payouts.

    features = LLMFeatures("smollm2-135m", "facts", expect=run_identity(run, slot, store))  # or refused
    agent = Agent(MarketClient(url, token), AgentHead.from_run(run, slot), features)
    agent.run(poll=2.0)              # until interrupted: report on every open round, learn after resolutions

An agent sees only what its token may see: the open rounds, its own reports and its own payouts
(decentralized). Features come from walla's extraction code (LLMFeatures: an extraction backend, the dataset's
prompt template and option tokens, exactly as walla extract scores a question) or, in replay, from the
feature store (replay.StoreFeatures). A head is played only on features of the identity it was trained on:
`run_identity` reads the one its run's feature set recorded, and LLMFeatures(expect=...) settles the LLM through
extraction's door to it (extract/door.py `open_for`, as `walla serve` does): another dtype, device kind,
kernel path, model file or library stops there with one line naming the field, unless `other_identity`
(then `differs` names it and the agent labels every report with it).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
from walla.extract.backends import BATCHING_KEY
from walla.extract.backends.registry import identity_difference
from walla.extract.config import ExtractConfig
from walla.extract.datasets import default_template
from walla.extract.door import IdentityMismatch, open_for, recorded_config  # noqa: F401 (cli_agent's)
from walla.extract.prompts import get_template, option_strings, render
from walla.extract.run import settled_identity
from walla.extract.scoring import renormalize, resolve_option_token_ids
from walla.manifests.catalog import load_datasets
from walla.market.client import MarketClient, MarketError
from walla.market.head import AgentHead, HeadError
from walla.store.features import FEATURES_DIR, META_FILE, StoreError
from walla.store.files import read_json
from walla.train.runs import read_scenario_meta

# round -> (probabilities [K], hidden [H]); a features object may also say, by `relevant(round)`, whether the
# agent held the round's relevant context (replay's stored features do: a walla-i-cal head's role)
Features = Callable[[dict], tuple[list[float], np.ndarray]]
log = logging.getLogger("walla.market.agent")


def recorded_identity(store: Path, meta: dict, key: str) -> dict:
    """The settled backend identity of the feature set `key` (<model>/<dataset>/<variant>) of a scenario
    (`meta`: its scenario.json), read from that set's fingerprint inputs in `store`.

    Raises:
        HeadError: the scenario recorded no such set, or `store` does not hold it complete.
    """
    return settled_identity(recorded_inputs(store, meta, key)[1])


def recorded_inputs(store: Path, meta: dict, key: str) -> tuple[str, dict]:
    """(fingerprint, fingerprint inputs) of the feature set `key` of a scenario: what recorded_identity
    settles, and the fingerprint that names the set (walla serve's pool id carries it).

    Raises:
        HeadError: as recorded_identity.
    """
    rec = (meta.get("meta") or {}).get("feature_sets", {}).get(key)
    if not rec:
        raise HeadError(f"scenario.json: no feature set {key} recorded (train the run again)")
    model, dataset, variant = key.rsplit("/", 2)
    path = Path(store) / FEATURES_DIR / model / dataset / variant / rec["fingerprint"]
    try:
        inputs = read_json(path / META_FILE)["inputs"]
    except (StoreError, KeyError) as e:
        raise HeadError(
            f"--store {store}: feature set {key} {rec['fingerprint']} the run was trained on is not complete "
            f"there ({e}): pass the store it was extracted into"
        ) from None
    return str(rec["fingerprint"]), inputs


def run_identity(run: str | Path, slot: int, store: Path) -> dict:
    """The identity of the features slot `slot`'s head was trained on: its model's context-free feature
    set, as the run's scenario.json records it (runs/<scenario>/<method>/<key-id>/seed=<s>)."""
    meta = read_scenario_meta(Path(run).parent.parent.parent)
    agents = list(meta.get("agents") or [])
    if not 0 <= slot < len(agents):
        raise HeadError(f"{run}: slot {slot} out of range (the run has {len(agents)} agents)")
    return recorded_identity(store, meta, f"{agents[slot]}/{meta.get('dataset')}/none")


class LLMFeatures:
    """Option probabilities and the last-layer hidden state of one LLM for a round's question.

    The prompt is the dataset's template without context (its registry default or datasets.yaml `prompt:`,
    rendered by extract/prompts.py), the scored option tokens are the dataset's (or the display letters),
    the backend is the one walla extract would choose (`backend`, else the model's manifest hint, else hf;
    extract/backends/registry.py) in the model's manifest dtype, settled and opened through the registry's
    door as walla extract does (`self.settled.identity` is what walla extract's fingerprint would record).

    `expect`: the identity the head's features recorded (`run_identity`): the model is settled as that set
    recorded it (extract/door.py `recorded_config`; `backend`, `device` and `dtype` override it) and opened
    only when it settles to it (else door.IdentityMismatch, one line); with `other_identity` it opens anyway
    and `differs` names the first field that differs.
    """

    def __init__(
        self,
        model: str,
        dataset: str,
        device: str | None = None,
        dtype: str | None = None,
        backend: str | None = None,
        *,
        expect: Mapping | None = None,
        other_identity: bool = False,
    ) -> None:
        datasets = load_datasets()
        if dataset not in datasets:
            raise KeyError(f"--dataset {dataset!r}: not in datasets.yaml ({', '.join(sorted(datasets))})")
        self.d_entry = datasets[dataset]
        self.template = get_template(default_template(self.d_entry.loader, self.d_entry.prompt))
        cfg = ExtractConfig(model=model, dataset=dataset, backend=backend, device=device, dtype=dtype)
        if expect is not None:
            again = recorded_config(model, dataset, expect, device)
            if backend in (None, again.backend):  # the recorded backend's own options settle to it
                cfg = dataclasses.replace(again, model=model, dtype=dtype or again.dtype)
        # settled and opened through walla extract's door (extract/door.py): the same identity, or one line
        check = None if other_identity else expect
        batching = (expect or {}).get(BATCHING_KEY) or None
        self.settled, self.backend = open_for(cfg, expect=check, recorded=batching)
        self.differs = None if expect is None else identity_difference(dict(expect), self.settled.identity)

    def __call__(self, rnd: dict) -> tuple[list[float], np.ndarray]:
        prompt = self.backend.format_prompt(render(self.template, rnd["question"], rnd["options"]))
        strings = option_strings(self.template, len(rnd["options"]), self.d_entry.option_tokens)
        tok = resolve_option_token_ids(self.backend.encode, self.backend.encode_bare, prompt, strings)
        res = self.backend.score([prompt], [tok[s] for s in strings])
        probs = np.exp(renormalize(res.raw_logprobs[0]).astype(np.float64))
        return (probs / probs.sum()).tolist(), res.hidden[0]


@dataclass
class Agent:
    """One market participant (see module docstring). `learn`: update the head after resolutions, in
    batches of `batch_size` resolved rounds (the run's loss and optimizer settings, AgentHead.update)."""

    client: MarketClient
    head: AgentHead
    features: Features
    learn: bool = False
    batch_size: int = 1
    hidden: dict[int, np.ndarray] = field(default_factory=dict)  # round -> the hidden state it reported on
    reported: set[int] = field(default_factory=set)
    skipped: set[int] = field(default_factory=set)  # rounds it could not report on (logged once)
    last_payout_round: int = 0
    pending: list[tuple[np.ndarray, float]] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    label: str | None = None  # --other-identity: how its features differ from the head's; on every report

    def report(self, rnd: dict) -> dict:
        """Features -> wager -> submit (or replace) the report for one open round."""
        probs, hidden = self.features(rnd)
        calibrate = getattr(self.head, "calibrate", None)
        if calibrate is not None:  # walla-i-cal: the agent's own temperatures first, as walla train
            relevant = getattr(self.features, "relevant", None)  # held the round's relevant context (replay)
            probs = calibrate(probs, hidden, bool(relevant(rnd)) if relevant else False).tolist()
        wager = self.head.wager(hidden)
        out = self.client.submit(rnd["id"], probs, wager)
        if self.label:
            log.warning(
                "round %s: reported on another identity than the head's features: %s", rnd["id"], self.label
            )
        self.hidden[rnd["id"]] = hidden
        self.reported.add(rnd["id"])
        return out

    def report_open_rounds(self) -> int:
        """Report on every open round not yet reported on; returns how many.

        A round the agent cannot handle (the market refuses its report, its features or head fail on the
        question) is logged once and skipped; the agent goes on with the other rounds.
        """
        n, after = 0, 0
        while True:
            page = self.client.rounds("open", after=after, limit=100)
            for rnd in page:
                if rnd["id"] in self.reported or rnd["id"] in self.skipped:
                    continue
                try:
                    self.report(rnd)
                    n += 1
                except MarketError as e:
                    if (
                        e.status >= 500 or e.status == 429
                    ):  # the market's trouble, not the round's: retry later
                        log.warning("round %s: %s; retrying at the next poll", rnd["id"], e)
                        return n
                    self.skip(rnd["id"], str(e))  # closed meanwhile (409), over a limit, ...
                except (ValueError, KeyError, TypeError, IndexError, RuntimeError) as e:
                    self.skip(rnd["id"], f"{type(e).__name__}: {e}")
            if not page:  # a page may stop short of its limit (routes.LIST_BUDGET): page on until empty
                return n
            after = page[-1]["id"]

    def skip(self, rid: int, why: str) -> None:
        self.skipped.add(rid)
        self.hidden.pop(rid, None)
        log.warning("round %s skipped: %s", rid, " ".join(why.split())[:300])

    def collect_payouts(self) -> list[dict]:
        """The agent's new payouts; with `learn`, a head update per `batch_size` resolved rounds."""
        new = self.client.my_payouts(after=self.last_payout_round)
        for p in new:
            self.last_payout_round = max(self.last_payout_round, p["round"])
            hidden = self.hidden.pop(p["round"], None)
            if self.learn and hidden is not None and math.isfinite(p["advantage"]):
                self.pending.append((hidden, p["advantage"]))
            if len(self.pending) >= self.batch_size:
                self.losses.append(self.head.update(self.pending))
                self.pending = []
        return new

    def run(
        self, poll: float = 2.0, max_rounds: int | None = None, stop: Callable[[], bool] | None = None
    ) -> None:
        """Poll until `stop()` (or `max_rounds` reports and their payouts): report, then learn."""
        while not (stop and stop()):
            try:
                n = self.report_open_rounds()
                paid = self.collect_payouts()
                if n or paid:
                    log.info(
                        "reported on %d rounds, %d new payouts (balance %.4f)",
                        n,
                        len(paid),
                        self.client.me()["balance"],
                    )
            except MarketError as e:
                if e.status in (401, 403):  # revoked or wrong token: nothing later polls can fix
                    raise
                log.warning("poll failed (%s); retrying in %.0f s", e, poll)
            except httpx.TransportError as e:
                log.warning("market unreachable (%s); retrying in %.0f s", e, poll)
            if max_rounds is not None and len(self.reported) >= max_rounds and not self.hidden:
                return
            time.sleep(poll)
