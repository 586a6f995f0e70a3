"""The openai executor, driven through the real `openai` client against the fake endpoint
(tests/fake.py): tool calls, turns, failures, usage, context wrap-up, secrets."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import shutil
import socket
import ssl
import struct
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from kiro.errors import ExecutorError
from kiro.executors.base import Guard, StepResult
from kiro.executors.openai_agent import NUDGE, OpenAIExecutor
from kiro.store import transcript
from kiro.store.memory import MemoryStore
from tests.conftest import Workspace, openai_config
from tests.fake_openai import FakeOpenAI, StepHarness, call, make_harness, usage

KEY_ENV = "KIRO_TEST_OPENAI_KEY"


def harness(tmp_path: Path, fake: FakeOpenAI, *, llm: Mapping[str, Any] | None = None,
            **config: Any) -> StepHarness:
    settings = {"base_url": fake.base_url, "api_key_env": KEY_ENV, "max_retries": 2,
                "request_timeout_seconds": 10, **(llm or {})}
    return make_harness(tmp_path / "ws", llm=settings, **config)


def run(h: StepHarness, *, cancel_after: float | None = None, **context: Any) -> StepResult:
    """One step through a new executor, closed after; `cancel_after`: the loop's cancel set that many seconds in."""
    async def go() -> StepResult:
        ex = OpenAIExecutor(h.config, h.ws, h.task_id)
        if cancel_after is not None:
            cancel = context["cancel"] = asyncio.Event()
            asyncio.get_running_loop().call_later(cancel_after, cancel.set)
        try:
            return await ex.run_step(h.context(**context))
        finally:
            await ex.aclose()

    return asyncio.run(go())


def tool_messages(body: Any) -> list[dict[str, Any]]:
    return [m for m in body["messages"] if m["role"] == "tool"]


# -- doing a step -------------------------------------------------------------------------------


def test_a_tool_call_without_an_id_is_named_the_same_in_the_transcript_and_the_next_request(
        tmp_path: Path, fake: FakeOpenAI) -> None:
    """A reply whose tool call has no id (some OpenAI-compatible servers): kiro names it after the turn
    (`call_<turn>_<index>`), read once per response, so the transcript's response record, its tool record
    and the next request's assistant and tool messages all carry the same id."""
    h = harness(tmp_path, fake)
    message = {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "write_file",
                                          "arguments": json.dumps({"path": "a.txt", "content": "a\n"})}}]}
    fake.raw(200, json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [
        {"index": 0, "message": message, "finish_reason": "tool_calls"}]}).encode(),
             headers={"Content-Type": "application/json"})
    fake.reply(call("complete_step", {"summary": "wrote a.txt"}))

    assert run(h).outcome == "completed"
    second = fake.chat_requests[1].body
    assert second["messages"][2]["tool_calls"][0]["id"] == "call_1_0"
    assert tool_messages(second)[0]["tool_call_id"] == "call_1_0"
    records = transcript.read(h.ws.transcript_file("t1"))
    response = next(r for r in records if r["kind"] == "response")
    assert [c["id"] for c in response["tool_calls"]] == ["call_1_0"]
    assert next(r for r in records if r["kind"] == "tool")["call_id"] == "call_1_0"


def test_step_done_by_tool_calls(tmp_path: Path, fake: FakeOpenAI) -> None:
    h = harness(tmp_path, fake)
    fake.reply(call("write_file", {"path": "hello.txt", "content": "hello\n"}))
    fake.reply(call("complete_step", {"summary": "created hello.txt"}))

    result = run(h)

    assert result.outcome == "completed"
    assert result.summary == "created hello.txt"
    assert (h.root / "hello.txt").read_text() == "hello\n"
    first, second = (r.body for r in fake.chat_requests)
    assert first["messages"][0]["role"] == "system"
    assert "Create hello.txt" in first["messages"][1]["content"]
    offered = [t["function"]["name"] for t in first["tools"]]
    assert offered == ["read_file", "write_file", "edit_file", "list_files", "search_files", "complete_step",
                       "fail_step", "request_human", "add_steps", "memory_save", "memory_recall", "sleep",
                       "send_message", "read_messages"]
    call_id = second["messages"][2]["tool_calls"][0]["id"]
    assert tool_messages(second) == [{"role": "tool", "tool_call_id": call_id,
                                      "content": "created hello.txt (6 characters)"}]
    called = h.named("tool_called")
    assert [(e["tool"], e["ok"]) for e in called] == [("write_file", True), ("complete_step", True)]
    assert called[0]["arguments"] == {"path": "hello.txt", "content": "<6 characters>"}
    kinds = [r["kind"] for r in transcript.read(h.ws.transcript_file("t1"))]
    assert kinds == ["attempt_started", "request", "response", "tool", "request", "response", "tool",
                     "attempt_finished"]


