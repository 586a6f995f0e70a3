"""kiro's own HTTP/1.1 client for chat completions (kiro.executors.chat_http), against real servers
on 127.0.0.1 that answer on the wire the ways HTTP/1.1 allows: keep-alive, chunked bodies, a body
that ends with the connection, a kept connection the server drops while idle. The openai executor's
retries, timeouts and errors through this client are tests/test_openai_executor.py's."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from kiro.executors import chat_http
from kiro.executors.openai_agent import OpenAIExecutor
from tests.fake_openai import FakeOpenAI, call, make_harness
from tests.fake_openai import fake_openai_fixture as fake_openai_fixture  # the `fake_openai` fixture

Answer = Callable[[int, bytes], tuple[bytes, bool]]  # (request number, request) -> (raw reply, close after)


class RawServer:
    """Reads each request (headers + content-length body) and answers with raw bytes."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.requests: list[bytes] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                while len(buf) < length:
                    buf += conn.recv(65536)
                body, buf = buf[:length], buf[length:]
                with self._lock:
                    self.requests.append(head + b"\r\n\r\n" + body)
                    n = len(self.requests)
                reply, close = self.answer(n, body)
                conn.sendall(reply)
                if close:
                    return

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw_server() -> Iterator[Callable[[Answer], RawServer]]:
    made: list[RawServer] = []

    def make(answer: Answer) -> RawServer:
        made.append(RawServer(answer))
        return made[-1]

    yield make
    for s in made:
        s.close()


def completion(n: int) -> bytes:
    return json.dumps({"id": f"c{n}", "object": "chat.completion", "model": "m",
                       "choices": [{"index": 0, "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": f"answer {n}"}}]}).encode()


def post_many(port: int, n: int, *, max_retries: int = 0) -> list[Any]:
    async def go() -> list[Any]:
        client = chat_http.ChatHTTP(f"http://127.0.0.1:{port}/v1", "sk-test", max_retries=max_retries, timeout=5,
                                    tls=lambda: None)  # type: ignore[arg-type,return-value]
        try:
            return [await client.post("/chat/completions", {"model": "m", "messages": []}) for _ in range(n)]
        finally:
            client.close()

    return asyncio.run(go())


def test_keep_alive_chunked_and_close_delimited_replies_are_read_whole(raw_server: Any) -> None:
    def answer(n: int, body: bytes) -> tuple[bytes, bool]:
        data = completion(n)
        if n == 1:  # content-length, kept open
            return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data), False
        if n == 2:  # chunked, in three chunks with an extension and a trailer
            a, b = data[:10], data[10:]
            return (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                    b"%x;ext=1\r\n%s\r\n%x\r\n%s\r\n0\r\nX-Trailer: t\r\n\r\n" % (len(a), a, len(b), b)), False
        return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n" + data, True  # ends with the connection

    server = raw_server(answer)
    replies = post_many(server.port, 4)
    print("replies:", [r["choices"][0]["message"]["content"] for r in replies], "connections:", server.connections)
    assert [r["choices"][0]["message"]["content"] for r in replies] == ["answer 1", "answer 2", "answer 3",
                                                                       "answer 4"]
    assert server.connections == 2  # requests 1-3 on one kept connection; the 3rd reply closed it
    first = server.requests[0].decode()
    assert first.startswith("POST /v1/chat/completions HTTP/1.1\r\n")
    assert "Authorization: Bearer sk-test\r\n" in first and "x-stainless-retry-count: 0\r\n" in first


def test_a_kept_connection_the_server_dropped_is_replaced_without_a_retry(raw_server: Any) -> None:
    """The server closes after each reply without saying so: the next request finds the kept
    connection dead and goes out on a new one, as the first try (no retry counted, no backoff)."""
    server = raw_server(lambda n, body: (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s"
                                         % (len(completion(n)), completion(n)), True))
    replies = post_many(server.port, 3, max_retries=0)
    assert [r["id"] for r in replies] == ["c1", "c2", "c3"]
    assert server.connections == 3
    assert all(b"x-stainless-retry-count: 0\r\n" in r for r in server.requests)


