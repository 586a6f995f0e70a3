"""A minimal HTTP/1.1 keep-alive client for the one request the openai executor makes: a JSON POST
to `<base_url>/chat/completions`, answered with JSON.

Why: with a thousand loops in one process, the openai-python client (httpx, httpcore, anyio, its
request options and response models) cost several milliseconds of CPU per model call, more than
everything else kiro does for the call. This client writes the request bytes itself on asyncio
streams and parses the reply's status line, headers and body (content-length, chunked, or up to
the end of the connection), keeping connections open per endpoint.

It behaves as the openai client does where kiro or a person can tell: the same retries (the
status codes and `x-should-retry` it retries, its backoff with jitter, a Retry-After of at most
`MAX_RETRY_AFTER_DELAY` waited out, a longer one not retried), the `x-stainless-retry-count`
header, the same exceptions (`openai.AuthenticationError`, `RateLimitError`, `APITimeoutError`,
`APIConnectionError`, ... built from the real response, with the same messages), the same TLS
context (the system's CAs, SSL_CERT_FILE/SSL_CERT_DIR), and the key only in the Authorization
header. A reply that is not JSON is a ValueError, as there. `request_timeout_seconds` bounds the
whole request (connect, send, reply), where httpx bounds each phase.

Not covered, so kiro uses the openai client instead (`usable_for`): a proxy set in the environment
(HTTP_PROXY, HTTPS_PROXY, ALL_PROXY; httpx honours them) and a base URL that is neither http nor https.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import ssl
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import openai

try:
    from openai._constants import INITIAL_RETRY_DELAY, MAX_RETRY_AFTER_DELAY, MAX_RETRY_DELAY
except ImportError:  # pragma: no cover - the values of the openai client this was written against
    INITIAL_RETRY_DELAY, MAX_RETRY_DELAY, MAX_RETRY_AFTER_DELAY = 0.5, 8.0, 60

PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy")
IDLE_KEPT = 512  # idle connections kept per endpoint
HEADER_LIMIT = 64 * 1024
BODY_LIMIT = 64 * 1024 * 1024  # a reply bigger than this is an endpoint gone wrong, not a completion
USER_AGENT = f"kiro (openai-compatible; openai-python {getattr(openai, '__version__', '?')})"


class ProtocolError(Exception):
    """The server's reply is not HTTP/1.1 as kiro reads it."""


def _check_size(n: int) -> int:
    if n < 0:
        raise ProtocolError(f"a negative body size ({n})")
    if n > BODY_LIMIT:
        raise ProtocolError(f"the reply's body is over {BODY_LIMIT // 2**20} MiB")
    return n


def usable_for(base_url: str | None, environ: Any = os.environ) -> bool:
    """Whether this client can serve `base_url` the way the openai client would."""
    scheme = urlsplit(base_url or "https://api.openai.com/v1").scheme.lower()
    if scheme not in ("http", "https"):
        return False
    return not any(environ.get(v) or environ.get(v.upper()) for v in PROXY_VARS)


