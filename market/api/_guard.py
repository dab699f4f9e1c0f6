"""Slow and greedy clients, at the connection: uvicorn's h11 protocol with a whole-request deadline and a cap
on the connections one client address holds open (issue 37, finding 8).

    uvicorn.Server(guarded_config(create_app(ledger), host="127.0.0.1", port=8765))

- **Deadline.** A request's headers and body must all arrive within `read_timeout` seconds of its first
  byte (of the connection, for its first request): a client dripping a byte every few seconds, or never
  finishing its headers, gets a 408 JSON error line and the connection is closed. (uvicorn's own timeouts
  do not cover this: timeout_keep_alive runs only between requests, and an ASGI middleware cannot see the
  headers before they are whole.) A request whose answer has already started (a 413 sent before its body
  was read) is just closed.
- **Connections per address.** A client address with `per_client` connections open gets a 429 JSON line
  with Retry-After on any further one, which is closed at once: 400 idle sockets from one host cannot hold
  the server. Clients behind one proxy or NAT share an address (raise `--max-client-connections` there).
- **Connections in all.** With `total` connections open, any further one gets a 503 JSON line with
  Retry-After and is closed at once: many addresses together cannot hold more (issue 46, finding 3).
- **Write deadline.** What the server has written to a connection must be taken by the client within
  `write_timeout` seconds: a client that stops reading (a slow reader holding a large answer in the
  server's memory) has its connection aborted, its buffer freed. The kernel holds at most SEND_BUFFER
  bytes of a connection (fixed, not autotuned), the server WRITE_HIGH more before it waits for the client,
  and a listing answers at most routes.LIST_BUDGET bytes: the answers held for slow readers are at most
  about total x (LIST_BUDGET + WRITE_HIGH + SEND_BUFFER), and each for write_timeout seconds.

The limits are one `ConnectionLimits` value, kept as `app.state.limits` by create_app and create_serve_app;
`walla market serve`, `walla serve` and LocalServer build their uvicorn.Config here from it. Only the h11 protocol (uvicorn's pure-Python one) is
guarded, and it is the one used, whether or not httptools is installed.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from walla.manifests.validate import config, option

READ_TIMEOUT_S = 10.0  # a request's headers and body must arrive within this long of its first byte
WRITE_TIMEOUT_S = 10.0  # what the server wrote must be taken by the client within this long
MAX_CLIENT_CONNECTIONS = 64  # open connections per client address (a load run's agents share one)
MAX_CONNECTIONS = 512  # open connections in all
RETRY_AFTER_S = 1  # a refused connection's Retry-After
WRITE_HIGH = 64 * 1024  # bytes buffered for a connection before the server waits for the client to read
SEND_BUFFER = (
    64 * 1024
)  # the kernel's send buffer of a connection (fixed: autotuned, it took a 256 KiB answer whole)


def raw_error(status: int, reason: str, message: str, retry_after: int | None = None) -> bytes:
    """A whole HTTP/1.1 answer with the API's one-line JSON error, closing the connection (written outside
    h11's state machine: there may be no request yet to answer)."""
    body = json.dumps({"error": " ".join(message.split())}, ensure_ascii=True).encode()
    head = [
        f"HTTP/1.1 {status} {reason}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
        *([f"retry-after: {retry_after}"] if retry_after is not None else []),
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class GuardedH11(H11Protocol):
    """H11Protocol plus the deadline and the per-address cap (module docstring). One subclass per server:
    guarded_protocol() binds its limits and its table of open connections."""

    read_timeout: float
    write_timeout: float
    per_client: int
    total: int
    open_per_client: dict[str, int]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deadline: asyncio.TimerHandle | None = None
        self.write_deadline: asyncio.TimerHandle | None = None
        self.address: str | None = None  # counted in open_per_client while this connection is open

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        address = self.client[0] if self.client else "?"
        held = self.open_per_client.get(address, 0)
        if held >= self.per_client:
            what = f"connection: {address} already holds {held} open connections (at most {self.per_client})"
            transport.write(raw_error(429, "Too Many Requests", what, RETRY_AFTER_S))
            transport.close()
            return
        in_all = sum(self.open_per_client.values())
        if in_all >= self.total:
            what = f"connection: the server holds {in_all} open connections (at most {self.total})"
            transport.write(raw_error(503, "Service Unavailable", what, RETRY_AFTER_S))
            transport.close()
            return
        self.open_per_client[address] = held + 1
        self.address = address
        transport.set_write_buffer_limits(high=WRITE_HIGH, low=0)  # resumed once the client took it all
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        self._arm()

    def pause_writing(self) -> None:
        """The client has not taken WRITE_HIGH bytes yet: it must take all of them within write_timeout."""
        super().pause_writing()
        if self.write_deadline is None and self.address is not None:
            self.write_deadline = self.loop.call_later(self.write_timeout, self._write_expired)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._disarm_write()

    def _disarm_write(self) -> None:
        if self.write_deadline is not None:
            self.write_deadline.cancel()
            self.write_deadline = None

    def _write_expired(self) -> None:
        """A slow reader: the answer is dropped, the connection aborted (close() would wait for the buffer)."""
        self.write_deadline = None
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._disarm_write()
        if self.address is not None:
            left = self.open_per_client.get(self.address, 1) - 1
            if left > 0:
                self.open_per_client[self.address] = left
            else:
                self.open_per_client.pop(self.address, None)
            self.address = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.deadline is None and self.conn.their_state is h11.IDLE:  # the first byte of a new request
            self._arm()
        super().data_received(data)
        self._disarm_when_received()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start a pipelined request already in h11's buffer
        if self.deadline is None and self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:
            self._arm()
        self._disarm_when_received()

    def _disarm_when_received(self) -> None:
        if self.conn.their_state not in (h11.IDLE, h11.SEND_BODY):  # whole (DONE, MUST_CLOSE) or failed
            self._disarm()

    def _arm(self) -> None:
        if self.address is not None and not self.transport.is_closing():
            self.deadline = self.loop.call_later(self.read_timeout, self._expire)

    def _disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _expire(self) -> None:
        """The request is not whole after read_timeout: 408 unless its answer has started; close."""
        self.deadline = None
        if self.transport.is_closing():
            return
        if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):  # nothing of an answer sent yet
            what = "request" if self.conn.their_state is h11.IDLE else "body"
            self.transport.write(
                raw_error(408, "Request Timeout", f"{what}: not received within {self.read_timeout:g} s")
            )
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # the app's receive() gets http.disconnect; its answer is dropped
            self.cycle.message_event.set()
        self.transport.close()


