"""Honest fakes of the model APIs that real agent CLIs talk to: real HTTP servers on 127.0.0.1,
speaking the wire protocol (JSON and server-sent events), scripted per test by a `brain` function
that sees each request and says what the model answers.

- `anthropic.FakeAnthropic`: the Anthropic Messages API (`POST /v1/messages`, SSE streaming), for
  Claude Code.
- `responses.FakeResponses`: the OpenAI Responses API (`POST /v1/responses`, SSE streaming), for
  Codex CLI.

Both record every request, can answer with an HTTP error in the API's error format, and can play a
dead endpoint (`hang = True`: the connection is accepted and never answered).
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class HttpError:
    """An error answer: status, body (already in the API's format), extra headers."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


class FakeServer:
    """The HTTP plumbing; subclasses turn a request into an answer (`answer`)."""

    name = "fake"

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.hang = False
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> FakeServer:
        fake = self

        class Handler(_Handler):
            owner = fake

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=self.name, daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def port(self) -> int:
        assert self._server is not None, "start() the server first"
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def record(self, rec: Recorded) -> None:
        with self._lock:
            self.requests.append(rec)

    def posts(self, suffix: str) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.method == "POST" and r.path.split("?")[0].endswith(suffix)]

    # subclasses ----------------------------------------------------------------------------

    def answer(self, handler: _Handler, rec: Recorded) -> None:
        raise NotImplementedError


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        """A client that hangs up mid-answer (an agent cancelled or killed by kiro) is what a real service
        sees too: nothing to print. Anything else is printed as http.server does."""
        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            return
        super().handle_error(request, client_address)  # type: ignore[arg-type]


class _Handler(BaseHTTPRequestHandler):
    owner: FakeServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _read(self) -> Recorded:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        return Recorded(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)

    def do_POST(self) -> None:  # noqa: N802 - the http.server API
        rec = self._read()
        self.owner.record(rec)
        if self.owner.hang:  # a dead endpoint: accepted, never answered
            self.owner._stop.wait()
            return
        self.owner.answer(self, rec)

    def do_GET(self) -> None:  # noqa: N802
        rec = self._read()
        self.owner.record(rec)
        if self.owner.hang:
            self.owner._stop.wait()
            return
        self.send_json(404, {"error": {"type": "not_found_error", "message": f"no {rec.path} here"}})

    def send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def send_sse(self, events: list[tuple[str | None, dict[str, Any]]]) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.end_headers()
        self.close_connection = True
        for name, data in events:
            chunk = (f"event: {name}\n" if name else "") + f"data: {json.dumps(data)}\n\n"
            self.wfile.write(chunk.encode())
            self.wfile.flush()


Brain = Callable[[Recorded], Any]