def test_errors_are_the_openai_clients_exceptions_with_its_messages(raw_server: Any) -> None:
    def answer(n: int, body: bytes) -> tuple[bytes, bool]:
        if n == 1:
            err = json.dumps({"error": {"message": "bad key", "type": "invalid_request_error",
                                        "code": "invalid_api_key"}}).encode()
            return b"HTTP/1.1 401 Unauthorized\r\nContent-Length: %d\r\n\r\n%s" % (len(err), err), False
        if n == 2:
            return b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nnot json!", False
        return b"garbage that is not HTTP\r\n\r\n", True

    server = raw_server(answer)
    tried = []
    for expected in (openai.AuthenticationError, ValueError, openai.APIConnectionError):
        with pytest.raises(expected) as caught:
            post_many(server.port, 1)
        tried.append(f"{type(caught.value).__name__}: {caught.value}")
    print("\n".join(tried))
    assert tried[0] == "AuthenticationError: Error code: 401 - bad key"
    server.answer = lambda n, body: answer(1, body)
    with pytest.raises(openai.AuthenticationError) as again:
        post_many(server.port, 1)
    assert again.value.code == "invalid_api_key" and again.value.status_code == 401
    assert again.value.request.headers["x-stainless-retry-count"] == "0"


def test_with_a_proxy_in_the_environment_the_openai_client_carries_the_calls(
        tmp_path: Path, fake_openai: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    """httpx honours HTTP(S)_PROXY; kiro's client does not, so it steps aside (NO_PROXY lets the
    openai client reach the fake endpoint directly)."""
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("KIRO_TEST_OPENAI_KEY", "sk-proxy-test")
    h = make_harness(tmp_path / "ws", llm={"base_url": fake_openai.base_url, "api_key_env": "KIRO_TEST_OPENAI_KEY",
                                           "max_retries": 0})
    fake_openai.reply(call("complete_step", {"summary": "done through the openai client"}))

    async def go() -> Any:
        ex = OpenAIExecutor(h.config, h.ws, h.task_id)
        try:
            assert ex.http is None and ex.client is not None
            return await ex.run_step(h.context())
        finally:
            await ex.aclose()

    result = asyncio.run(go())
    assert result.outcome == "completed" and result.summary == "done through the openai client"
    assert "OpenAI/Python" in fake_openai.chat_requests[0].headers.get("user-agent", "")
    monkeypatch.delenv("HTTP_PROXY")
    assert chat_http.usable_for(fake_openai.base_url)


def test_hostile_replies_end_in_a_connection_error_not_a_hang_or_a_full_memory(
        raw_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """An endpoint that answers with a body over kiro's limit (announced, chunked, or sent until the
    connection ends) or with sizes that are no sizes: each call ends with openai's connection error."""
    monkeypatch.setattr(chat_http, "BODY_LIMIT", 1 << 20)
    big = b"x" * (600 << 10)
    replies = {
        "announced 10 GiB": (b"HTTP/1.1 200 OK\r\nContent-Length: 10737418240\r\n\r\n", False),
        "negative length": (b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n", False),
        "chunked past the limit": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                   + (b"%x\r\n%s\r\n" % (len(big), big)) * 2 + b"0\r\n\r\n", True),
        "chunk size not hex": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", True),
        "until close past the limit": (b"HTTP/1.1 200 OK\r\n\r\n" + big * 2, True),
    }
    held = 0
    for what, reply in replies.items():
        server = raw_server(lambda n, body, reply=reply: reply)
        with pytest.raises(openai.APIConnectionError) as caught:
            post_many(server.port, 1)
        print(f"{what}: {type(caught.value.__cause__).__name__}: {caught.value.__cause__}")
        held += 1
    print(f"hostile replies: {held} of {len(replies)} ended in a connection error")
    plain = raw_server(lambda n, body: (b"HTTP/1.1 200 OK\r\n\r\n" + completion(n), True))  # no headers at all
    assert post_many(plain.port, 1)[0]["id"] == "c1"
