"""Honest fakes of the model APIs that real agent CLIs and kiro's own executor talk to: real HTTP
servers on 127.0.0.1, speaking the wire protocol (JSON and server-sent events), scripted per test.

- `anthropic.FakeAnthropic`: the Anthropic Messages API (`POST /v1/messages`, SSE streaming), for
  Claude Code.
- `responses.FakeResponses`: the OpenAI Responses API (`POST /v1/responses`, SSE streaming), for
  Codex CLI.
- `chat.FakeChat`: OpenAI Chat Completions with SSE, for aider, opencode, qwen and copilot.
- `gemini.FakeGemini`: the Gemini API (`streamGenerateContent?alt=sse`), for Gemini CLI.
- `tests.fake_openai.FakeOpenAI`: an OpenAI-compatible endpoint scripted by a queue, for kiro's own
  `openai` executor.

All of them are a `FakeServer` (this module): one way to start and stop the server in a thread (`with
Fake(...) as fake:`, or `start()` / `close()`), over HTTPS too (`tls=`), one record of every request
(`requests`, `posts(suffix)`, `wait_until(...)` woken by each request), one dead endpoint (`hang =
True`: the connection is accepted and never answered) and one error answer (`HttpError`, the body
already in the API's format). A subclass turns a request into an answer (`answer` for a POST,
`answer_get` for a GET) with the handler's `send_json` / `send_sse` / `send_http_error`.
"""

from __future__ import annotations

import json
import ssl
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


@dataclass
class Recorded:
    """One request as the server read it."""

    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: Any  # parsed JSON, or None
    raw: bytes = b""  # the body's bytes as sent
    peer: tuple[str, int] | None = None  # the client's address and port: one per TCP connection
    lines: list[tuple[str, str]] = field(default_factory=list)  # the header lines as sent: names' case, order

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages", [])) if isinstance(self.body, dict) else []


@dataclass
class HttpError:
    """An error answer: status, body (already in the API's format), extra headers."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


class FakeServer:
    """The HTTP plumbing; subclasses turn a request into an answer (`answer`, `answer_get`)."""

    name = "fake"

    def __init__(self, *, tls: ssl.SSLContext | None = None) -> None:
        self.requests: list[Recorded] = []
        self.hang = False
        self.tls = tls  # serve HTTPS with this server context
        self._stop = threading.Event()
        self._lock = threading.Condition()  # guards `requests` (and a subclass's own state); notified per request
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> Self:
        fake = self

        class Bound(Handler):
            owner = fake

        self._server = _Server(("127.0.0.1", 0), Bound)
        self._server.daemon_threads = True
        if self.tls is not None:  # a client that refuses the certificate fails the handshake in accept()
            self._server.socket = self.tls.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02},
                                        name=self.name, daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()  # wakes hung and slow answers
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def port(self) -> int:
        assert self._server is not None, "start() the server first"
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"{'https' if self.tls is not None else 'http'}://127.0.0.1:{self.port}"

    def pause(self, seconds: float | None = None) -> bool:
        """Hold an answer `seconds` (None: until the server closes); True when it closed meanwhile."""
        return self._stop.wait(seconds)

    def record(self, rec: Recorded) -> None:
        with self._lock:
            self.requests.append(rec)
            self._lock.notify_all()

    def posts(self, suffix: str) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.method == "POST" and r.path.split("?")[0].endswith(suffix)]

    def wait_until(self, predicate: Callable[[], Any], timeout: float = 120, what: str = "requests") -> Any:
        """Wait, woken by each request, until `predicate()` is truthy; its value (AssertionError after
        `timeout`: generous, for a loaded machine)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not (value := predicate()):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out waiting for {what} ({len(self.requests)} requests came)")
                self._lock.wait(left)
            return value

    # subclasses ----------------------------------------------------------------------------

    def answer(self, handler: Handler, rec: Recorded) -> None:
        """Answer a POST."""
        raise NotImplementedError

    def answer_get(self, handler: Handler, rec: Recorded) -> None:
        """Answer a GET: none is served unless a subclass says so."""
        handler.send_json(404, {"error": {"type": "not_found_error", "message": f"no {rec.path} here"}})


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        """A client that hangs up mid-answer (an agent cancelled or killed by kiro) is what a real service
        sees too: nothing to print. Anything else is printed as http.server does."""
        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            return
        super().handle_error(request, client_address)  # type: ignore[arg-type]


class Handler(BaseHTTPRequestHandler):
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
        return Recorded(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body, raw,
                        peer=self.client_address[:2], lines=list(self.headers.items()))

    def _serve(self, answer: Callable[[Handler, Recorded], None]) -> None:
        rec = self._read()
        self.owner.record(rec)
        if self.owner.hang:  # a dead endpoint: accepted, never answered
            self.owner.pause()
            return
        answer(self, rec)

    def do_POST(self) -> None:  # noqa: N802 - the http.server API
        self._serve(self.owner.answer)

    def do_GET(self) -> None:  # noqa: N802
        self._serve(self.owner.answer_get)

    def send_bytes(self, status: int, payload: bytes, headers: dict[str, str] | None = None) -> None:
        """A whole answer: a JSON body of `payload`'s bytes, with its length. A client that hung up
        meanwhile (a timeout test, an agent cancelled) ends the connection, as a real service sees it."""
        try:
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(payload)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        self.send_bytes(status, json.dumps(body).encode(), headers)

    def send_http_error(self, error: HttpError, headers: dict[str, str] | None = None) -> None:
        """The scripted error, with `headers` the API adds to each (the error's own win)."""
        self.send_json(error.status, error.body, {**(headers or {}), **error.headers})

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
