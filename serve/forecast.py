"""One forecast = one round of the market's ledger: each agent's features -> its head's wager -> its report
-> the wager-weighted pool, returned only to the caller who asked.

    server = Forecaster(pool, ledger).start()
    job = server.prepare(question="Is it red?", options=["Yes", "No"])      # or question_id="facts-00012"
    answer = server.finish(job, server.features(job), caller="alice")
    server.outcome(answer["round"], label=0)                               # pays every agent; --learn: a step

Nothing here is a formula of its own: prompts are the dataset's template rendered by extract/prompts.py (a
stored question: the prompt walla-extract scored for that agent), features extract/scoring.py (extraction's
scoring path), wagers the trained heads (market/head.py AgentHead), the pool market/payouts.py
`pooled_forecast` (train/mechanism.py `pool`), payouts the ledger's resolution (train/mechanism.py
`payout`), a learning step AgentHead.update (walla-train's own step, as the market's learning agents take).

A round: opened with the run's mechanism settings, `publish_pool="operator"` (the operator's alone: the
market's API shows it to no agent, ledger/common.py OPERATOR_ONLY) and the caller named in its `source`;
every working agent's report written; closed at once: one ledger transaction (`record_closed_round`), whole
or absent, with the events of an opening, each report and a close (the chain checked by `walla market
audit`). A served round left open by a server killed before this was one transaction is voided at the
next start (`void_interrupted`). A served agent whose model fails is listed in `failed_agents` and the pool
uses the others; with none left the request fails with one line.

Fair batching (serve/batcher.py): each prompt is counted with its model's tokenizer and refused over
`max_prompt_tokens` (413, naming the agent and the limit: `--max-prompt-tokens`), so the one long pass a short
request may wait behind is bounded; a request still queued after the batcher's deadline answers 503 with
Retry-After.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np
from walla.extract.prompts import option_strings, render
from walla.market.api import ClientError
from walla.market.ledger import Ledger, Principal
from walla.market.payouts import pooled_forecast
from walla.market.text import visible_key
from walla.serve.batcher import Batcher, QueueTimeout
from walla.serve.loading import (
    ServedAgent,
    ServedPool,
    identity_tag,
    pool_promise,
    run_file,
    stored_question,
)
from walla.store.schema import VARIANT_CODE

SOURCE = "walla serve"  # the `source` of every served round: `<SOURCE> <model id>; caller <name>`
KEEP_HIDDEN = 10_000  # rounds whose hidden states are kept for --learn (oldest forgotten first)
MAX_PROMPT_TOKENS = 2048  # a formatted prompt's tokens: over it, 413 (--max-prompt-tokens)


@dataclass
class Job:
    """A prepared forecast: each agent's prompt, and per loaded model the distinct prompts to score."""

    question: str
    options: list[str]  # the option texts (labels A, B, ... for a stored question)
    question_id: str | None
    prompts: list[str]  # [M] each agent's formatted prompt
    strings: list[str]  # the scored option strings
    per_model: dict[int, list[str]] = field(default_factory=dict)  # id(llm) -> distinct prompts
    tokens: dict[int, list[int]] = field(default_factory=dict)  # id(llm) -> each distinct prompt's tokens
    abstain_below: float | None = None  # the pool abstains when its top probability is below this
    relevant: list[bool] = field(default_factory=list)  # [M] the agent's prompt holds relevant context
    started: float = field(default_factory=time.perf_counter)


