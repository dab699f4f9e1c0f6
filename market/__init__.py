"""walla market: a live wagering market on the research pipeline's mechanism (DESIGN.md "The live market").

    ledger.py      the database (SQLAlchemy Core): agents, rounds, reports, resolutions, payouts
    payouts.py     a round's payouts and pooled forecast, through walla.train.mechanism (never re-derived)
    validation.py  request bodies -> checked values, or one ClientError naming the field
    server.py      the FastAPI app (HTTP API + the operator's dashboard)
    cli.py         `walla market init | serve | add-agent | agent | replay`
    client.py      a small httpx client of the API (agents, replay, load test)
    head.py        one agent's trained WALLA head (a run's state.pt), frozen or learning from its payouts
    agent.py       the live agent: LLM features (walla's hf backend) -> head -> report
    replay.py      a trained scenario's test split through the live API, checked against walla-train

Dependencies point one way: market imports train, extract, store and evaluate; nothing imports market.
"""
