"""Load test of the live market over loopback HTTP: A agents x R rounds with concurrent submissions.

    python benchmarks/market_load.py                          # 12 agents x 500 rounds, SQLite, server subprocess
    python benchmarks/market_load.py --agents 4 --rounds 40 --in-process
    python benchmarks/market_load.py --db postgresql://user@127.0.0.1:5432/market

Rounds are opened in waves (--wave at a time); every agent, each in its own thread with its own token and
HTTP connection, submits a report to every round of the wave (a random distribution and wager from its own
seeded generator; 1 in 5 replaced once); then the wave is closed and resolved by --resolvers threads.
Prints reports/s (submissions over the time spent submitting) and resolution latency p50/p99, then audits
the ledger: row counts (rounds, reports, resolutions, payouts = R, R*A, R, R*A), no (round, agent) twice,
every stored report equal to the agent's last submission, and every round's payouts -- and their sum --
recomputed from the stored reports with walla.train.mechanism.net_payout. Exit 1 when the audit fails.
Bounded: loopback only, a fresh database (a temporary SQLite file unless --db).
"""

# ruff: noqa: E402 (the options are read before the imports that load torch)
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def parser() -> argparse.ArgumentParser:
    """The options, built before torch loads: --help and a mistyped flag answer at once (one line, exit 2)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], usage=argparse.SUPPRESS)
    ap.add_argument("--agents", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=500)
    ap.add_argument("--wave", type=int, default=25, help="rounds open at once")
    ap.add_argument("--resolvers", type=int, default=4, help="threads resolving a wave")
    ap.add_argument("--db", default=None, help="database path or URL (default: a temporary SQLite file)")
    ap.add_argument("--in-process", action="store_true", help="serve from this process (no subprocess)")
    return ap


if __name__ == "__main__":
    parser().parse_args()

import numpy as np
import torch
from sqlalchemy import func, select
from walla.market import db
from walla.market.client import MarketClient, wait_ready
from walla.market.ledger import Ledger
from walla.market.local import LocalServer, free_port
from walla.train import mechanism

OP_TOKEN = "market-load-operator-token-0123456789"
K = 4
SETTINGS = {"variant": "I", "pooling": "linear", "c1": 1.0, "c2": 0.5, "c3": 0.5}


def _server(database: str, in_process: bool):
    """(url, stop) of a server on a free loopback port: in this process, or `walla market serve`."""
    ledger = Ledger.open(database)
    ledger.ensure_operator(OP_TOKEN)
    if in_process:
        srv = LocalServer(ledger).start()
        return srv.url, lambda: (srv.stop(), ledger.close())
    ledger.close()
    port = free_port()
    exe = Path(sys.executable).with_name("walla")
    proc = subprocess.Popen(
        [str(exe), "market", "serve", "--db", database, "--port", str(port), "--unsigned"],
        env={**os.environ, "WALLA_MARKET_OPERATOR_TOKEN": OP_TOKEN},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, timeout=120)
    return url, lambda: (proc.terminate(), proc.wait(timeout=30))


def _agent_loop(client: MarketClient, name: str, seed: int, rids: list[int], sent: dict) -> None:
    """One agent: a report for each round (1 in 5 replaced right away); records what it sent last."""
    rng = np.random.default_rng(seed)
    for rid in rids:
        for _ in range(1 + int(rng.random() < 0.2)):
            p = rng.dirichlet(np.ones(K)).tolist()
            w = float(rng.uniform(0, 1))
            client.submit(rid, p, w)
            sent[(rid, name)] = (p, w)


def run_load(agents: int, rounds: int, wave: int, resolvers: int, database: str, in_process: bool) -> dict:
    url, stop = _server(database, in_process)
    try:
        op = MarketClient(url, OP_TOKEN)
        names = [f"agent{i:02d}" for i in range(agents)]
        clients = [MarketClient(url, op.add_agent(name)) for name in names]
        sent: dict = {}
        submit_s, latencies = 0.0, []
        lock = threading.Lock()

        def resolve(rid: int) -> None:
            t0 = time.perf_counter()
            op.resolve(rid, label=rid % K)
            with lock:
                latencies.append(time.perf_counter() - t0)

        with ThreadPoolExecutor(max(agents, resolvers)) as pool:
            for start in range(0, rounds, wave):
                rids = [
                    op.open_round(f"q{t}", [f"o{j}" for j in range(K)], **SETTINGS)["id"]
                    for t in range(start, min(rounds, start + wave))
                ]
                before = len(sent)
                t0 = time.perf_counter()
                jobs = [
                    pool.submit(_agent_loop, c, n, 1000 * i + start, rids, sent)
                    for i, (c, n) in enumerate(zip(clients, names, strict=True))
                ]
                for job in jobs:
                    job.result()
                submit_s += time.perf_counter() - t0
                assert len(sent) == before + len(rids) * agents
                for rid in rids:
                    op.close_round(rid)
                with ThreadPoolExecutor(resolvers) as rpool:
                    list(rpool.map(resolve, rids))
        for c in [op, *clients]:
            c.close()
    finally:
        stop()
    return {"sent": sent, "submit_s": submit_s, "latencies": latencies}


def audit(database: str, sent: dict, agents: int, rounds: int) -> dict:
    """Row counts, uniqueness, stored == sent, payouts recomputed from the stored reports (mechanism)."""
    ledger = Ledger.open(database)
    try:
        counts = ledger.counts()
        problems = []
        want = {
            "rounds": rounds,
            "reports": rounds * agents,
            "resolutions": rounds,
            "payouts": rounds * agents,
        }
        for table, n in want.items():
            if counts[table] != n:
                problems.append(f"{table}: {counts[table]} rows, expected {n}")
        with ledger.engine.connect() as conn:
            names = {r.id: r.name for r in conn.execute(select(db.agents))}
            reps = list(
                conn.execute(select(db.reports).order_by(db.reports.c.round_id, db.reports.c.agent_id))
            )
            pays = {(p.round_id, p.agent_id): p.payout for p in conn.execute(select(db.payouts))}
            versions = int(conn.execute(select(func.sum(db.reports.c.version))).scalar_one() or 0)
            labels = {r.round_id: r.label for r in conn.execute(select(db.resolutions))}
        pairs = {(r.round_id, r.agent_id) for r in reps}
        if len(pairs) != len(reps) or len(pays) != counts["payouts"]:
            problems.append("a (round, agent) pair appears twice")
        stored = {(r.round_id, names[r.agent_id]): (json.loads(r.probabilities), r.wager) for r in reps}
        if stored != sent:
            lost = len(set(sent) - set(stored))
            problems.append(f"stored reports differ from the last submissions ({lost} missing)")
        # recompute: [R, A, K] reports in agent-id order -> mechanism.net_payout per round
        rids = sorted(labels)
        by = {(r.round_id, r.agent_id): r for r in reps}
        aids = sorted({r.agent_id for r in reps})
        p = torch.tensor(
            [[json.loads(by[(rid, a)].probabilities) for a in aids] for rid in rids], dtype=torch.float64
        )
        w = torch.tensor([[by[(rid, a)].wager for a in aids] for rid in rids], dtype=torch.float64)
        y = torch.nn.functional.one_hot(torch.tensor([labels[r] for r in rids]), K).double()
        want_pay = mechanism.net_payout(
            p, w, y, SETTINGS["variant"], SETTINGS["c1"], SETTINGS["c2"], SETTINGS["c3"]
        )
        got_pay = torch.tensor([[pays[(rid, a)] for a in aids] for rid in rids], dtype=torch.float64)
        max_diff = float((want_pay - got_pay).abs().max()) if rids else 0.0
        sum_diff = abs(float(want_pay.sum()) - float(got_pay.sum())) if rids else 0.0
        if max_diff > 1e-12 or sum_diff > 1e-9:
            problems.append(f"payouts differ from the recomputation (max {max_diff:.3g}, sum {sum_diff:.3g})")
        total = float(got_pay.sum()) if rids else 0.0
        return {
            "counts": counts,
            "submissions": versions,
            "payout_sum": total,
            "max_diff": max_diff,
            "bound_sum": rounds * mechanism.deficit_bound(SETTINGS["c2"], SETTINGS["c3"]),
            "problems": problems,
        }
    finally:
        ledger.close()


def main(argv: list[str] | None = None) -> dict:
    ap = parser()
    args = ap.parse_args(argv)
    if args.agents < 2 or args.rounds < 1 or args.wave < 1 or args.resolvers < 1:
        ap.error("--agents >= 2, --rounds, --wave and --resolvers >= 1")
    with tempfile.TemporaryDirectory(prefix="walla-market-load-") as tmp:
        database = args.db or str(Path(tmp) / "market.db")
        t0 = time.perf_counter()
        run = run_load(args.agents, args.rounds, args.wave, args.resolvers, database, args.in_process)
        wall = time.perf_counter() - t0
        out = audit(database, run["sent"], args.agents, args.rounds)
    lat = np.array(run["latencies"]) * 1e3
    out.update(
        wall_s=wall,
        reports_per_s=out["submissions"] / run["submit_s"],
        p50_ms=float(np.percentile(lat, 50)),
        p99_ms=float(np.percentile(lat, 99)),
    )
    print(
        f"market load: {args.agents} agents x {args.rounds} rounds ({out['submissions']} submissions, "
        f"{out['counts']['reports']} current reports) on {'a server thread' if args.in_process else 'a server process'}, "
        f"{'PostgreSQL' if database.startswith('postgres') else 'SQLite'}, {wall:.1f} s wall"
    )
    print(f"  reports/s {out['reports_per_s']:.0f} (concurrent submissions, {args.agents} agent threads)")
    print(
        f"  resolution latency p50 {out['p50_ms']:.1f} ms, p99 {out['p99_ms']:.1f} ms ({args.resolvers} resolvers)"
    )
    print(
        f"  ledger rows {out['counts']}; payouts recomputed: max |diff| {out['max_diff']:.2e}, "
        f"sum {out['payout_sum']:.6f} (deficit bound {out['bound_sum']:.1f})"
    )
    print(
        "  audit: "
        + ("OK (no lost or duplicated rows)" if not out["problems"] else "; ".join(out["problems"]))
    )
    return out


if __name__ == "__main__":
    sys.exit(1 if main()["problems"] else 0)
