"""A fake Anthropic Messages API (`POST /v1/messages`), streaming (SSE) and not, for Claude Code.

    with FakeAnthropic(brain) as fake:        # brain(request) -> Turn | HttpError
        env["ANTHROPIC_BASE_URL"] = fake.url

A `Turn` is the assistant message: text and tool_use blocks, the token usage to report, and the
model name (Claude Code prices tokens by it). `tool_results(body)` counts the tool results the
conversation holds so far, so a brain can play a fixed sequence: Read the file, Edit it, say done.
Streams are written the way the API does: message_start, content_block_start / _delta / _stop per
block (text_delta, input_json_delta), message_delta with stop_reason and output tokens, message_stop.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.fakes import FakeServer, Handler, HttpError, Recorded

MODEL = "claude-sonnet-4-5-20250929"


@dataclass
class Turn:
    blocks: list[dict[str, Any]] = field(default_factory=list)
    input_tokens: int = 100
    output_tokens: int = 20
    model: str = MODEL


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


_ids = itertools.count(1)


def tool_use(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": f"toolu_{next(_ids):04d}", "name": name, "input": args}


def error(status: int, message: str, kind: str | None = None) -> HttpError:
    kind = kind or {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    429: "rate_limit_error", 529: "overloaded_error"}.get(status, "api_error")
    return HttpError(status, {"type": "error", "error": {"type": kind, "message": message}})


def messages(body: Any) -> list[dict[str, Any]]:
    return list(body.get("messages", [])) if isinstance(body, dict) else []


def tool_results(body: Any) -> list[dict[str, Any]]:
    found = []
    for m in messages(body):
        content = m.get("content")
        if m.get("role") == "user" and isinstance(content, list):
            found += [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
    return found


def first_user_text(body: Any) -> str:
    for m in messages(body):
        if m.get("role") != "user":
            continue
        content = m.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "\n".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""


def is_agent_call(body: Any) -> bool:
    """The agent's main conversation (it offers tools), not a side call such as a title."""
    return isinstance(body, dict) and any(t.get("name") == "Edit" for t in body.get("tools", []) or [])


class FakeAnthropic(FakeServer):
    name = "fake-anthropic"

    def __init__(self, brain: Callable[[Recorded], Turn | HttpError]) -> None:
        super().__init__()
        self.brain = brain

    def agent_calls(self) -> list[Recorded]:
        return [r for r in self.posts("/v1/messages") if is_agent_call(r.body)]

    def answer(self, handler: Handler, rec: Recorded) -> None:
        path = rec.path.split("?")[0]
        if path.endswith("/count_tokens"):
            handler.send_json(200, {"input_tokens": 100})
            return
        if not path.endswith("/v1/messages"):
            handler.send_json(404, {"type": "error", "error": {"type": "not_found_error", "message": path}})
            return
        reply = self.brain(rec)
        if isinstance(reply, HttpError):
            handler.send_http_error(reply, {"request-id": "req_fake"})
            return
        stop = "tool_use" if any(b["type"] == "tool_use" for b in reply.blocks) else "end_turn"
        msg_id = f"msg_{next(_ids):06d}"
        usage = {"input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens,
                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        if not (isinstance(rec.body, dict) and rec.body.get("stream")):
            handler.send_json(200, {"id": msg_id, "type": "message", "role": "assistant", "model": reply.model,
                                    "content": reply.blocks, "stop_reason": stop, "stop_sequence": None,
                                    "usage": usage})
            return
        events: list[tuple[str | None, dict[str, Any]]] = [
            ("message_start", {"type": "message_start", "message": {
                "id": msg_id, "type": "message", "role": "assistant", "model": reply.model, "content": [],
                "stop_reason": None, "stop_sequence": None, "usage": {**usage, "output_tokens": 1}}}),
            ("ping", {"type": "ping"}),
        ]
        for i, block in enumerate(reply.blocks):
            if block["type"] == "text":
                events.append(("content_block_start", {"type": "content_block_start", "index": i,
                                                       "content_block": {"type": "text", "text": ""}}))
                events.append(("content_block_delta", {"type": "content_block_delta", "index": i,
                                                       "delta": {"type": "text_delta", "text": block["text"]}}))
            else:
                events.append(("content_block_start", {"type": "content_block_start", "index": i, "content_block": {
                    "type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}}))
                events.append(("content_block_delta", {"type": "content_block_delta", "index": i, "delta": {
                    "type": "input_json_delta", "partial_json": json.dumps(block["input"])}}))
            events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
        events.append(("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                         "usage": {"output_tokens": reply.output_tokens}}))
        events.append(("message_stop", {"type": "message_stop"}))
        handler.send_sse(events)


def usage_limit(resets_at: float, claim: str = "five_hour") -> HttpError:
    """What the API answers a subscription (a Claude login, CLAUDE_CODE_OAUTH_TOKEN) whose usage window
    is used up: HTTP 429 `rate_limit_error` with the unified rate-limit headers Claude Code reads
    (`anthropic-ratelimit-unified-status: rejected`, `-reset` in seconds since 1970, `-representative-claim`
    the window) and a Retry-After."""
    wait = max(int(resets_at - time.time()), 0)
    return HttpError(429, {"type": "error", "error": {
        "type": "rate_limit_error", "message": "This request would exceed your account's rate limit. "
                                              "Please try again later."}},
                     {"anthropic-ratelimit-unified-status": "rejected",
                      "anthropic-ratelimit-unified-reset": str(int(resets_at)),
                      "anthropic-ratelimit-unified-representative-claim": claim,
                      "anthropic-ratelimit-unified-5h-status": "rejected",
                      "anthropic-ratelimit-unified-5h-reset": str(int(resets_at)),
                      "anthropic-ratelimit-unified-5h-utilization": "1.0",
                      "retry-after": str(wait)})