def test_the_request_is_the_bytes_the_openai_clients_create_sends(tmp_path: Path, fake: FakeOpenAI) -> None:
    """kiro sends a model call through the openai client's `post` with the body's bytes, the loop's tool
    schemas encoded once: the endpoint gets the body and headers the client's typed
    `chat.completions.create` sends for the same model, messages and tools, call after call (a text
    beyond ASCII included, as the client sends it: UTF-8, not escaped), but the client's seven telemetry
    headers (TELEMETRY_HEADERS), which kiro leaves out and the typed call sends. Through the same client
    (kiro's `SharedClient`, openai's aiohttp transport): the same header lines, in the same order, the names
    in the same case. Through openai's default client (httpx's own transport): the same body and headers; only
    the case of the four names httpx adds itself differs on the wire (Host, Accept-Encoding, Connection,
    Content-Length: httpx sends them capitalised, the aiohttp transport hands aiohttp httpx's lower-case
    names), which HTTP does not tell apart (RFC 9110 §5.1)."""
    import openai

    from kiro.executors.openai_agent import TELEMETRY_HEADERS, SharedClient

    telemetry = {name.lower() for name in TELEMETRY_HEADERS}

    def but_telemetry(lines: list[tuple[str, str]]) -> list[tuple[str, str]]:
        return [(k, v) for k, v in lines if k.lower() not in telemetry]

    h = harness(tmp_path, fake)
    fake.reply(call("write_file", {"path": "hello.txt", "content": "héllo ✓ \u2028 \"quoted\"\n"}))
    fake.reply(call("read_file", {"path": "hello.txt"}))
    fake.reply(call("complete_step", {"summary": "created hello.txt"}))
    assert run(h).outcome == "completed"
    sent = fake.chat_requests
    assert len(sent) == 3 and "héllo ✓" in sent[2].raw.decode()
    assert all(telemetry.isdisjoint(r.headers) for r in sent)

    async def typed(client: openai.AsyncOpenAI) -> None:
        for rec in sent:
            fake.reply(call("complete_step", {"summary": "again"}))
            await client.chat.completions.create(model=rec.body["model"], messages=rec.body["messages"],
                                                 tools=rec.body["tools"])

    async def through_kiros_client() -> None:
        shared = SharedClient(fake.base_url, "not-needed", h.config.llm)
        try:
            await typed(shared.client)
        finally:
            await shared.close()

    async def through_the_default_client() -> None:
        client = openai.AsyncOpenAI(api_key="not-needed", base_url=fake.base_url, max_retries=2,
                                    timeout=h.config.llm.request_timeout_seconds)
        try:
            await typed(client)
        finally:
            await client.close()

    asyncio.run(through_kiros_client())
    same = fake.chat_requests[3:6]
    assert all(telemetry <= r.headers.keys() for r in same)  # the typed call sends them
    assert [r.raw for r in same] == [r.raw for r in sent]
    assert [but_telemetry(r.lines) for r in same] == [r.lines for r in sent]
    asyncio.run(through_the_default_client())
    again = fake.chat_requests[6:]
    assert all(telemetry <= r.headers.keys() for r in again)
    assert [r.raw for r in again] == [r.raw for r in sent]
    assert [{k: v for k, v in r.headers.items() if k not in telemetry} for r in again] == [r.headers for r in sent]
    cased = {"Host", "Accept-Encoding", "Connection", "Content-Length"}
    assert ([[(k.lower() if k in cased else k, v) for k, v in but_telemetry(r.lines)] for r in again]
            == [r.lines for r in sent])


def test_parallel_tool_calls_run_in_order(tmp_path: Path, fake: FakeOpenAI) -> None:
    h = harness(tmp_path, fake)
    fake.reply(tool_calls=[
        call("write_file", {"path": "a.txt", "content": "A"}, id="c1"),
        call("write_file", {"path": "a.txt", "content": "A2"}, id="c2"),
        call("read_file", {"path": "a.txt"}, id="c3"),
    ])
    fake.reply(call("complete_step", {"summary": "ok"}))

    assert run(h).outcome == "completed"
    results = tool_messages(fake.chat_requests[1].body)
    assert [m["tool_call_id"] for m in results] == ["c1", "c2", "c3"]
    assert results[0]["content"].startswith("created a.txt")
    assert results[1]["content"].startswith("replaced a.txt")
    assert results[2]["content"] == "A2"


def test_malformed_arguments_get_a_correctable_error(tmp_path: Path, fake: FakeOpenAI) -> None:
    h = harness(tmp_path, fake)
    fake.reply(call("write_file", '{"path": "a.txt", "content": '))  # torn JSON
    fake.reply(call("write_file", {"path": "a.txt", "contents": "x"}))  # misspelt, missing
    fake.reply(call("write_file", {"path": "a.txt", "content": "x"}))
    fake.reply(call("complete_step", {"summary": "ok"}))

    assert run(h).outcome == "completed"
    reqs = fake.chat_requests
    torn = tool_messages(reqs[1].body)[-1]["content"]
    assert torn.startswith("error: the arguments of write_file are not valid JSON")
    assert "write_file(path: string, content: string)" in torn
    invalid = tool_messages(reqs[2].body)[-1]["content"]
    assert "content: required argument missing" in invalid
    assert "contents: unknown argument" in invalid
    assert (h.root / "a.txt").read_text() == "x"
    assert [e["ok"] for e in h.named("tool_called")] == [False, False, True, True]