def _retry_after(headers: dict[str, str]) -> float | None:
    """openai's reading of retry-after-ms / retry-after (seconds, or an HTTP date)."""
    for name, divisor in (("retry-after-ms", 1000), ("retry-after", 1)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            delay = float(value)
        except ValueError:
            continue
        if delay == math.inf and value.strip().lower() not in ("inf", "+inf", "infinity", "+infinity"):
            return MAX_RETRY_AFTER_DELAY + 1
        return delay / divisor
    raw = headers.get("retry-after")
    if raw is None:
        return None
    import email.utils
    import time

    parsed = email.utils.parsedate_tz(raw)
    if parsed is None:
        return None
    return float(email.utils.mktime_tz(parsed) - time.time())


def _should_retry(status: int, headers: dict[str, str]) -> bool:
    after = _retry_after(headers)
    if after is not None and math.isfinite(after) and after > MAX_RETRY_AFTER_DELAY:
        return False
    flag = headers.get("x-should-retry")
    if flag == "true":
        return True
    if flag == "false":
        return False
    return status in (408, 409, 429) or status >= 500


def _backoff(retries_taken: int, headers: dict[str, str] | None) -> float:
    after = _retry_after(headers) if headers is not None else None
    if after is not None and math.isfinite(after) and 0 < after <= MAX_RETRY_AFTER_DELAY:
        return after
    delay = min(INITIAL_RETRY_DELAY * pow(2.0, min(retries_taken, 1000)), MAX_RETRY_DELAY)
    return max(0.0, delay * (1 - 0.25 * random.random()))


class _Conn:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class _Endpoint:
    """The idle keep-alive connections to one scheme://host:port, shared by every client of the process
    (one event loop at a time: a pool seen from another loop starts afresh)."""

    def __init__(self, host: str, port: int, tls: ssl.SSLContext | None) -> None:
        self.host, self.port, self.tls = host, port, tls
        self.idle: list[_Conn] = []
        self.loop: asyncio.AbstractEventLoop | None = None
        self.users = 0  # ChatHTTP clients not closed yet

    async def get(self) -> tuple[_Conn, bool]:
        loop = asyncio.get_running_loop()
        if self.loop is not loop:
            self.idle.clear()  # connections of an event loop that is gone
            self.loop = loop
        while self.idle:
            conn = self.idle.pop()
            if not conn.reader.at_eof() and not conn.writer.is_closing():
                return conn, True
            conn.close()
        reader, writer = await asyncio.open_connection(
            self.host, self.port, ssl=self.tls, server_hostname=self.host if self.tls else None, limit=HEADER_LIMIT)
        return _Conn(reader, writer), False

    def put(self, conn: _Conn) -> None:
        if len(self.idle) < IDLE_KEPT and asyncio.get_running_loop() is self.loop:
            self.idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        for conn in self.idle:
            conn.close()
        self.idle.clear()


_endpoints: dict[tuple[str, str, int], _Endpoint] = {}


class ChatHTTP:
    """POST JSON, get JSON back, as the openai client would (see the module docstring)."""

    def __init__(self, base_url: str | None, api_key: str, *, max_retries: int, timeout: float,
                 tls: Callable[[], ssl.SSLContext]) -> None:
        url = urlsplit((base_url or "https://api.openai.com/v1").rstrip("/"))
        self.scheme = url.scheme.lower()
        self.host = url.hostname or "localhost"
        self.port = url.port or (443 if self.scheme == "https" else 80)
        self.prefix = url.path or ""
        self.base_url = f"{self.scheme}://{url.netloc}{self.prefix}"
        key = (self.scheme, self.host, self.port)
        endpoint = _endpoints.get(key)
        if endpoint is None:
            endpoint = _endpoints[key] = _Endpoint(self.host, self.port, tls() if self.scheme == "https" else None)
        endpoint.users += 1
        self.endpoint = endpoint
        self.closed = False
        self.max_retries = max_retries
        self.timeout = timeout
        host = self.host if ":" not in self.host else f"[{self.host}]"
        default = 443 if self.scheme == "https" else 80
        self._head = (f"Host: {host}{'' if self.port == default else f':{self.port}'}\r\n"
                      f"Authorization: Bearer {api_key}\r\n"
                      f"Content-Type: application/json\r\nAccept: application/json\r\n"
                      f"User-Agent: {USER_AGENT}\r\nConnection: keep-alive\r\n").encode("latin-1")

    async def post(self, path: str, body: Any) -> Any:
        """The reply's JSON. Raises the openai exceptions the openai client raises, or ValueError.
        `body`: the JSON value, or its encoding (bytes)."""
        data = body if isinstance(body, bytes) else json.dumps(body, ensure_ascii=False,
                                                              separators=(",", ":")).encode("utf-8")
        target = self.prefix + path
        retries_taken = 0
        while True:
            head = (f"POST {target} HTTP/1.1\r\nContent-Length: {len(data)}\r\n"
                    f"x-stainless-retry-count: {retries_taken}\r\n").encode("latin-1")
            remaining = self.max_retries - retries_taken
            try:
                async with asyncio.timeout(self.timeout):
                    status, headers, content = await self._exchange(head + self._head + b"\r\n" + data)
            except TimeoutError:
                if remaining > 0:
                    await asyncio.sleep(_backoff(retries_taken, None))
                    retries_taken += 1
                    continue
                raise openai.APITimeoutError(request=self._request(path, retries_taken)) from None
            except (OSError, EOFError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ProtocolError,
                    ssl.SSLError, ValueError) as exc:
                if remaining > 0:
                    await asyncio.sleep(_backoff(retries_taken, None))
                    retries_taken += 1
                    continue
                raise openai.APIConnectionError(request=self._request(path, retries_taken)) from exc
            if 200 <= status < 300:
                return json.loads(content)  # ValueError when it is not JSON, as with the openai client
            if remaining > 0 and _should_retry(status, headers):
                await asyncio.sleep(_backoff(retries_taken, headers))
                retries_taken += 1
                continue
            raise self._status_error(path, retries_taken, status, headers, content)

    def close(self) -> None:
        """This client is done; the last of an endpoint's clients closes its kept connections."""
        if not self.closed:
            self.closed = True
            self.endpoint.users -= 1
            if self.endpoint.users <= 0:
                self.endpoint.close()

    async def _exchange(self, request: bytes) -> tuple[int, dict[str, str], bytes]:
        """One request on a kept connection (again on a new one when a kept one turns out closed
        before any reply byte: the server let it go while idle), or on a new one."""
        while True:
            conn, reused = await self.endpoint.get()
            try:
                conn.writer.write(request)
                await conn.writer.drain()
                first = await conn.reader.readline()
                if not first:
                    raise EOFError("the server closed the connection")
            except (OSError, EOFError):
                conn.close()
                if reused:
                    continue
                raise
            except BaseException:
                conn.close()
                raise
            try:
                status, headers, content, keep = await self._reply(conn.reader, first)
            except BaseException:
                conn.close()
                raise
            if keep:
                self.endpoint.put(conn)
            else:
                conn.close()
            return status, headers, content

    @staticmethod
    async def _reply(reader: asyncio.StreamReader, first: bytes) -> tuple[int, dict[str, str], bytes, bool]:
        while True:
            parts = first.split(None, 2)
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
                raise ProtocolError(f"not an HTTP/1.1 status line: {first[:80]!r}")
            status = int(parts[1])
            lines: list[bytes] = []
            size = 0
            while first.endswith(b"\n"):  # header lines up to the blank one (none at all is allowed)
                line = await reader.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                size += len(line)
                if size > HEADER_LIMIT:
                    raise ProtocolError(f"the reply's headers are over {HEADER_LIMIT // 1024} KiB")
                lines.append(line)
            headers: dict[str, str] = {}
            for text in b"".join(lines).decode("latin-1").splitlines():
                name, sep, value = text.partition(":")
                if sep:
                    key = name.strip().lower()
                    headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
            if 100 <= status < 200:  # an interim reply (100 Continue): the real one follows
                first = await reader.readline()
                continue
            break
        keep = parts[0] == b"HTTP/1.1" and "close" not in headers.get("connection", "").lower()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            chunks = []
            total = 0
            while True:
                size_line = await reader.readline()
                size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
                total += _check_size(size)
                _check_size(total)
                if size == 0:
                    while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    break
                chunks.append(await reader.readexactly(size))
                await reader.readexactly(2)
            content = b"".join(chunks)
        elif "content-length" in headers:
            content = await reader.readexactly(_check_size(int(headers["content-length"])))
        elif status in (204, 304):
            content = b""
        else:
            parts_read: list[bytes] = []
            total = 0
            while block := await reader.read(65536):
                total += len(block)
                _check_size(total)
                parts_read.append(block)
            content = b"".join(parts_read)
            keep = False
        return status, headers, content, keep

    # -- the openai client's exceptions ---------------------------------------------------------

    def _request(self, path: str, retries_taken: int) -> Any:
        import httpx2  # only on a failure: the exceptions carry httpx objects

        return httpx2.Request("POST", self.base_url + path,
                              headers={"x-stainless-retry-count": str(retries_taken)})

    def _status_error(self, path: str, retries_taken: int, status: int, headers: dict[str, str],
                      content: bytes) -> openai.APIStatusError:
        """What `openai.AsyncOpenAI` raises for this reply (`_make_status_error_from_response`)."""
        import httpx2

        response = httpx2.Response(status, headers=list(headers.items()), content=content,
                                   request=self._request(path, retries_taken))
        message = f"Error code: {status}"
        text = content.decode("utf-8", "replace").strip()
        body: Any = text
        try:
            body = json.loads(text)
        except ValueError:
            pass
        else:
            error = body.get("error", body) if isinstance(body, dict) else None
            said = error.get("message") if isinstance(error, dict) else None
            if isinstance(said, str) and said:
                message += f" - {said}"
        data = body.get("error", body) if isinstance(body, dict) else body
        kinds: dict[int, type[openai.APIStatusError]] = {
            400: openai.BadRequestError, 401: openai.AuthenticationError, 403: openai.PermissionDeniedError,
            404: openai.NotFoundError, 409: openai.ConflictError, 422: openai.UnprocessableEntityError,
            429: openai.RateLimitError}
        kind = kinds.get(status) or (openai.InternalServerError if status >= 500 else openai.APIStatusError)
        return kind(message, response=response, body=data)

