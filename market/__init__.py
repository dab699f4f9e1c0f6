"""walla market: a live wagering market on walla's mechanism (DESIGN.md "The live market", docs/market.md).

    ledger/        the database (SQLAlchemy Core): agents, rounds, reports, resolutions, payouts, the
                   event chain (chain.py); db.py its tables, events.py the events' shapes, keys.py their MACs
    payouts.py     a round's payouts and pooled forecast, through walla.train.mechanism (never re-derived)
    api/           the HTTP API (a door): the FastAPI app, its dependencies (auth), errors, typed models, the
                   slow-client guard, routes/ (one APIRouter per resource: rounds, reports, agents)
    launch.py      starting a server on a ledger: the port free, the operator's token, the keys, the ledger
                   opened, its operator set (walla market serve and walla serve alike)
    cli/           the `walla market` group (lazy, under the `walla` root of walla.cli): each command checks
                   its options, then imports its one implementation module (commands/, agent.py, replay.py)
    commands/      the operator's and the audit's work: the ledger and its server; audit and export
    audit/         the audit: the state proved from the event chain, the chain from its MACs and heads
    client.py      a small httpx client of the API (agents, replay, load test)
    head.py        one agent's trained WALLA head (a run's state.pt), frozen or learning from its payouts
    agent.py       the live agent: LLM features (walla's extraction backends) -> head -> report
    replay.py      a trained scenario's test split through the live API, checked against walla train
    stats.py       the dashboard's numbers (GET /market); local.py: a server in a thread (replay, tests)
    export.py      the ledger's tables as Parquet; text.py: names and texts checked as the API checks them

Which runs a replay or a served pool uses is the runs package's (train/runs/, `choose_runs`).

Dependencies point one way: market imports train, extract, store and evaluate; only serve imports market (its public names).
"""
