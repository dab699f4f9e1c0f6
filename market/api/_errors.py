"""The one error a client's mistake raises: an HTTP status and one line naming the field."""

from __future__ import annotations


class ClientError(Exception):
    """A request the market refuses: `status` (4xx) and a one-line message '<field>: <what is wrong>'."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = " ".join(str(message).split())  # always one line
        self.headers = headers  # e.g. Retry-After with a 429


def bad(field: str, what: str, status: int = 400) -> ClientError:
    return ClientError(status, f"{field}: {what}")
