"""The market's HTTP API: app, dependencies, errors, typed models, guard, routes.

Rooms (private: import their public names from this door):
- `_deps`: The API's dependencies: the ledger, who is asking (a bearer token), the operator check, typed ids, and a per-token rate limit.
- `_errors`: The one error a client's mistake raises: an HTTP status and one line naming the field.
- `_guard`: Slow and greedy clients, at the connection: uvicorn's h11 protocol with a whole-request deadline and a cap on the connections one client address holds open (issue 37, finding 8).
- `_models`: The API's types: pydantic request and response models whose fields carry every constraint (FastAPI parses and checks them at the door; the OpenAPI schema at /openapi.json states them).
- `_server`: The market's HTTP API (FastAPI), over one Ledger: routers by resource (routes/), auth as a dependency (api/deps.py), typed bodies and answers (models.py), OpenAPI at /openapi.json and /docs.
"""

from __future__ import annotations

from walla.cli.lazy import door

_ROOMS = {
    "_deps": ("UNKNOWN_TOKEN_BURST", "bearer", "current_principal", "install_auth", "require_operator"),
    "_errors": ("ClientError", "bad"),
    "_guard": (
        "MAX_CLIENT_CONNECTIONS",
        "MAX_CONNECTIONS",
        "READ_TIMEOUT_S",
        "WRITE_TIMEOUT_S",
        "ConnectionLimits",
        "guarded_config",
        "guarded_protocol",
    ),
    "_models": ("Id", "Line", "MAX_ID", "MAX_OPTIONS", "Note", "Question", "ResolutionIn", "RoundSettings"),
    "_server": (
        "BodyLimit",
        "MAX_BODY",
        "RATE",
        "create_app",
        "error_handlers",
        "error_response",
        "validation_message",
        "warm_up",
    ),
}
__getattr__, __all__ = door(__name__, _ROOMS)
