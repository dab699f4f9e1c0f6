"""The `walla` command: one root over every stage's command line (main.py), loaded lazily (lazy.py)."""