def test_turns_exhausted_without_complete_step_is_a_failed_attempt(tmp_path: Path,
                                                                    fake: FakeOpenAI) -> None:
    h = harness(tmp_path, fake, llm={"max_turns_per_step": 3})
    for _ in range(3):
        fake.reply(call("list_files", {}))

    result = run(h)

    assert result.outcome == "failed"
    assert result.error is not None and "3 turns used without complete_step" in result.error
    assert len(fake.chat_requests) == 3


def test_prose_claiming_completion_completes_nothing(tmp_path: Path, fake: FakeOpenAI) -> None:
    h = harness(tmp_path, fake, llm={"max_turns_per_step": 2})
    fake.reply("All steps COMPLETE!")
    fake.reply("I am done. COMPLETE.")

    result = run(h)

    assert result.outcome == "failed"
    assert result.error is not None and "without complete_step" in result.error
    nudge = fake.chat_requests[1].body["messages"][-1]
    assert nudge == {"role": "user", "content": NUDGE}
    assert "tasks.md" in str(h.task_path) and "[ ] 1." in h.task_path.read_text()


def test_other_step_outcomes(tmp_path: Path, fake: FakeOpenAI) -> None:
    h = harness(tmp_path, fake)
    fake.reply(call("fail_step", {"error": "the API spec is missing"}))
    fake.reply(call("request_human", {"question": "Which database?"}))

    failed = run(h)
    asked = run(h)

    assert (failed.outcome, failed.error) == ("failed", "the API spec is missing")
    assert (asked.outcome, asked.question) == ("request_human", "Which database?")


def test_calls_after_an_ending_call_are_not_run(tmp_path: Path, fake: FakeOpenAI) -> None:
    h = harness(tmp_path, fake)
    fake.reply(tool_calls=[call("complete_step", {"summary": "done"}),
                                  call("write_file", {"path": "late.txt", "content": "x"})])
    assert run(h).outcome == "completed"
    assert not (h.root / "late.txt").exists()


def test_unknown_tool_and_disabled_run_command(tmp_path: Path, fake: FakeOpenAI) -> None:
    h = harness(tmp_path, fake)
    fake.reply(tool_calls=[call("delete_everything", {}), call("run_command", {"command": "ls"})])
    fake.reply(call("complete_step", {"summary": "ok"}))

    assert run(h).outcome == "completed"
    unknown, disabled = tool_messages(fake.chat_requests[1].body)
    assert unknown["content"].startswith(
        "error: there is no tool 'delete_everything'; the tools are: read_file")
    assert "tools.shell.enabled is false" in disabled["content"]


def test_add_steps_and_memory_tools(tmp_path: Path, fake: FakeOpenAI) -> None:
    h = harness(tmp_path, fake, approval={"agent_steps": False})  # proposals: tests/test_approval.py
    fake.reply(tool_calls=[
        call("add_steps", {"steps": ["1.1 Write the README"], "after": "1"}),
        call("memory_save", {"content": "the build uses make", "type": "fact", "importance": 0.9}),
        call("memory_recall", {"query": "build"}),
    ])
    fake.reply(call("complete_step", {"summary": "ok"}))

    assert run(h).outcome == "completed"
    assert "- [ ] 1.1 Write the README\n- [ ] 2. Write the notes" in h.task_path.read_text()
    added, saved, recalled = tool_messages(fake.chat_requests[1].body)
    assert added["content"].startswith("added 1 unchecked step(s)")
    assert saved["content"].startswith("saved memory #1 (fact, source loop:t1)")
    assert "the build uses make" in recalled["content"]


# -- stopping -----------------------------------------------------------------------------------


class StopAtTool(Guard):
    def __init__(self) -> None:
        self.models = 0
        self.tools: list[str] = []

    async def before_model_call(self) -> str | None:
        self.models += 1
        return None

    async def before_tool_call(self, name: str, arguments: Mapping[str, Any]) -> str | None:
        self.tools.append(name)
        return "stop_hook"


def test_guard_stop_before_a_tool_interrupts(tmp_path: Path, fake: FakeOpenAI) -> None:
    h = harness(tmp_path, fake)
    fake.reply(call("write_file", {"path": "x.txt", "content": "x"}))
    guard = StopAtTool()

    result = run(h, guard=guard)

    assert (result.outcome, result.stop_reason) == ("interrupted", "stop_hook")
    assert guard.tools == ["write_file"] and guard.models == 1
    assert not (h.root / "x.txt").exists()


def test_sleep_interrupted_by_a_stop(tmp_path: Path, fake: FakeOpenAI) -> None:
    h = harness(tmp_path, fake)
    fake.reply(call("sleep", {"seconds": 99999, "reason": "wait for CI"}))
    asked: list[float] = []

    async def stopped_sleep(seconds: float) -> str | None:
        asked.append(seconds)
        return "stop_hook"

    result = run(h, sleep=stopped_sleep)

    assert (result.outcome, result.stop_reason) == ("interrupted", "stop_hook")
    assert asked and asked[0] <= 3600


def test_cancel_during_a_slow_model_call(tmp_path: Path, fake: FakeOpenAI) -> None:
    h = harness(tmp_path, fake)
    fake.reply(call("complete_step", {"summary": "late"}), delay=30)

    result = run(h, cancel_after=0.2)
    assert (result.outcome, result.stop_reason) == ("interrupted", "cancelled")  # not the 30 s reply's "completed"


