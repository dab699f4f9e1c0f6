"""walla market: a live wagering market on walla's mechanism (DESIGN.md "The live market", docs/market.md).

    ledger/        the database (SQLAlchemy Core): agents, rounds, reports, resolutions, payouts
    payouts.py     a round's payouts and pooled forecast, through walla.train.mechanism (never re-derived)
    models.py      the API's pydantic request/response types: every constraint in the types
    api/deps.py        FastAPI dependencies: the ledger, the bearer token's principal, the operator check
    routes/        one APIRouter per resource: rounds, reports, agents
    api/server.py      the FastAPI app (routers, one-line JSON errors, body limits, the operator's dashboard)
    cli.py         the `walla market` group (lazy, under the `walla` root of walla.cli): cli_operator
                   (init, serve, add-agent), cli_agent (agent), cli_replay (replay), cli_audit (audit, export);
                   each checks its options and then imports its one implementation module: operator_commands,
                   agent, replay, audit_commands
    client.py      a small httpx client of the API (agents, replay, load test)
    head.py        one agent's trained WALLA head (a run's state.pt), frozen or learning from its payouts
    agent.py       the live agent: LLM features (walla's extraction backends) -> head -> report
    replay.py      a trained scenario's test split through the live API, checked against walla train
    ../train/runs/choice.py  which runs a replay uses: one run key of one method (--key / --run, or the only one)
    stats.py       the dashboard's numbers (GET /market); local.py: a server in a thread (replay, tests)

Dependencies point one way: market imports train, extract, store and evaluate; nothing imports market.
"""