class Forecaster:
    """The served pool's rounds (module docstring)."""

    def __init__(
        self,
        pool: ServedPool,
        ledger: Ledger,
        learn: bool = False,
        max_prompt_tokens: int = MAX_PROMPT_TOKENS,
        **batching,
    ) -> None:
        self.pool, self.ledger, self.learn = pool, ledger, learn
        self.max_prompt_tokens = max_prompt_tokens
        self.llms = {id(a.llm): a.llm for a in pool.agents}
        self.batchers = {k: Batcher(m.backend, m.name, **batching) for k, m in self.llms.items()}
        self.principals = [self._principal(a) for a in pool.agents]
        self.hidden: OrderedDict[int, list[np.ndarray | None]] = OrderedDict()  # round -> [M] (learn)
        self.promise = pool_promise(pool.agents)  # what every answer promises (its tier, in each answer)
        self.head_lock = threading.Lock()

    def _principal(self, agent: ServedAgent) -> Principal:
        """The agent's ledger identity: registered once; on a later start, a fresh token (the old unknown)."""
        try:
            token = self.ledger.add_agent(agent.name)
        except ClientError as e:
            if e.status != 409:
                raise
            token = self.ledger.rotate(agent.name)
        who = self.ledger.authenticate(token)
        assert who is not None
        return who

    @property
    def max_queue(self) -> int:
        """The most jobs one model's queue holds (--max-queue): a request of more forecasts never fits."""
        return min((b.max_queue for b in self.batchers.values()), default=0)

    def start(self) -> Forecaster:
        self.voided = self.void_interrupted()
        for b in self.batchers.values():
            b.start()
        return self

    def void_interrupted(self) -> list[int]:
        """Void this pool's served rounds still open: a server killed between a round's opening and its close
        (its reports written one transaction each) left them with only some reports; none is ever pooled."""
        mine, after = [], 0
        while True:
            page = self.ledger.list_rounds("open", after=after, limit=1000)
            for rnd in page:
                if str(rnd.get("source") or "").startswith(f"{SOURCE} {self.pool.model_id};"):
                    self.ledger.void(rnd["id"], f"{SOURCE}: interrupted before all reports were written")
                    mine.append(rnd["id"])
            if len(page) < 1000:
                return mine
            after = page[-1]["id"]

    def stop(self) -> None:
        for b in self.batchers.values():
            b.stop()

    def warm_up(self) -> None:
        """One question through every model, head and the pool's torch calls before the first caller's (a
        process's first pass is seconds slower: kernels chosen, caches filled); no round is recorded."""
        from walla.market.api import warm_up as warm_payouts  # torch's first payout and pool

        names = [visible_key(t) for t in strings_of(self.pool)] or ["Yes", "No"]
        job = self.prepare(question="Is this a warm-up question?", options=names)
        futs = self.submit(job)
        for a, prompt in zip(self.pool.agents, job.prompts, strict=True):
            _, h, _ = dict(zip(job.per_model[id(a.llm)], futs[id(a.llm)].result(), strict=True))[prompt]
            with self.head_lock:
                a.head.wager(h)
        warm_payouts()

    def check_run(self) -> None:
        """The served run is still the one loaded: its heads file and identity (run.json) as they were, by stat
        then, where the stat moved, by digest. A retrained run key (state.pt rewritten) or a run directory
        removed stops the answers (ClientError 503, one line): stale heads are never served under its name.

        Raises:
            ClientError: 503 naming the file and what changed.
        """
        pool = self.pool
        for name, was in pool.files.items():
            path = pool.run_dir / name
            try:
                st = path.stat()
                if (st.st_mtime_ns, st.st_size, st.st_ino) == was.stat:
                    continue
                now = run_file(path)
            except OSError as e:
                raise ClientError(
                    503,
                    f"run: {path} cannot be read ({e.strerror or e}): the served run is gone; restart walla "
                    "serve on a current run",
                ) from None
            if now.digest != was.digest:
                raise ClientError(
                    503,
                    f"run: {name} of the served run {pool.choice.method}/{pool.choice.key_id} changed on disk "
                    f"(digest {now.digest}, served {was.digest}): stale heads are not served; restart walla "
                    "serve to serve the new run",
                )
            pool.files[name] = now  # touched, same bytes

    # ------------------------------------------------------------------------------------------ prepare

    def prepare(
        self,
        question: str | None = None,
        options: list[str] | None = None,
        context: str | None = None,
        question_id: str | None = None,
        abstain_below: float | None = None,
    ) -> Job:
        """Each agent's prompt: a stored question's extracted prompt, else the dataset's template rendered
        with the question, options and context (ClientError 400/404 naming the field)."""
        pool = self.pool
        self.check_run()
        if question_id is not None:
            try:
                row, prompts, labels = stored_question(pool, question_id)
            except KeyError:
                raise ClientError(
                    404,
                    f"question_id: no stored question {ascii(question_id)[:80]} in {pool.choice.scenario}",
                ) from None
            strings = option_strings(pool.template, len(labels), pool.option_tokens)
            if strings_of(pool):  # fixed option strings: the answer names what each one says
                labels = [visible_key(t) for t in strings]
            text = str(pool.data.question[row])
            job = Job(text, labels, question_id, prompts, strings)
            job.relevant = [
                bool(pool.data.variant[row, a.slot] == VARIANT_CODE["relevant"]) for a in pool.agents
            ]
        else:
            strings = scored_strings(pool, list(options))
            if context is not None and pool.template.with_context is None:
                raise ClientError(400, f"context: the {pool.dataset} prompt template has no context form")
            body = render(pool.template, question, options, context)
            prompts = [a.llm.backend.format_prompt(body) for a in pool.agents]
            job = Job(question, list(options), None, prompts, strings)
            job.relevant = [context is not None] * len(pool.agents)  # the caller's context: every agent's
        job.abstain_below = abstain_below
        for a, p in zip(pool.agents, job.prompts, strict=True):
            job.per_model.setdefault(id(a.llm), [])
            if p not in job.per_model[id(a.llm)]:
                job.per_model[id(a.llm)].append(p)
                job.tokens.setdefault(id(a.llm), []).append(self._tokens(a, p))
        return job

    def _tokens(self, agent: ServedAgent, prompt: str) -> int:
        """The prompt's tokens for the agent's model (ClientError 413 over --max-prompt-tokens)."""
        n = len(agent.llm.backend.encode(prompt))
        if n > self.max_prompt_tokens:
            raise ClientError(
                413,
                f"prompt: {n} tokens for agent {agent.name} ({agent.model}), over this server's limit of "
                f"{self.max_prompt_tokens} (--max-prompt-tokens)",
            )
        return n

    def submit(self, job: Job) -> dict[int, Future]:
        """Queue the job's prompts on each model's batcher (QueueFull when one is full)."""
        futs: dict[int, Future] = {}
        try:
            for k, prompts in job.per_model.items():
                futs[k] = self.batchers[k].submit([(p, job.strings) for p in prompts], job.tokens.get(k))
        except Exception:
            for f in futs.values():
                f.cancel()
            raise
        return futs

    # ------------------------------------------------------------------------------------------ answer

    def finish(self, job: Job, futs: dict[int, Future], caller: str) -> dict:
        """Wait for the features, wager, record the round, pool: the answer (blocking: a worker thread)."""
        scored: dict[int, dict[str, tuple]] = {}
        errors: dict[int, str] = {}
        for k, f in futs.items():
            try:
                scored[k] = dict(zip(job.per_model[k], f.result(), strict=True))
            except QueueTimeout:
                raise  # not the model's failure: the server is behind (503 with Retry-After)
            except Exception as e:  # noqa: BLE001 - that model's agents fail; the pool uses the others
                errors[k] = " ".join(f"{type(e).__name__}: {e}".split())[:300]
        t_feat = time.perf_counter()
        reports, failed, hidden = [], [], [None] * len(self.pool.agents)
        for a, prompt in zip(self.pool.agents, job.prompts, strict=True):
            k = id(a.llm)
            if k in errors:
                failed.append({"name": a.name, "model": a.model, "error": errors[k]})
                continue
            probs, h, n_tok = scored[k][prompt]
            try:
                with self.head_lock:
                    if a.head.calibrate is not None:  # walla-i-cal: its temperatures, as walla train pooled
                        probs = a.head.calibrate(probs, h, job.relevant[a.slot])
                    wager = float(a.head.wager(h))
            except (ValueError, RuntimeError) as e:
                failed.append({"name": a.name, "model": a.model, "error": f"head: {e}"})
                continue
            hidden[a.slot] = h
            reports.append((a, [float(x) for x in probs], wager, n_tok))
        if not reports:
            why = "; ".join(f"{f['name']}: {f['error']}" for f in failed)
            raise ClientError(503, f"agents: every agent failed on this question ({why})")
        t_ledger = time.perf_counter()
        rid = self._record(job, reports, caller)
        ledger_s = time.perf_counter() - t_ledger
        if self.learn:
            self.hidden[rid] = hidden
            while len(self.hidden) > KEEP_HIDDEN:
                self.hidden.popitem(last=False)
        k = len(job.options)
        pooled = pooled_forecast(
            [r[1] for r in reports], [r[2] for r in reports], self.pool.settings.pooling, k
        )
        done = time.perf_counter()
        top = max(pooled["probabilities"])
        abstained = job.abstain_below is not None and top < job.abstain_below
        return {
            "model": self.pool.model_id,
            "round": rid,
            "question_id": job.question_id,
            "options": job.options,
            "probabilities": pooled["probabilities"],
            "choice": None if abstained else pooled["choice"],
            "answer": None if abstained else job.options[pooled["choice"]],
            "abstained": abstained,
            "pooling": pooled["pooling"],
            "promise": self.promise["tier"],
            "agents": [
                {
                    "name": a.name,
                    "model": a.model,
                    "probabilities": p,
                    "wager": w,
                    "weight": wt,
                    "prompt_tokens": n,
                    "identity": identity_tag(a.llm.settled.identity),
                    "tier": a.llm.tier,
                    **({"identity_differs": a.llm.differs} if a.llm.differs else {}),
                }
                for (a, p, w, n), wt in zip(reports, pooled["weights"], strict=True)
            ],
            "failed_agents": failed,
            "run_key": f"{self.pool.choice.method}/{self.pool.choice.key_id}",
            "head_version": self.pool.head_version,
            "head_digest": self.pool.head_digest,
            "usage": {"prompt_tokens": sum(r[3] for r in reports), "completion_tokens": 0},
            "timings": {
                "features_s": t_feat - job.started,
                "ledger_s": ledger_s,
                "total_s": done - job.started,
            },
        }

    def _record(self, job: Job, reports: list, caller: str) -> int:
        """The round in the ledger, opened, every report and closed in one transaction (module docstring)."""
        text = job.question if job.question_id is None else f"{job.question_id}\n{job.question}"
        rnd = self.ledger.record_closed_round(
            text,
            job.options,
            self.pool.settings,
            [(self.principals[a.slot], probs, wager) for a, probs, wager, _ in reports],
            source=f"{SOURCE} {self.pool.model_id}; caller {caller}",
        )
        return int(rnd["id"])

    # ------------------------------------------------------------------------------------------ outcome

    def outcome(self, rid: int, label: int | None = None, target: list[float] | None = None) -> dict:
        """Resolve a served round through the ledger (every report paid by the mechanism); with learn, each
        agent's head takes walla-train's step on its own advantage."""
        rnd = self.ledger.get_round(rid)
        if not str(rnd.get("source") or "").startswith(f"{SOURCE} {self.pool.model_id};"):
            raise ClientError(404, f"round: round {rid} is not a forecast of {self.pool.model_id}")
        k = len(rnd["options"])
        if target is None:
            if label is None or not 0 <= label < k:
                raise ClientError(400, f"label: expected an option index in 0..{k - 1}, got {label}")
            target = [1.0 if j == label else 0.0 for j in range(k)]
        elif len(target) != k:
            raise ClientError(400, f"target: expected {k} numbers (one per option), got {len(target)}")
        res = self.ledger.resolve(rid, label, list(target))
        steps = []
        if self.learn and res["resolved_now"]:
            steps = self._learn(rid)
        return {**res, "learned": steps, "head_version": self.pool.head_version}

    def _learn(self, rid: int) -> list[str]:
        hidden = self.hidden.pop(rid, None)
        if hidden is None:
            return []
        stepped = []
        for a in self.pool.agents:
            h = hidden[a.slot]
            if h is None:
                continue
            paid = [
                p
                for p in self.ledger.agent_payouts(self.principals[a.slot], after=rid - 1, limit=10)
                if p["round"] == rid and p["kind"] == "pay"
            ]
            if not paid or not np.isfinite(paid[-1]["advantage"]):
                continue
            with self.head_lock:
                a.head.update([(h, paid[-1]["advantage"])])
                a.head_version += 1
            stepped.append(a.name)
        return stepped