def test_cancel_during_a_later_attempts_model_call_and_no_task_left_after_aclose(tmp_path: Path,
                                                                                 fake: FakeOpenAI) -> None:
    """The task that waits for the loop's cancel beside each model call is one for the loop's life: a cancel
    set during a later attempt's call still cuts it, and `aclose` leaves no task behind."""
    h = harness(tmp_path, fake)
    fake.reply(call("complete_step", {"summary": "first"}))
    fake.reply(call("complete_step", {"summary": "late"}), delay=30)

    async def go() -> tuple[StepResult, StepResult, set[asyncio.Task[Any]]]:
        ex = OpenAIExecutor(h.config, h.ws, h.task_id)
        cancel = asyncio.Event()
        first = await ex.run_step(h.context(cancel=cancel))
        asyncio.get_running_loop().call_later(0.2, cancel.set)
        second = await ex.run_step(h.context(cancel=cancel))
        await ex.aclose()
        await asyncio.sleep(0)  # a cancelled task ends at its next turn
        return first, second, asyncio.all_tasks() - {asyncio.current_task()}  # type: ignore[operator]

    first, second, left = asyncio.run(go())
    assert first.outcome == "completed"
    assert (second.outcome, second.stop_reason) == ("interrupted", "cancelled")
    assert left == set()
    records = [r for r in transcript.read(h.ws.transcript_file(h.task_id)) if r["kind"] == "response"]
    assert records[-1].get("error") == "cancelled while waiting for the model"