@config
class ConnectionLimits:
    """The guard's limits of one server (module docstring), as create_app and create_serve_app keep them in
    `app.state.limits` and guarded_config reads them. Each field is also its `walla market serve` option
    (cli/options.py `grouped_options`): the flag, its default and its help are written once, here."""

    read_timeout: float = option(
        READ_TIMEOUT_S,
        "seconds a request (headers and body) may take to arrive, from its first byte; else 408",
    )
    max_client_connections: int = option(
        MAX_CLIENT_CONNECTIONS, "open connections per client address; more are refused with 429"
    )
    write_timeout: float = option(
        WRITE_TIMEOUT_S, "seconds a client may take to read what the server wrote to it; else it is closed"
    )
    max_connections: int = option(MAX_CONNECTIONS, "open connections in all; more are refused with 503")

    def __post_init__(self) -> None:
        problems = [
            f"--{name.replace('_', '-')}: expected {allowed}, got {getattr(self, name):g}"
            for name, ok, allowed in (
                ("read_timeout", 0 < self.read_timeout <= 3600, "0 < seconds <= 3600"),
                ("max_client_connections", 1 <= self.max_client_connections <= 100_000, "1..100000"),
                ("write_timeout", 0 < self.write_timeout <= 3600, "0 < seconds <= 3600"),
                ("max_connections", 1 <= self.max_connections <= 100_000, "1..100000"),
            )
            if not ok  # NaN too
        ]
        if problems:
            raise ValueError("; ".join(problems))

    def protocol(self) -> type[GuardedH11]:
        return guarded_protocol(
            self.read_timeout, self.max_client_connections, self.write_timeout, self.max_connections
        )


def guarded_protocol(
    read_timeout: float, per_client: int, write_timeout: float | None = None, total: int | None = None
) -> type[GuardedH11]:
    """A GuardedH11 subclass with these limits and its own table of open connections (one per server);
    `write_timeout` None: read_timeout's; `total` None: 16 x per_client."""
    write_timeout = read_timeout if write_timeout is None else write_timeout
    total = 16 * per_client if total is None else total
    if not read_timeout > 0 or not write_timeout > 0 or per_client < 1 or total < 1:
        raise ValueError(
            f"expected timeouts > 0 and connection limits >= 1, got {read_timeout}, {write_timeout}, "
            f"{per_client}, {total}"
        )
    attrs = {
        "read_timeout": float(read_timeout),
        "write_timeout": float(write_timeout),
        "per_client": int(per_client),
        "total": int(total),
        "open_per_client": {},
    }
    return type("GuardedH11Server", (GuardedH11,), attrs)


def guarded_config(app: Any, **uvicorn_kwargs: Any) -> uvicorn.Config:
    """uvicorn.Config serving `app` (create_app's or create_serve_app's) through GuardedH11 with the app's
    limits (`app.state.limits`)."""
    return uvicorn.Config(app, http=app.state.limits.protocol(), **uvicorn_kwargs)