def strings_of(pool: ServedPool) -> list[str]:
    """The option strings the pool's template scores whatever the options ([] : letters by position)."""
    return list(pool.option_tokens or pool.template.option_tokens or [])


def scored_strings(pool: ServedPool, options: list[str]) -> list[str]:
    """The string scored for each option given, in the order given: where the template's option strings are
    fixed (facts: " Yes", " No"), each option is the one it reads as (visible text, any case), so options in
    another order score the same strings in that order, and an option the template cannot score is refused;
    a template that lists the options ({choices}) scores their display letters by position.

    Raises:
        ClientError: 400 naming the options the template scores.
    """
    fixed = strings_of(pool)
    if not fixed:
        try:
            return option_strings(pool.template, len(options), None)
        except ValueError as e:
            raise ClientError(400, f"options: {e}") from None
    by_text = {visible_key(t).casefold(): t for t in fixed}
    got = [by_text.get(visible_key(o).casefold()) for o in options]
    if len(options) != len(fixed) or None in got or len(set(got)) != len(fixed):
        wanted = ", ".join(ascii(visible_key(t)) for t in fixed)
        given = ", ".join(ascii(o)[:40] for o in options[:8])
        raise ClientError(
            400,
            f"options: the {pool.dataset} template scores exactly the options {wanted} (in any order), "
            f"got {given}",
        )
    return got