def test_a_call_that_fails_as_the_cancel_cuts_it_is_interrupted_not_failed(tmp_path: Path, fake: FakeOpenAI,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """What a call raises as it unwinds from the loop's cancel is not the attempt's failure."""
    h = harness(tmp_path, fake)
    unwound: list[bool] = []

    async def create(self: OpenAIExecutor, messages: Any, tools: Any = None) -> Any:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            unwound.append(True)
            raise ValueError("the body was cut") from None

    monkeypatch.setattr(OpenAIExecutor, "create", create)

    result = run(h, cancel_after=0.2)
    assert (result.outcome, result.stop_reason) == ("interrupted", "cancelled")
    assert unwound == [True]


def test_step_timeout_fails_the_attempt(tmp_path: Path, fake: FakeOpenAI) -> None:
    h = harness(tmp_path, fake)
    fake.reply(call("complete_step", {"summary": "late"}), delay=30)
    result = run(h, timeout=0.5)
    assert result.outcome == "failed"
    assert result.error is not None and "ran out of time after 0.5 s" in result.error


# -- endpoint failures --------------------------------------------------------------------------


def test_429_honours_retry_after_then_succeeds(tmp_path: Path, fake: FakeOpenAI,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    h = harness(tmp_path, fake)
    fake.error(429, "slow down", retry_after=1)
    fake.reply(call("complete_step", {"summary": "ok"}))
    waits: list[float] = []
    sleep = anyio.sleep  # the openai client waits between tries with it

    async def counted(seconds: float) -> None:
        waits.append(seconds)
        await sleep(seconds)

    monkeypatch.setattr(anyio, "sleep", counted)
    result = run(h)

    assert result.outcome == "completed"
    assert len(fake.chat_requests) == 2
    assert fake.chat_requests[1].headers["x-stainless-retry-count"] == "1"
    assert waits == [1.0]  # Retry-After: 1 was waited out
    assert result.usage.api_calls == 1  # only the answered call counts


def test_429_past_the_retries_is_a_failed_attempt(tmp_path: Path, fake: FakeOpenAI) -> None:
    h = harness(tmp_path, fake, llm={"max_retries": 1})
    fake.error(429, "slow down", retry_after_ms=10, times=2)
    result = run(h)
    assert result.outcome == "failed"
    assert result.error is not None and "HTTP 429 after 1 retry;" in result.error
    assert len(fake.chat_requests) == 2


def test_retry_after_beyond_the_clients_limit_is_a_wait_through_the_guard(tmp_path: Path,
                                                                         fake: FakeOpenAI) -> None:
    """The client gives up at once on a Retry-After it will not wait out; the executor asks the loop
    to sleep (a budget-style wait, issue 7 item 10) and tries again, without failing the attempt."""
    waits: list[tuple[str, float]] = []

    class Sleeper(Guard):
        async def wait(self, limit: str, seconds: float, message: str, *, figure: Any = None) -> str | None:
            waits.append((limit, seconds))
            return None  # the time has passed

    h = harness(tmp_path, fake)
    fake.error(429, "come back later", retry_after=600)
    fake.reply(call("complete_step", {"summary": "ok"}))
    result = run(h, guard=Sleeper())
    assert result.outcome == "completed"
    assert waits == [("retry_after", 600.0)]
    assert len(fake.chat_requests) == 2


def test_a_run_of_500s_is_a_failed_attempt_naming_the_status(tmp_path: Path, fake: FakeOpenAI) -> None:
    h = harness(tmp_path, fake)
    fake.error(500, "upstream exploded", retry_after_ms=10, times=3)

    result = run(h)

    assert result.outcome == "failed"
    assert result.error is not None
    assert "HTTP 500" in result.error and "upstream exploded" in result.error
    assert len(fake.chat_requests) == 3  # the first try and max_retries=2


def test_request_timeout_is_a_failed_attempt(tmp_path: Path, fake: FakeOpenAI) -> None:
    h = harness(tmp_path, fake, llm={"request_timeout_seconds": 0.3, "max_retries": 0})
    fake.reply(call("complete_step", {"summary": "late"}), delay=30)
    result = run(h)
    assert result.outcome == "failed"
    assert result.error is not None and "timed out after 0.3 s" in result.error


def test_unreachable_endpoint_is_a_failed_attempt(tmp_path: Path, fake: FakeOpenAI) -> None:
    port = fake.port
    fake.close()  # nothing listens there any more
    h = make_harness(tmp_path / "ws", llm={"base_url": f"http://127.0.0.1:{port}/v1", "max_retries": 0,
                                          "api_key_env": KEY_ENV})
    result = run(h)
    assert result.outcome == "failed"
    assert result.error is not None and "could not connect to http://127.0.0.1" in result.error


def test_a_connection_reset_or_closed_is_a_connection_failure_not_a_timeout(tmp_path: Path,
                                                                            fake: FakeOpenAI) -> None:
    """A connection reset, or closed without an answer, is a connection failure after the client's retries, not
    a timeout (openai's aiohttp transport called every connection error a connect timeout; kiro's maps them as
    httpx's transport did), and kiro says what happened."""
    import openai

    from kiro.executors.openai_agent import SharedClient

    fake.fault("reset", times=2)
    h = harness(tmp_path, fake, llm={"max_retries": 1})
    result = run(h)
    assert result.outcome == "failed" and result.error is not None
    assert "could not connect to http://127.0.0.1" in result.error and "after 1 retry" in result.error
    assert "Connection reset by peer" in result.error and "timed out" not in result.error

    async def closed() -> None:
        fake.fault("close")  # the connection closed without an answer
        shared = SharedClient(fake.base_url, "sk-test", h.config.llm.model_copy(update={"max_retries": 0}))
        try:
            with pytest.raises(openai.APIConnectionError) as raised:
                await shared.chat({"model": "m", "messages": []})
            assert not isinstance(raised.value, openai.APITimeoutError)
        finally:
            await shared.close()

    asyncio.run(closed())


@contextlib.contextmanager
def _raw_endpoint(answer: Callable[[socket.socket], None]) -> Iterator[tuple[int, list[int]]]:
    """A socket server on 127.0.0.1 that reads each request and answers it with `answer(connection)`, not HTTP
    machinery: its port and the connections it took ([count])."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted = [0]

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                accepted[0] += 1
                with conn:
                    _read_request(conn)
                    answer(conn)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1], accepted
    finally:
        listener.close()


def _read_request(conn: socket.socket) -> None:
    """The whole request, its body too (by its Content-Length): a connection closed with bytes unread is reset by
    the kernel, not closed, and which of the two a client sees would depend on how its request was split."""
    with conn.makefile("rb") as request:
        request.readline()  # the request line
        request.read(int(http.client.parse_headers(request).get("Content-Length", 0)))


def _not_http(conn: socket.socket) -> None:
    conn.sendall(b"NOT HTTP AT ALL\r\n\r\n")


def _reset(conn: socket.socket) -> None:
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def _closed(conn: socket.socket) -> None:
    pass  # closed without an answer


def _cut(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"id\":")


def _bad_chunk(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\n")


def test_a_reply_that_is_not_http_is_a_connection_failure(tmp_path: Path) -> None:
    """An endpoint that answers with something that is not HTTP: a failed attempt naming what came back
    (aiohttp's error), never an internal error, after the client's retries (httpx's RemoteProtocolError, which
    the client retries: the connections the endpoint took count the tries)."""
    with _raw_endpoint(_not_http) as (port, accepted):
        h = make_harness(tmp_path / "ws", llm={"base_url": f"http://127.0.0.1:{port}/v1", "max_retries": 1,
                                              "api_key_env": KEY_ENV})
        result = run(h)
    assert result.outcome == "failed" and result.error is not None
    assert "could not connect to http://127.0.0.1" in result.error and "ClientResponseError" in result.error
    assert "after 1 retry" in result.error and accepted[0] == 2


@pytest.mark.parametrize("answer", [_not_http, _reset, _closed, _cut, _bad_chunk, None],
                         ids=["not-http", "reset", "closed", "cut-short", "bad-chunk", "refused"])
def test_a_broken_connection_raises_what_httpxs_transport_raised(answer: Callable[[socket.socket], None] | None
                                                                 ) -> None:
    """Through kiro's client (the aiohttp transport) a connection that breaks is the error the openai client
    raised over its httpx transport, from the same httpx error, after as many tries: APIConnectionError from
    RemoteProtocolError, ReadError or ConnectError (never APITimeoutError, never aiohttp's own error)."""
    import openai

    from kiro.executors.openai_agent import SharedClient
    from kiro.store.config import LLMSettings

    async def failure(port: int, shared: bool) -> BaseException:
        url = f"http://127.0.0.1:{port}/v1"
        client = SharedClient(url, "sk-test", LLMSettings(max_retries=1)) if shared else None
        over_httpx = openai.AsyncOpenAI(api_key="sk-test", base_url=url, max_retries=1,
                                        http_client=openai.DefaultAsyncHttpxClient())
        try:
            with pytest.raises(openai.OpenAIError) as raised:
                if client is not None:
                    await client.chat({"model": "m", "messages": []})
                else:
                    await over_httpx.post("/chat/completions", body={"model": "m", "messages": []}, cast_to=object)
            return raised.value
        finally:
            await over_httpx.close()
            if client is not None:
                await client.close()

    raised: dict[bool, tuple[BaseException, int]] = {}
    for shared in (True, False):
        if answer is None:
            with socket.socket() as unused:
                unused.bind(("127.0.0.1", 0))
                port = unused.getsockname()[1]
            raised[shared] = asyncio.run(failure(port, shared)), 0
        else:
            with _raw_endpoint(answer) as (port, accepted):
                raised[shared] = asyncio.run(failure(port, shared)), accepted[0]
    ours, theirs = raised[True][0], raised[False][0]
    assert type(ours) is type(theirs) is openai.APIConnectionError
    assert type(ours.__cause__) is type(theirs.__cause__)
    assert raised[True][1] == raised[False][1] == (0 if answer is None else 2)


def _certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key (openssl)."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_an_https_endpoint_is_verified_against_the_trusted_certificates(tmp_path: Path, ws: Workspace) -> None:
    """TLS is verified: a certificate nobody vouches for is a failed connection naming the cause,
    never a call made anyway; trusted through SSL_CERT_FILE (a `kiro` process started with it), the
    same endpoint does the step."""
    cert, key = _certificate(tmp_path)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    with FakeOpenAI(tls=server) as fake:
        h = harness(tmp_path, fake, llm={"max_retries": 0})
        result = run(h)
        assert result.outcome == "failed" and result.error is not None
        assert "could not connect to https://127.0.0.1" in result.error and "CERTIFICATE_VERIFY_FAILED" in result.error
        assert fake.chat_requests == []

        ws.task("- [ ] 1. Write a\n")
        openai_config(ws, fake)
        fake.reply(call("complete_step", {"summary": "done over TLS"}))
        r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "tls",
                    env=ws.env(SSL_CERT_FILE=str(cert)))
        assert r.returncode == 0, r.stdout + r.stderr
        assert len(fake.chat_requests) == 1


def test_a_proxy_of_the_environment_gets_kiros_transport_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client builds a transport for each proxy of the environment (httpx's mounts; NO_PROXY as ever):
    kiro's, like the endpoint's, so a reply through a proxy is bounded and its errors are httpx's."""
    from kiro.executors.openai_agent import SharedClient, _Transport
    from kiro.store.config import LLMSettings

    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")

    async def mounts() -> None:
        shared = SharedClient("https://models.example/v1", "sk-test", LLMSettings())
        try:
            http = shared.client._client
            proxies = [t for t in http._mounts.values() if t is not None]
            assert proxies and all(type(t) is _Transport and t.proxy is not None for t in proxies)
            assert type(http._transport) is _Transport
        finally:
            await shared.close()

    asyncio.run(mounts())


def test_every_client_uses_the_process_tls_context_and_kiros_pool_settings(fake: FakeOpenAI) -> None:
    """The aiohttp transport builds its TLS context from `verify=` (httpx2.create_ssl_context): kiro's one
    context of the process reaches every client's connector as it is, not a copy built per client (~20 ms
    each); the connector keeps an idle connection KEEPALIVE_SECONDS and opens at most the client's limit."""
    import openai

    from kiro.executors.openai_agent import KEEPALIVE_SECONDS, LOOPS_PER_CLIENT, SharedClient, _tls_context
    from kiro.store.config import Config

    async def calls() -> None:
        shared = [SharedClient(fake.base_url, "sk-test", Config().llm) for _ in range(LOOPS_PER_CLIENT + 1)]
        clients = {id(s.client): s.client for s in shared}
        try:
            for s in shared:
                fake.reply("hi")
                await s.chat({"model": "m", "messages": []})
            assert len(clients) == 2  # LOOPS_PER_CLIENT loops a client, then another
            for client in clients.values():
                transport = client._client._transport
                connector = transport.client.connector
                assert transport.ssl_context is _tls_context() and connector._ssl is _tls_context()
                assert connector.limit == openai.DEFAULT_CONNECTION_LIMITS.max_connections
                assert connector._keepalive_timeout == KEEPALIVE_SECONDS
        finally:
            for s in shared:
                await s.close()
            assert all(c._client._transport.client.closed for c in clients.values())

    asyncio.run(calls())


def test_401_is_an_executor_error_without_a_retry_flood(tmp_path: Path, fake: FakeOpenAI,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-wrong-key-0123456789")
    h = harness(tmp_path, fake)
    fake.error(401, "Incorrect API key provided", times=5)

    with pytest.raises(ExecutorError) as err:
        run(h)

    assert "HTTP 401" in str(err.value) and KEY_ENV in str(err.value)
    assert "sk-wrong-key" not in str(err.value)
    assert len(fake.chat_requests) <= 3


@pytest.mark.parametrize("status", [403, 404])
def test_403_and_404_name_the_model(tmp_path: Path, fake: FakeOpenAI, status: int) -> None:
    h = harness(tmp_path, fake, llm={"model": "gpt-nonexistent"})
    fake.error(status, "The model `gpt-nonexistent` does not exist", code="model_not_found", times=5)

    with pytest.raises(ExecutorError) as err:
        run(h)

    assert "'gpt-nonexistent'" in str(err.value) and "llm.model" in str(err.value)
    assert len(fake.chat_requests) == 1


def test_unknown_model_against_a_server_that_checks(tmp_path: Path) -> None:
    with FakeOpenAI(known_models=["real-model"]) as fake:
        h = harness(tmp_path, fake, llm={"model": "typo-model"})
        with pytest.raises(ExecutorError, match="404 Not Found for model 'typo-model'"):
            run(h)


# -- keys ---------------------------------------------------------------------------------------


def test_missing_key_for_the_openai_api_is_a_clear_error(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv(KEY_ENV, raising=False)
    h = make_harness(tmp_path / "ws", llm={"api_key_env": KEY_ENV})
    with pytest.raises(ExecutorError, match=f"set the environment variable {KEY_ENV}"):
        OpenAIExecutor(h.config, h.ws, "t1")


def test_missing_key_for_a_local_endpoint_uses_a_dummy(tmp_path: Path, fake: FakeOpenAI,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    h = harness(tmp_path, fake)
    fake.reply(call("complete_step", {"summary": "ok"}))
    assert run(h).outcome == "completed"
    assert fake.chat_requests[0].headers["authorization"] == "Bearer not-needed"


def test_canary_key_is_never_written_nor_sent_in_a_body(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    canary = "sk-canary-7f3a9c2e5b1d4086"
    monkeypatch.setenv(KEY_ENV, canary)
    with FakeOpenAI(require_key=canary) as fake:
        h = harness(tmp_path, fake)
        # A model (or a proxy) that echoes the key everywhere it can.
        fake.reply(f"my key is {canary}", tool_calls=[
            call("write_file", {"path": "leak.txt", "content": f"KEY={canary}\n"}),
            call("memory_save", {"content": f"remember {canary}"}),
            call("add_steps", {"steps": [f"rotate {canary}"]}),
            call("read_file", {"path": "leak.txt"}),
        ])
        fake.error(500, f"upstream saw key {canary}", retry_after_ms=5, times=3)
        failed = run(h)
        fake.reply(call("complete_step", {"summary": f"done with {canary}"}))
        done = run(h, attempt=2)

        assert failed.outcome == "failed" and canary not in (failed.error or "")
        assert done.outcome == "completed" and canary not in done.summary
        assert all(r.headers.get("authorization") == f"Bearer {canary}" for r in fake.requests)
        assert canary.encode() not in fake.all_bodies()
    assert canary not in json.dumps(h.events)
    files = [p for p in h.root.rglob("*") if p.is_file()]
    assert h.ws.transcript_file("t1") in files and h.ws.memory_db() in files
    leaks = [p for p in files if canary.encode() in p.read_bytes()]
    assert leaks == []
    assert (h.root / "leak.txt").read_text() == "KEY=[REDACTED]\n"


def test_a_secret_read_from_a_file_does_not_reach_the_model(tmp_path: Path, fake: FakeOpenAI,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    canary = "sk-canary-dotenv-93b1c7e2"
    monkeypatch.setenv(KEY_ENV, canary)
    h = harness(tmp_path, fake)
    (h.root / ".env").write_text(f"OPENAI_API_KEY={canary}\n")
    fake.reply(call("read_file", {"path": ".env"}))
    fake.reply(call("complete_step", {"summary": "ok"}))

    assert run(h).outcome == "completed"
    assert tool_messages(fake.chat_requests[1].body)[0]["content"] == "OPENAI_API_KEY=[REDACTED]\n"
    assert canary.encode() not in fake.all_bodies()
    assert canary not in h.ws.transcript_file("t1").read_text()


# -- usage and the context budget ---------------------------------------------------------------


def test_usage_is_the_sum_of_every_response(tmp_path: Path, fake: FakeOpenAI) -> None:
    h = harness(tmp_path, fake, llm={"model": "priced", "prices": {
        "priced": {"input_per_1m": 2.0, "output_per_1m": 10.0}}})
    fake.reply(call("list_files", {}), usage=usage(1000, 100))
    fake.reply("thinking out loud", usage=usage(1500, 250))
    fake.reply(call("complete_step", {"summary": "ok"}), usage=usage(2000, 50, total=2051))

    result = run(h)

    u = result.usage
    assert (u.prompt_tokens, u.completion_tokens, u.total_tokens, u.api_calls) == (4500, 400, 4901, 3)
    assert u.cost_usd == pytest.approx((4500 * 2.0 + 400 * 10.0) / 1_000_000)


def test_long_conversation_wraps_up_and_restarts_with_the_mission(tmp_path: Path,
                                                                  fake: FakeOpenAI) -> None:
    h = harness(tmp_path, fake, llm={"context_window_tokens": 1000, "wrap_up_threshold": 0.8})
    fake.reply(call("write_file", {"path": "notes.txt", "content": "part 1"}), usage=usage(500, 20))
    fake.reply(call("read_file", {"path": "notes.txt"}), usage=usage(790, 20))  # 810 >= 800
    fake.reply(call("memory_save", {"content": "notes.txt holds part 1", "type": "finding"}),
                      usage=usage(900, 20))
    fake.reply("Progress: notes.txt has part 1; next: write part 2.", usage=usage(950, 30))
    fake.reply(call("complete_step", {"summary": "notes written"}), usage=usage(300, 10))

    result = run(h)

    assert result.outcome == "completed"
    reqs = [r.body for r in fake.chat_requests]
    assert len(reqs) == 5
    assert "Context limit approaching" in reqs[2]["messages"][-1]["content"]
    assert not any("Context limit" in str(m.get("content")) for m in reqs[1]["messages"])
    fresh = reqs[4]["messages"]
    assert [m["role"] for m in fresh] == ["system", "user"]
    mission = h.context().prompt
    assert mission in fresh[1]["content"]
    assert "Progress: notes.txt has part 1; next: write part 2." in fresh[1]["content"]
    assert result.usage.api_calls == 5  # the wrap-up calls count too
    assert h.named("context_wrapped")[0]["threshold"] == 800
    summaries = MemoryStore(h.ws.memory_db()).recent(source="loop:t1", type="summary")
    assert len(summaries) == 1 and "next: write part 2" in summaries[0].content
    kinds = [r["kind"] for r in transcript.read(h.ws.transcript_file("t1"))]
    assert kinds.index("wrap_up") < kinds.index("summary") < kinds.index("restart")


def test_wrap_up_without_a_summary_text_uses_the_saved_memory(tmp_path: Path,
                                                               fake: FakeOpenAI) -> None:
    h = harness(tmp_path, fake, llm={"context_window_tokens": 1000, "wrap_up_threshold": 0.5})
    fake.reply(call("list_files", {}), usage=usage(600, 10))
    for i in range(3):  # the model only saves, never writes the summary text
        fake.reply(call("memory_save", {"content": f"finding {i}"}), usage=usage(700, 10))
    fake.reply(call("complete_step", {"summary": "ok"}))

    assert run(h).outcome == "completed"
    fresh = fake.chat_requests[4].body["messages"]
    assert len(fresh) == 2 and "finding 0" in fresh[1]["content"] and "finding 2" in fresh[1]["content"]


def test_usage_less_endpoint_falls_back_to_an_estimate(tmp_path: Path, fake: FakeOpenAI) -> None:
    h = harness(tmp_path, fake, llm={"context_window_tokens": 3000, "wrap_up_threshold": 0.8})
    big = "x" * 12_000  # ~3000 tokens once read back
    (h.root / "big.txt").write_text(big)
    fake.reply(call("read_file", {"path": "big.txt"}), usage=usage(0, 0))
    fake.reply("Summary: read big.txt", usage=usage(0, 0))
    fake.reply(call("complete_step", {"summary": "ok"}), usage=usage(0, 0))

    assert run(h).outcome == "completed"
    assert "Context limit approaching" in fake.chat_requests[1].body["messages"][-1]["content"]
    assert len(fake.chat_requests[2].body["messages"]) == 2


def test_each_loop_has_its_own_transcript(tmp_path: Path, fake: FakeOpenAI) -> None:
    h = harness(tmp_path, fake)
    fake.reply(call("complete_step", {"summary": "one"}))
    fake.reply(call("complete_step", {"summary": "two"}))
    run(h)
    h.task_id = "t2"
    run(h)
    one = transcript.read(h.ws.transcript_file("t1"))
    two = transcript.read(h.ws.transcript_file("t2"))
    assert {r["task_id"] for r in one} == {"t1"} and {r["task_id"] for r in two} == {"t2"}
    assert one[-1]["summary"] == "one" and two[-1]["summary"] == "two"


def test_a_secret_in_the_steps_title_reaches_no_memory_of_a_context_restart(
        tmp_path: Path, fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    """The summary a context restart saves as a memory names the step: its title (the person's text,
    with the API key pasted in) is cut like the summary itself."""
    secret = "sk-pasted-" + "7" * 32
    monkeypatch.setenv(KEY_ENV, secret)
    h = make_harness(tmp_path / "ws", task_text=f"---\ntitle: Demo\n---\n- [ ] 1. Call the API with {secret}\n",
                     llm={"base_url": fake.base_url, "api_key_env": KEY_ENV, "max_retries": 2,
                          "request_timeout_seconds": 10, "context_window_tokens": 1000, "wrap_up_threshold": 0.8})
    fake.reply(call("list_files", {}), usage=usage(850, 20))
    fake.reply("Progress: looked around.", usage=usage(900, 20))
    fake.reply(call("complete_step", {"summary": "done"}), usage=usage(300, 10))

    assert run(h).outcome == "completed"
    [memory] = MemoryStore(h.ws.memory_db()).recent(source="loop:t1", type="summary")
    assert "Call the API with [REDACTED]" in memory.content and secret not in memory.content
    assert (h.ws.memory_db()).read_bytes().count(secret.encode()) == 0
