"""A fake OpenAI Chat Completions API (`POST /v1/chat/completions`, SSE streaming and not), for the
agent CLIs that speak it: aider (through litellm) and opencode (through the AI SDK's
openai-compatible provider).

    with FakeChat(brain) as fake:             # brain(request) -> Reply | HttpError
        env["OPENAI_API_BASE"] = fake.url + "/v1"

A `Reply` is the assistant message: text and/or tool calls, and the usage to report. Streams are
written the way the API does: `chat.completion.chunk` objects, the role and content in pieces, each
tool call's id and name first and its arguments in pieces after, a last chunk with the
finish_reason, a usage chunk (empty `choices`) only when the request asked for it
(`stream_options.include_usage`), then `data: [DONE]`. `GET /v1/models` lists the fake model.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.fakes import FakeServer, Handler, HttpError, Recorded

MODEL = "fake-coder"

_ids = itertools.count(1)


@dataclass
class Reply:
    content: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # {"name": ..., "arguments": {...}}
    prompt_tokens: int = 100
    completion_tokens: int = 20


def tool_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"call_{next(_ids):05d}", "name": name, "arguments": arguments}


def error(status: int, message: str, code: str | None = None, retry_after_ms: int | None = None) -> HttpError:
    """The API's error answer; with `retry_after_ms`, the retry hints a rate limit sends: `retry-after-ms`
    (read first by the OpenAI SDKs, litellm's inside aider included, and by opencode) and `retry-after` in
    whole seconds, rounded up."""
    kind = {400: "invalid_request_error", 401: "invalid_request_error", 403: "permission_error",
            404: "invalid_request_error", 429: "rate_limit_error"}.get(status, "server_error")
    if code is None:
        code = {401: "invalid_api_key", 429: "rate_limit_exceeded"}.get(status)
    headers = {} if retry_after_ms is None else {"retry-after-ms": str(retry_after_ms),
                                                 "retry-after": str(-(-retry_after_ms // 1000))}
    return HttpError(status, {"error": {"message": message, "type": kind, "param": None, "code": code}}, headers)


def messages(body: Any) -> list[dict[str, Any]]:
    return list(body.get("messages", [])) if isinstance(body, dict) else []


def text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def user_text(body: Any) -> str:
    """Everything the user (and the system) said, joined: where kiro's prompt is."""
    return "\n".join(text_of(m) for m in messages(body) if m.get("role") in ("user", "system"))


def system_text(body: Any) -> str:
    return "\n".join(text_of(m) for m in messages(body) if m.get("role") == "system")


def tool_results(body: Any) -> list[dict[str, Any]]:
    return [m for m in messages(body) if m.get("role") == "tool"]


def tool_names(body: Any) -> list[str]:
    tools = body.get("tools") if isinstance(body, dict) else None
    return [t.get("function", {}).get("name", "") for t in tools or [] if isinstance(t, dict)]


class FakeChat(FakeServer):
    name = "fake-chat"

    def __init__(self, brain: Callable[[Recorded], Reply | HttpError]) -> None:
        super().__init__()
        self.brain = brain

    def calls(self) -> list[Recorded]:
        return self.posts("/chat/completions")

    def answer(self, handler: Handler, rec: Recorded) -> None:
        path = rec.path.split("?")[0].rstrip("/")
        if not path.endswith("/chat/completions"):
            handler.send_json(404, {"error": {"message": f"no {path} here", "type": "invalid_request_error",
                                              "param": None, "code": None}})
            return
        reply = self.brain(rec)
        if isinstance(reply, HttpError):
            handler.send_http_error(reply)
            return
        body = rec.body if isinstance(rec.body, dict) else {}
        model = str(body.get("model") or MODEL)
        n = next(_ids)
        usage = {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
                 "total_tokens": reply.prompt_tokens + reply.completion_tokens}
        finish = "tool_calls" if reply.tool_calls else "stop"
        calls = [{"id": c["id"], "type": "function",
                  "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}} for c in reply.tool_calls]
        if not body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": reply.content}
            if calls:
                message["tool_calls"] = calls
            handler.send_json(200, {"id": f"chatcmpl-{n}", "object": "chat.completion", "created": int(time.time()),
                                    "model": model, "choices": [{"index": 0, "message": message,
                                                                 "finish_reason": finish, "logprobs": None}],
                                    "usage": usage})
            return

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            return {"id": f"chatcmpl-{n}", "object": "chat.completion.chunk", "created": int(time.time()),
                    "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason,
                                                 "logprobs": None}]}

        events: list[tuple[str | None, dict[str, Any]]] = [(None, chunk({"role": "assistant", "content": ""}))]
        text = reply.content or ""
        for i in range(0, len(text), 40):
            events.append((None, chunk({"content": text[i:i + 40]})))
        for index, c in enumerate(calls):
            events.append((None, chunk({"tool_calls": [{"index": index, "id": c["id"], "type": "function",
                                                        "function": {"name": c["function"]["name"],
                                                                     "arguments": ""}}]})))
            args = c["function"]["arguments"]
            for i in range(0, len(args), 30):
                events.append((None, chunk({"tool_calls": [{"index": index,
                                                            "function": {"arguments": args[i:i + 30]}}]})))
        events.append((None, chunk({}, finish)))
        options = body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            events.append((None, {"id": f"chatcmpl-{n}", "object": "chat.completion.chunk",
                                  "created": int(time.time()), "model": model, "choices": [], "usage": usage}))
        handler.send_sse(events)
        handler.wfile.write(b"data: [DONE]\n\n")  # the stream's end marker, after the last chunk
        handler.wfile.flush()
