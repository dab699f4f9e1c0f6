"""walla serve: a trained pool of LLMs answering new questions live (docs/serve.md).

loading.py (the run, the agents' LLMs through the backend door, their heads), features.py (extraction's
scoring path, stored precision), batcher.py (dynamic batching per model), forecast.py (a forecast is a
ledger round; outcomes pay and, with --learn, step the heads), app.py (the HTTP API), check.py
(served = offline), cli.py (`walla serve`).
"""
