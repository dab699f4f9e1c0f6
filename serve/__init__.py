"""walla serve: a trained pool of LLMs answering new questions live (docs/serve.md).

loading.py (the run, the agents' LLMs through the backend door, their heads), batcher.py (dynamic batching
per model, scoring with extraction's own path: extract/scoring.py `score_prompts`, stored precision), forecast.py (a forecast is a
ledger round; outcomes pay and, with --learn, step the heads), app.py (the HTTP API), check.py
(served = offline), cli.py (`walla serve`).
"""
