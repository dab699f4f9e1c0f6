"""The API's routers, one per resource (fastapi/full-stack-fastapi-template's api/routes): rounds, reports,
agents (accounts and the operator's overview). api/server.py mounts them.

    within_budget(rows, key)     a listing's rows cut to LIST_BUDGET bytes of JSON (at least one)
"""

import json

LIST_BUDGET = 256 * 1024  # bytes of JSON a listing answers at most (issue 46: a slow reader's memory)


def within_budget(rows: list[dict], group: str | None = None, budget: int = LIST_BUDGET) -> list[dict]:
    """The first rows whose JSON fits `budget` bytes (always the first row); with `group`, the cut falls
    between two values of that field (a client pages on with after=<the last row's group>, so no row of a
    group is skipped). The client pages on until an empty page."""
    size = 2
    for i, row in enumerate(rows):
        size += len(json.dumps(row, ensure_ascii=False, default=str)) + 1
        if size > budget and i > 0:
            kept = rows[:i]
            if group is not None:
                whole = [r for r in kept if r[group] != kept[-1][group]]
                kept = whole or kept
            return kept
    return rows
