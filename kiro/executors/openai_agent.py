"""The openai executor: a tool-calling agent on any OpenAI-compatible Chat Completions endpoint.

Each attempt at a step is a conversation of at most `llm.max_turns_per_step` model calls: the
system prompt, the step prompt, then turns in which the model calls tools (`kiro.executors.tools`). Only
the step tools end an attempt: `complete_step`, `fail_step`, `request_human`, or an interrupted
`sleep`. A reply without a tool call is "continue" and gets a nudge; prose that claims the work is
done completes nothing.

Long steps: when the conversation reaches `llm.wrap_up_threshold` of `llm.context_window_tokens`,
the model is asked to save its findings and summarise (seed 002); the summary goes to long-term
memory and the next model call starts a fresh conversation: system prompt, the step prompt (the
mission) and the summary.

Failures are sorted once, here. A tool error is the tool's result text (the model reads it and
goes on). A 429, 5xx, timeout or lost connection that outlasts the client's retries is one failed
attempt; the engine's backoff follows. A rejected key (401), a refused model (403) or an unknown
model or endpoint (404) cannot get better by retrying: `ExecutorError`, the run ends, and the
message says which variable, model or URL to fix.

The API key is read from the variable `llm.api_key_env` names when the executor is built, handed
to the client and nowhere else; everything written (transcript, memory, files, results, events)
goes through a `Redactor` that cuts it should it turn up.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import functools
import hashlib
import ipaddress
import json
import math
import os
import ssl
import time
from collections.abc import AsyncIterator, Coroutine, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

import aiohttp  # the openai client's transport (openai[aiohttp]: `SharedClient`)
import httpx2  # the interface of the openai client's HTTP client
import openai
from openai._vendor.httpx_aiohttp import AiohttpTransport  # the transport of openai.DefaultAioHttpClient
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolUnionParam

from kiro.errors import ExecutorError, contained
from kiro.executors import prompts
from kiro.executors.base import ExecutorBase, StepContext, StepResult
from kiro.executors.tools import Tool, ToolEnv, ToolError, ToolResult, toolset
from kiro.executors.tools.base import clip_output, execute
from kiro.executors.tools.paths import Confinement
from kiro.store.events import ContextWrapped, Event, ModelCalled, ToolCalled
from kiro.store.memory import MemoryStore
from kiro.store.redact import Redactor
from kiro.store.transcript import Transcript
from kiro.usage import Usage

if TYPE_CHECKING:
    from kiro.store.config import Config, LLMSettings
    from kiro.store.workspace import Workspace

DUMMY_KEY = "not-needed"  # local endpoints (llama.cpp, vLLM, Ollama) want some key but check none
WRAP_UP_TURNS = 3  # replies the model gets to save findings and summarise before the restart
CHARS_PER_TOKEN = 4  # the estimate when an endpoint reports no usage
EVENT_TEXT_LIMIT = 200
LONG_ARGUMENTS = frozenset({"content", "old", "new"})  # shown as a length in events, not the text

NUDGE = (
    "You replied without calling a tool. kiro counts the step as done only when you call "
    "`complete_step` (saying so in a reply completes nothing). Continue the current step with the tools; "
    "call `complete_step` when it is done, `fail_step` if it cannot be done, or `request_human` if only a "
    "person can unblock it."
)
NUDGE_CUT = (
    "Your reply was cut off (output length limit). Continue with a tool call; write large files in parts "
    "(write_file, then edit_file)."
)


def _is_local(url: str) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    if host == "localhost" or host.endswith((".localhost", ".local")):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.is_loopback or ip.is_private or ip.is_unspecified or ip.is_link_local


def _is_openai(url: str | None) -> bool:
    if url is None:
        return True
    host = (urlsplit(url).hostname or "").lower()
    return host == "openai.com" or host.endswith(".openai.com")


def _chars(messages: list[ChatCompletionMessageParam]) -> int:
    return sum(len(json.dumps(m, default=str)) for m in messages)


def _json(value: Any) -> bytes:
    """`value` as JSON the way the openai client encodes a request body (`openai._utils._json.openapi_dumps`)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


# A chat completion as the endpoint sent it (parsed JSON): read leniently, as the openai client's
# models read a reply (a field that is missing or of another type counts as absent).
Completion = dict[str, Any]


def _completion(data: Any) -> Completion:
    """The reply's JSON as a chat completion; ValueError when it is no JSON object (for a reply
    that is not JSON the openai client hands back its text)."""
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    return data


def _first_choice(response: Completion) -> dict[str, Any] | None:
    choices = response.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return None


def message_of(response: Completion) -> dict[str, Any]:
    choice = _first_choice(response)
    message = choice.get("message") if choice is not None else None
    return message if isinstance(message, dict) else {}


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def usage_of(response: Completion) -> tuple[int, int, int] | None:
    """(prompt, completion, total) tokens, or None when the reply has no usage."""
    u = response.get("usage")
    if not isinstance(u, dict):
        return None
    return _int(u.get("prompt_tokens")), _int(u.get("completion_tokens")), _int(u.get("total_tokens"))


def endpoint(llm: LLMSettings) -> tuple[str | None, str | None]:
    """(base URL, API key) of the `llm:` endpoint: `llm.base_url`, else $OPENAI_BASE_URL, else None
    (the OpenAI API); the key from the variable `llm.api_key_env` names, else a dummy for a local
    endpoint (they want some key but check none), else None. For the agent and the pre-check."""
    base_url = llm.base_url or os.environ.get("OPENAI_BASE_URL") or None
    api_key = os.environ.get(llm.api_key_env) or None
    if api_key is None and base_url is not None and _is_local(base_url):
        api_key = DUMMY_KEY
    return base_url, api_key


# The openai client waits out a Retry-After up to this long by itself (and retries); beyond it, it
# gives up at once and kiro sleeps (see `_Attempt.wait_for_server`).
try:
    from openai._constants import MAX_RETRY_AFTER_DELAY as CLIENT_RETRY_AFTER_LIMIT
except ImportError:  # pragma: no cover - older clients waited up to 60 s
    CLIENT_RETRY_AFTER_LIMIT = 60
# Loops a client serves. Its connection pool (aiohttp's connector) takes a kept connection off a queue per host
# and puts it back, whatever the connections it holds (httpx's own pool looked at each of them twice a request:
# one client a loop then, docs/guides/many-loops.md, session 32); a client is an aiohttp session, its connector and
# cookie jar, an httpx client and an openai client, ~10 KB: 8 loops a client hold ~10 MB less at 1,000 loops
# (docs/guides/step-cost.md, session 36). The TLS context is the process's one either way, and each loop's call
# in flight has its connection either way.
LOOPS_PER_CLIENT = 8
# How long a client keeps an idle connection for the next call (the client's default: 5 s). With many loops in
# one process a loop's next call comes long after its last (1,000 loops at 20 calls a second: a minute), and a
# connection that expired is a new TCP connect, and TLS handshake, for nearly every call. A connection the
# endpoint closed meanwhile is not used: the pool sees it end (readable at idle) and opens another. Two minutes stays
# under the idle timeouts of NATs and load balancers that drop a connection without a word (4 minutes and up;
# RFC 5382 asks for over two hours).
KEEPALIVE_SECONDS = 120.0
MAX_REPLY_BYTES = 64 * 1024 * 1024  # a reply body longer than this is refused, not read into memory
# The openai client's telemetry headers: which SDK, language, OS, machine and Python made the request (its
# `platform_headers` and `X-Stainless-Async`), for the vendor's statistics; nothing an endpoint needs to answer
# a call, and no other header names the same. Left out of every call (`SharedClient.chat`) with `openai.Omit()`,
# the client's public way to leave out a header it would send: every header of a request is normalised into httpx's
# `Headers` several times a call and handed on to aiohttp, ~0.29 M instructions of the client's ~2.9 M a call
# (docs/guides/step-cost.md, session 38). The client's own `x-stainless-retry-count` and `-read-timeout` stay
# (`_retries` reads the first).
TELEMETRY_HEADERS = ("X-Stainless-Lang", "X-Stainless-Package-Version", "X-Stainless-OS", "X-Stainless-Arch",
                     "X-Stainless-Runtime", "X-Stainless-Runtime-Version", "X-Stainless-Async")
_NO_TELEMETRY: dict[str, str | openai.Omit] = dict.fromkeys(TELEMETRY_HEADERS, openai.Omit())


class ReplyTooLarge(openai.APIConnectionError):
    """A reply body past MAX_REPLY_BYTES (announced or as it arrives). An OpenAIError, so the client
    passes it on as it is, without retrying the request."""


# What httpx's own transport raised where aiohttp raises the error on the left (the first that fits). The
# vendored transport's map calls every aiohttp connection error a connect timeout (refused, reset, closed
# without an answer, a certificate refused: the client then raised APITimeoutError, "timed out") and leaves a
# reply that is not HTTP unmapped (not an httpx error: the client neither retried nor wrapped it); httpx said
# ConnectError, ReadError and RemoteProtocolError, which the client retries and raises as APIConnectionError.
_AS_HTTPX: tuple[tuple[type[aiohttp.ClientError], type[httpx2.TransportError] | None], ...] = (
    (aiohttp.ClientHttpProxyError, None),  # the vendored map's (ProxyError), as are its timeouts
    (aiohttp.ClientProxyConnectionError, None),
    (aiohttp.ServerTimeoutError, None),
    (aiohttp.ClientConnectorError, httpx2.ConnectError),  # refused, a name not found, a certificate refused
    (aiohttp.ServerDisconnectedError, httpx2.RemoteProtocolError),  # closed without an answer
    (aiohttp.ClientResponseError, httpx2.RemoteProtocolError),  # a reply that is not HTTP, a bad chunk
    (aiohttp.ClientPayloadError, httpx2.RemoteProtocolError),  # a body cut short
    (aiohttp.ClientConnectionError, httpx2.ReadError),  # reset
)


def _raise_as_httpx(exc: httpx2.TransportError | aiohttp.ClientError) -> None:
    """Raise aiohttp's error as httpx's transport raised it (`_AS_HTTPX`), from the aiohttp error, whether the
    vendored transport mapped it (`exc` is its httpx error, from the aiohttp error) or passed it on as it was
    (`exc`); return when the vendored map has it right (the caller re-raises `exc`). Called from `except`
    blocks: a `try` costs nothing until something is raised, a `with` calls two methods every time."""
    cause = exc.__cause__ if isinstance(exc, httpx2.TransportError) else exc
    as_httpx = next((httpx for aio, httpx in _AS_HTTPX if isinstance(cause, aio)), None)
    if as_httpx is not None:
        raise as_httpx(str(cause)) from cause


class _Body(httpx2.AsyncByteStream):
    """A reply body as the transport reads it, its errors as httpx's (`_raise_as_httpx`), the read ended
    past MAX_REPLY_BYTES (bytes as they arrive, before any content decoding)."""

    def __init__(self, stream: httpx2.AsyncByteStream, request: httpx2.Request) -> None:
        self.stream = stream
        self.request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        try:
            async for chunk in self.stream:
                seen += len(chunk)
                if seen > MAX_REPLY_BYTES:
                    raise ReplyTooLarge(message=f"the reply went on past {MAX_REPLY_BYTES} bytes", request=self.request)
                yield chunk
        except (httpx2.TransportError, aiohttp.ClientError) as exc:
            _raise_as_httpx(exc)
            raise

    async def aclose(self) -> None:
        try:
            await self.stream.aclose()
        except (httpx2.TransportError, aiohttp.ClientError) as exc:
            _raise_as_httpx(exc)
            raise


class _Transport(AiohttpTransport):
    """openai's aiohttp transport, saying what httpx's said. Its errors are httpx's (`_raise_as_httpx`); a
    reply that announces more than MAX_REPLY_BYTES is refused at once, any other is read through `_Body`
    (neither httpx's client nor the transport limits a body); a URL with a user and password
    (`https://user:pw@host/v1`) goes without them, as httpx sends it: httpx's client made its
    `Authorization: Basic` header from them, and aiohttp refuses both (ValueError)."""

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if request.url.userinfo:
            request.url = request.url.copy_with(userinfo=b"")
        try:
            response = await super().handle_async_request(request)
        except (httpx2.TransportError, aiohttp.ClientError) as exc:
            _raise_as_httpx(exc)
            raise
        announced = response.headers.get("content-length", "")
        if announced.isdigit() and int(announced) > MAX_REPLY_BYTES:
            await response.aclose()
            raise ReplyTooLarge(message=f"the reply announces {int(announced)} bytes", request=request)
        response.stream = _Body(cast("httpx2.AsyncByteStream", response.stream), request)
        return response


class _HTTPClient(openai.DefaultAioHttpClient):
    """openai's aiohttp client (its defaults: timeout, limits, redirects) whose transports, to the endpoint
    and to each proxy of the environment, are `_Transport`s."""

    def _init_transport(self, *args: Any, **kwargs: Any) -> httpx2.AsyncBaseTransport:
        kwargs.pop("transport", None)  # SharedClient passes none
        return _Transport(*args, **kwargs)

    def _init_proxy_transport(self, proxy: httpx2.Proxy, *args: Any, **kwargs: Any) -> httpx2.AsyncBaseTransport:
        kwargs["proxy"] = proxy
        return _Transport(*args, **kwargs)


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """The TLS context the openai client builds for itself (the system's CAs, SSL_CERT_FILE and
    SSL_CERT_DIR honoured), built once for every client of the process: it costs ~20 ms a client.
    The aiohttp transport passes it to `httpx2.create_ssl_context(verify=...)`, which hands an
    SSLContext back as it is, and its connector uses that one."""
    return httpx2.create_ssl_context()


class SharedClient:
    """An `openai.AsyncOpenAI` client over openai's aiohttp transport (`openai.DefaultAioHttpClient`, `_HTTPClient`)
    for one endpoint, key and options, shared by up to LOOPS_PER_CLIENT loops (and pre-checks) of the
    process; every client uses the process's one TLS context (`_tls_context`). The client does the
    retries (`llm.max_retries`: its backoff, a Retry-After up to its limit, its retry count header); it sends
    its headers but the telemetry ones (TELEMETRY_HEADERS, `chat`).
    `close()` when done; the last user of a client closes it."""

    _open: dict[tuple[Any, ...], list[list[Any]]] = {}  # key -> [[client, users], ...]

    def __init__(self, base_url: str | None, api_key: str, llm: LLMSettings) -> None:
        self.key = (base_url, hashlib.sha256(api_key.encode()).hexdigest(), llm.max_retries,
                    llm.request_timeout_seconds)
        entries = self._open.setdefault(self.key, [])
        entry = next((e for e in entries if e[1] < LOOPS_PER_CLIENT), None)
        if entry is None:
            limits = openai.DEFAULT_CONNECTION_LIMITS
            http = _HTTPClient(verify=_tls_context(),
                               limits=httpx2.Limits(max_connections=limits.max_connections,
                                                    max_keepalive_connections=limits.max_keepalive_connections,
                                                    keepalive_expiry=KEEPALIVE_SECONDS))
            client = openai.AsyncOpenAI(api_key=api_key, base_url=base_url, max_retries=llm.max_retries,
                                        timeout=llm.request_timeout_seconds, http_client=http)
            entry = [client, 0]
            entries.append(entry)
        entry[1] += 1
        self.client: openai.AsyncOpenAI = entry[0]
        self.closed = False

    _encoded: dict[int, tuple[Any, bytes]] = {}  # id(tools) -> (tools, their JSON); the few lists of the process

    def encode(self, body: dict[str, Any]) -> bytes:
        """The body as the openai client sends a `body=` (compact JSON, UTF-8, no NaN: openai's
        `openapi_dumps`), the same bytes, its `tools` last (where `chat.completions.create` puts them,
        after the model and the messages). A `tools` list is encoded once while it is one of the last
        few the process sent (every loop with the same tools sends the same list, `_schemas`; never
        changed): ~0.66 M instructions of the client's ~5.5 M a call, at kiro's 14 tool schemas."""
        tools = body.get("tools")
        if tools is None:
            return _json(body)
        held = self._encoded.get(id(tools))
        if held is None or held[0] is not tools:
            if len(self._encoded) >= 8:
                del self._encoded[next(iter(self._encoded))]
            held = self._encoded[id(tools)] = (tools, _json(tools))
        rest = _json({key: value for key, value in body.items() if key != "tools"})
        return rest[:-1] + (b',"tools":' if len(rest) > 2 else b'"tools":') + held[1] + b"}"

    async def chat(self, body: dict[str, Any]) -> Completion:
        """POST /chat/completions: the reply's JSON. openai's exceptions, or ValueError for a reply
        that is not a JSON object.

        `client.post` (the openai client's documented way to call an endpoint directly) rather than
        `chat.completions.create`, and the reply as parsed JSON rather than response models: the same
        retries and errors, without the typed helper's walk over every message and tool schema and
        the models built from the reply on each call (about 1 ms of CPU per call, which adds up with
        many loops in one process). The body goes as `content=` (its bytes, `encode`): the bytes
        `body=` sends, without encoding the same tool schemas on every call. The headers are the client's
        but its telemetry (TELEMETRY_HEADERS)."""
        try:
            data = await self.client.post("/chat/completions", content=self.encode(body), cast_to=object,
                                          options={"headers": _NO_TELEMETRY})
        except RecursionError as exc:  # json.loads on a body nested deeper than Python's parser goes
            raise ValueError("its JSON is nested too deeply to read") from exc
        return _completion(data)

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        entries = self._open.get(self.key, [])
        for entry in entries:
            if entry[0] is self.client:
                entry[1] -= 1
                if entry[1] <= 0:
                    entries.remove(entry)
                    if not entries:
                        del self._open[self.key]
                    await self.client.close()
                return


class OpenAIExecutor(ExecutorBase):
    """SPEC §5 `openai`. Built once per loop; `run_step` once per attempt."""

    name = "openai"

    def __init__(self, config: Config, workspace: Workspace, task_id: str) -> None:
        self.config = config
        self.workspace = workspace
        self.task_id = task_id
        llm = config.llm
        self.base_url, api_key = endpoint(llm)
        self.endpoint = self.base_url or "the OpenAI API (https://api.openai.com/v1)"
        self.api_key_env = llm.api_key_env
        if api_key is None:
            if _is_openai(self.base_url):
                raise ExecutorError(
                    f"no API key for {self.endpoint}: set the environment variable {llm.api_key_env} "
                    f"(llm.api_key_env names it), or point llm.base_url at another endpoint")
            else:
                raise ExecutorError(
                    f"no API key for {self.endpoint}: set the environment variable {llm.api_key_env} "
                    f"(llm.api_key_env names it); if the endpoint needs no key, set it to any value")
        self.redact = Redactor.for_run(config)
        self.shared = SharedClient(self.base_url, api_key, llm)
        del api_key
        self.transcript = Transcript(workspace.transcript_file(task_id), task_id, self.redact)
        self.memory = MemoryStore(workspace.memory_db())
        self._tools: tuple[bool, dict[str, Tool[Any]], list[ChatCompletionToolUnionParam]] | None = None
        self._confinement: tuple[tuple[Any, ...], Confinement] | None = None
        self._stop: tuple[asyncio.Event, asyncio.Task[Any]] | None = None

    def stop_on(self, cancel: asyncio.Event) -> asyncio.Task[Any]:
        """A task that ends when `cancel` (the loop's) is set and then cuts the model call in flight
        (`_Attempt.unless_cancelled`): one for the loop's life in its event loop (ended by `aclose`), not one
        made and cancelled around every call."""
        held = self._stop
        if (held is None or held[0] is not cancel or held[1].get_loop() is not asyncio.get_running_loop()
                or held[1].cancelled() or (held[1].done() and not cancel.is_set())):
            self._end_stop()
            held = self._stop = (cancel, asyncio.ensure_future(cancel.wait()))
        return held[1]

    def _end_stop(self) -> None:
        held, self._stop = self._stop, None
        if held is not None and not held[1].get_loop().is_closed():  # (a closed one's tasks ended with it)
            held[1].cancel()

    def tools_for(self, config: Config) -> tuple[dict[str, Tool[Any]], list[ChatCompletionToolUnionParam]]:
        """The attempt's tools and their schemas: built once per loop (they depend only on whether
        the shell tool is on), not once per attempt."""
        key = config.tools.shell.enabled
        if self._tools is None or self._tools[0] != key:
            tools = toolset(config)
            self._tools = (key, tools, _schemas(tuple(tools.values())))
        return self._tools[1], self._tools[2]

    def confinement_for(self, ctx: StepContext) -> Confinement:
        """The file tools' confinement, resolved once per loop and again only when the project dir
        (a git worktree, SPEC §9) or the task file moves; every path the model gives is still
        resolved on its own at each call."""
        key = (ctx.project_dir, ctx.workspace.root, ctx.task_path, ctx.workspace.state_dir)
        if self._confinement is None or self._confinement[0] != key:
            self._confinement = (key, Confinement(ctx.project_dir, ctx.workspace.root, task_file=ctx.task_path,
                                                  state_dir=ctx.workspace.state_dir))
        return self._confinement[1]

    async def run_step(self, ctx: StepContext) -> StepResult:
        try:
            return await _Attempt(self, ctx).run()
        finally:
            await self.transcript.flush()

    async def aclose(self) -> None:
        self._end_stop()
        try:
            await self.transcript.flush()
        finally:
            await self.shared.close()

    async def create(self, messages: list[ChatCompletionMessageParam],
                     tools: list[ChatCompletionToolUnionParam] | None = None) -> Completion:
        """One call of the loop's model (`SharedClient.chat`)."""
        body: dict[str, Any] = {"model": self.config.llm.model, "messages": messages}
        if tools is not None:
            body["tools"] = tools
        return await self.shared.chat(body)

    async def summarize(self, system: str, prompt: str, *, iteration: int) -> tuple[str | None, Usage, str | None]:
        """One model call without tools: a scheduled run's forced summary (SPEC §11, kiro.core.scheduled).
        Returns the reply's text, the call's usage, and what went wrong when it failed."""
        llm = self.config.llm
        # the prompt quotes the task's title and steps: cut of secrets before it leaves, as every step's prompt is
        messages: list[ChatCompletionMessageParam] = [{"role": "system", "content": self.redact(system)},
                                                      {"role": "user", "content": self.redact(prompt)}]
        self.transcript.write("run_summary_request", iteration=iteration, attempt=0, model=llm.model,
                              messages=messages)
        try:
            response = await self.create(messages)
        except (openai.OpenAIError, ValueError) as exc:
            self.transcript.write("run_summary_response", iteration=iteration, attempt=0, error=str(exc))
            return None, Usage(), f"{type(exc).__name__}: {exc}"
        prompt_t, completion_t, total_t = usage_of(response) or (0, 0, 0)
        price = llm.prices.get(llm.model) or llm.prices.get(_str(response.get("model")))
        cost = (prompt_t * price.input_per_1m + completion_t * price.output_per_1m) / 1_000_000 if price else 0.0
        usage = Usage(prompt_tokens=prompt_t, completion_tokens=completion_t,
                           total_tokens=total_t or prompt_t + completion_t, api_calls=1, cost_usd=cost)
        text = self.redact(_str(message_of(response).get("content")))
        self.transcript.write("run_summary_response", iteration=iteration, attempt=0, content=text,
                              usage=vars(usage))
        return text, usage, None


@functools.lru_cache(maxsize=8)
def _schemas(tools: tuple[Tool[Any], ...]) -> list[ChatCompletionToolUnionParam]:
    """The tools' schemas as one list for every loop of the process with these tools: its JSON is then
    encoded once for all of them (`SharedClient.encode`). Never changed."""
    return cast(list[ChatCompletionToolUnionParam], [t.schema() for t in tools])


@dataclass
class _Call:
    """One tool call from a response, as kiro saw it."""

    id: str
    name: str
    arguments: str
    kind: str = "function"


@dataclass
class _Reply:
    """A response as kiro read it once (`_Attempt.call_model`): its text and tool calls, redacted, and its first
    choice; the transcript's record, the event and the turn (`_Attempt.handle`) use the same."""

    text: str
    calls: list[_Call]
    choice: dict[str, Any] | None


def _retries(exc: openai.OpenAIError) -> str:
    """How many times the client retried before it gave up, as the last request says (the openai
    client numbers its tries in `x-stainless-retry-count`): "0 retries", "1 retry", "2 retries"."""
    request = None
    response = getattr(exc, "response", None)
    with contextlib.suppress(RuntimeError, AttributeError):  # httpx: a response built without its request
        request = response.request if response is not None else getattr(exc, "request", None)
    try:
        n = int(request.headers.get("x-stainless-retry-count", "0")) if request is not None else 0
    except ValueError:
        n = 0
    return f"{n} {'retry' if n == 1 else 'retries'}"


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """The wait a reply asks for, in seconds: `retry-after-ms`, else `Retry-After` as seconds or as
    an HTTP date; None when absent or unreadable. Not a number (NaN) is unreadable; a value too large
    for a float, "inf" or a date beyond what the platform can represent is infinite (the caller caps it)."""
    ms = headers.get("retry-after-ms")
    with contextlib.suppress(ValueError):
        if ms is not None and not math.isnan(float(ms)):
            return float(ms) / 1000
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError, IndexError):
            return None
        except OverflowError:
            return math.inf
        return (when - datetime.now(when.tzinfo or UTC)).total_seconds()
    return None if math.isnan(seconds) else seconds


def _server_wait(exc: openai.OpenAIError, limit: float) -> float | None:
    """Seconds a rate-limited or overloaded endpoint asks us to wait when that is longer than the
    openai client waits on its own (it then gives up at once), at most `limit`
    (`llm.max_retry_after_seconds`); None otherwise."""
    if not isinstance(exc, openai.APIStatusError) or exc.status_code not in (429, 503):
        return None
    if exc.code == "insufficient_quota" or "insufficient_quota" in str(getattr(exc, "message", "")):
        return None  # waiting will not help: ExecutorError in failure()
    seconds = _retry_after(exc.response.headers)
    if seconds is None or seconds <= CLIENT_RETRY_AFTER_LIMIT:
        return None
    return min(seconds, limit)


def _cut(call: asyncio.Future[Any], _stop: asyncio.Future[Any]) -> None:
    call.cancel()


def _memory_source(ctx: StepContext) -> str:
    """What the agent saves is tagged `loop:<task_id>`; in a stateful scheduled task
    `schedule:<task_id>`, so that later runs are given it (SPEC §11, kiro.core.scheduled)."""
    sched = getattr(ctx.state, "schedule", None)
    if sched is not None and sched.stateful:
        return f"schedule:{ctx.task_id}"
    return f"loop:{ctx.task_id}"


class _Attempt:
    """One attempt at one step: the conversation(s), the usage, the transcript records."""

    def __init__(self, executor: OpenAIExecutor, ctx: StepContext) -> None:
        # The loop's redactor is the one in force (it also knows configured secrets and URL credentials).
        executor.redact = ctx.redact | executor.redact
        executor.transcript.redact = executor.redact
        self.ex = executor
        self.ctx = ctx
        self.llm: LLMSettings = ctx.config.llm
        self.usage = Usage()
        self.tools, self.schemas = executor.tools_for(ctx.config)
        self.env = ToolEnv(
            ctx=ctx,
            confinement=executor.confinement_for(ctx),
            memory=executor.memory,
            redact=executor.redact,
            memory_source=_memory_source(ctx),
            api_key_env=executor.api_key_env,
            deadline=time.monotonic() + ctx.timeout_seconds,
        )
        self.messages: list[ChatCompletionMessageParam] = []
        self.logged = 0  # messages already in the transcript
        self.turns = 0
        self.restarts = 0
        self.counted_tokens: int | None = None  # prompt+completion tokens of the last response
        self.counted_upto = 0  # messages covered by counted_tokens
        self.wrap_turns_left: int | None = None  # not None while wrapping up
        self.wrap_saved_from = 0  # env.memory_saved index when the wrap-up began
        self.restart_summary: str | None = None  # set when the next call must start afresh
        self.last_text = ""
        self.calls_made: list[str] = []  # "write_file src/x.py" lines, for a summary of last resort
        self.timer: asyncio.Timeout | None = None  # the step timeout; a server-directed wait extends it

    # -- records ---------------------------------------------------------------------------

    def record(self, kind: str, **fields: Any) -> None:
        self.ex.transcript.write(kind, iteration=self.ctx.iteration, attempt=self.ctx.attempt,
                                 step_id=self.ctx.step.id, **fields)

    def emit(self, event: Event) -> None:
        self.ctx.emit(event)

    # -- the attempt -----------------------------------------------------------------------

    async def run(self) -> StepResult:
        ctx = self.ctx
        self.record("attempt_started", model=self.llm.model, endpoint=self.ex.endpoint,
                    tools=list(self.tools), step_title=ctx.step.title or ctx.step.text,
                    timeout_seconds=ctx.timeout_seconds)
        timer = self.timer = asyncio.timeout(ctx.timeout_seconds)
        try:
            async with timer:
                result = await self.converse()
        except TimeoutError:
            if not timer.expired():
                raise
            result = StepResult("failed", error=(
                f"the step ran out of time after {ctx.timeout_seconds:g} s (step timeout) "
                f"in turn {self.turns}"))
        except ExecutorError as exc:
            self.record("attempt_finished", outcome="error", error=str(exc), usage=vars(self.usage))
            raise
        result.usage = self.usage
        result.summary = self.ex.redact(result.summary)
        result.error = self.ex.redact(result.error) if result.error else result.error
        result.question = self.ex.redact(result.question) if result.question else result.question
        self.record("attempt_finished", outcome=result.outcome, summary=result.summary, error=result.error,
                    question=result.question, stop_reason=result.stop_reason, turns=self.turns,
                    restarts=self.restarts, usage=vars(self.usage))
        return result

    def interrupted(self, reason: str) -> StepResult:
        return StepResult("interrupted", stop_reason=reason, summary=_clip(self.last_text, 2000),
                          error=f"interrupted ({reason}) in turn {self.turns}")

    def start_conversation(self, user_message: str) -> None:
        self.messages = [
            {"role": "system", "content": self.ctx.system_prompt},
            {"role": "user", "content": user_message},
        ]
        self.logged = 0
        self.counted_tokens = None
        self.counted_upto = 0

    async def converse(self) -> StepResult:
        ctx = self.ctx
        self.start_conversation(ctx.prompt)
        limit = self.llm.max_turns_per_step
        while self.turns < limit:
            if ctx.cancel.is_set():
                return self.interrupted("cancelled")
            reason = await ctx.guard.before_model_call()
            if reason:
                return self.interrupted(reason)
            if self.restart_summary is not None:
                self.restart()
            elif self.wrap_turns_left is None and self.should_wrap_up():
                self.start_wrap_up()
            if self.turns and ctx.messages is not None:
                arrived = ctx.messages()  # a message queued during this attempt: in the very next request
                if arrived:
                    self.messages.append({"role": "user", "content": arrived})
            response = await self.call_model()
            if isinstance(response, StepResult):
                return response
            self.turns += 1
            ending = await self.handle(response)
            if ending is not None:
                return ending
        last = f"; the last reply was: {_clip(self.last_text, 300)!r}" if self.last_text.strip() else ""
        return StepResult("failed", summary=_clip(self.last_text, 2000), error=(
            f"{self.turns} turns used without complete_step (llm.max_turns_per_step is {limit}){last}"))

    # -- one model call --------------------------------------------------------------------

    async def call_model(self) -> _Reply | StepResult:
        new = self.messages[self.logged:]
        self.record("request", turn=self.turns + 1, model=self.llm.model,
                    messages=[m for m in new if m.get("role") != "tool"],
                    tool_results=sum(1 for m in new if m.get("role") == "tool"))
        self.logged = len(self.messages)
        self.ex.transcript.kick()  # written while the model thinks
        started = time.monotonic()
        while True:
            try:
                response = await self.unless_cancelled(self.ex.create(self.messages, self.schemas))
            except ValueError as exc:  # a 200 whose body is not JSON (a proxy's page, an empty or cut body)
                return self.failure(exc, time.monotonic() - started)
            except openai.OpenAIError as exc:
                wait = _server_wait(exc, self.llm.max_retry_after_seconds)
                if wait is None or not isinstance(exc, openai.APIStatusError):
                    return self.failure(exc, time.monotonic() - started)
                reason = await self.wait_for_server(exc, wait)
                if reason:
                    return self.interrupted(reason)
                started = time.monotonic()
                continue
            if response is None:
                self.record("response", turn=self.turns + 1, error="cancelled while waiting for the model")
                return self.interrupted("cancelled")
            break
        seconds = time.monotonic() - started
        usage = self.count(response)
        reply = _Reply(self.text_of(response), self.tool_calls(response), _first_choice(response))
        finish = reply.choice.get("finish_reason") if reply.choice is not None else None
        self.record("response", turn=self.turns + 1, content=reply.text,
                    tool_calls=[vars(c) for c in reply.calls], finish_reason=finish,
                    usage=vars(usage), seconds=round(seconds, 3))
        self.emit(ModelCalled(turn=self.turns + 1, model=self.llm.model, seconds=round(seconds, 3),
                              prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
                              tool_calls=[c.name for c in reply.calls]))
        return reply

    async def unless_cancelled(self, create: Coroutine[Any, Any, Completion]) -> Completion | None:
        """The model call's response; None when the loop's cancel was set first: the call is then cancelled,
        and has unwound when this returns. The loop's one task waiting on the cancel (`OpenAIExecutor.stop_on`)
        cuts the call (a done callback), in place of an `asyncio.wait` on the two each call."""
        call = asyncio.ensure_future(create)
        stop = self.ex.stop_on(self.ctx.cancel)
        cut = functools.partial(_cut, call)
        stop.add_done_callback(cut)
        try:
            return await call
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():  # the attempt's own (its timeout): the call unwound with it
                raise
            return None
        except Exception:
            if stop.done():  # cut by the cancel, whatever the cut call raised
                return None
            raise
        finally:
            stop.remove_done_callback(cut)

    def count(self, response: Completion) -> Usage:
        """Add this response's usage to the attempt's, price it, tell the guard."""
        u = usage_of(response)
        prompt, completion, total = u or (0, 0, 0)
        total = total or prompt + completion
        price = self.llm.prices.get(self.llm.model) or self.llm.prices.get(_str(response.get("model")))
        cost = 0.0
        if price is not None:
            cost = (prompt * price.input_per_1m + completion * price.output_per_1m) / 1_000_000
        usage = Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=total, api_calls=1,
                           cost_usd=cost)
        self.usage.add(usage)
        self.ctx.guard.after_model_call(usage)
        if u is not None and (prompt or completion):
            self.counted_tokens = prompt + completion
        else:
            self.counted_tokens = None
        return usage

    def tool_calls(self, response: Completion) -> list[_Call]:
        """The response's tool calls, arguments redacted: a secret the model echoes is cut before it
        can reach a file, the transcript or the next request."""
        listed = message_of(response).get("tool_calls")
        calls = []
        for i, tc in enumerate(listed if isinstance(listed, list) else []):
            if not isinstance(tc, dict):
                continue
            call_id = _str(tc.get("id")) or f"call_{self.turns + 1}_{i}"  # the turn this response answers
            kind = _str(tc.get("type")) or "function"
            if kind == "function":
                fn = tc.get("function")
                fn = fn if isinstance(fn, dict) else {}
                calls.append(_Call(call_id, _str(fn.get("name")), self.ex.redact(_str(fn.get("arguments")))))
            else:
                custom = tc.get("custom")
                name = _str(custom.get("name")) if isinstance(custom, dict) else ""
                calls.append(_Call(call_id, name or "?", "", kind))
        return calls

    def text_of(self, response: Completion) -> str:
        return self.ex.redact(_str(message_of(response).get("content")))

    async def wait_for_server(self, exc: openai.APIStatusError, seconds: float) -> str | None:
        """The endpoint said when to come back, later than the client waits by itself (a long
        Retry-After): sleep like a budget wait (status `sleeping`, `sleep_until` in the state, a
        stop hook ends it at once) instead of failing the attempt and burning retries. The wait does
        not count against the step timeout. Returns a stop reason if the wait was cut short."""
        detail = self.ex.redact(_clip(getattr(exc, "message", None) or str(exc), 200))
        self.record("response", turn=self.turns + 1, error=f"{type(exc).__name__}: {detail}",
                    retry_after_seconds=seconds)
        asked = _retry_after(exc.response.headers)
        if asked is not None and asked > seconds:
            message = (f"{self.ex.endpoint} asks to wait {asked:.3g} s (HTTP {exc.status_code} with Retry-After); "
                       f"sleeping {seconds:.0f} s, the most llm.max_retry_after_seconds allows, then trying again")
        else:
            message = (f"{self.ex.endpoint} asks to wait {seconds:.0f} s (HTTP {exc.status_code} with "
                       f"Retry-After); sleeping until then")
        began = time.monotonic()
        deadline = self.timer.when() if self.timer is not None else None
        if self.timer is not None and deadline is not None:  # the step timeout stands still meanwhile
            self.timer.reschedule(deadline + seconds + 1)
        try:
            reason = await self.ctx.guard.wait("retry_after", seconds, message, figure=exc.status_code)
        finally:
            waited = time.monotonic() - began
            if self.timer is not None and deadline is not None:
                self.timer.reschedule(deadline + waited)
        if self.env.deadline is not None:
            self.env.deadline += waited
        return reason

    def failure(self, exc: openai.OpenAIError | ValueError, seconds: float) -> StepResult:
        """A failed call as a failed attempt, or ExecutorError when retrying cannot help."""
        llm = self.llm
        where = self.ex.endpoint
        detail = self.ex.redact(_clip(getattr(exc, "message", None) or str(exc), 400))
        self.record("response", turn=self.turns + 1, error=f"{type(exc).__name__}: {detail}",
                    seconds=round(seconds, 3))
        if isinstance(exc, openai.AuthenticationError):
            raise ExecutorError(
                f"{where} rejected the API key (HTTP 401): put a valid key in the environment variable "
                f"{self.ex.api_key_env} (llm.api_key_env); the endpoint said: {detail}")
        if isinstance(exc, openai.PermissionDeniedError):
            raise ExecutorError(
                f"{where} refused access to model {llm.model!r} (HTTP 403): use a key in "
                f"{self.ex.api_key_env} that may use this model, or choose another with llm.model / --model; "
                f"the endpoint said: {detail}")
        if isinstance(exc, openai.NotFoundError):
            raise ExecutorError(
                f"{where} answered 404 Not Found for model {llm.model!r}: set llm.model (or --model, or the "
                f"task's `model:`) to a model this endpoint serves, or correct llm.base_url (it usually ends "
                f"in /v1); the endpoint said: {detail}")
        if isinstance(exc, openai.RateLimitError):
            if exc.code == "insufficient_quota" or "insufficient_quota" in detail:
                raise ExecutorError(f"{where} says the quota of the key in {self.ex.api_key_env} is used up "
                                    f"(HTTP 429 insufficient_quota): check the plan and billing; {detail}")
            after = exc.response.headers.get("retry-after")
            wait = f" (Retry-After: {_clip(after, 40)})" if after else ""
            error = (f"rate limited by {where}: HTTP 429 after {_retries(exc)}{wait}; "
                     f"the endpoint said: {detail}")
        elif isinstance(exc, openai.APITimeoutError):
            error = (f"the model request to {where} timed out after {llm.request_timeout_seconds:g} s "
                     f"(llm.request_timeout_seconds) and {_retries(exc)}")
        elif isinstance(exc, ReplyTooLarge):
            error = (f"{where} sent a reply larger than kiro reads ({MAX_REPLY_BYTES // 2**20} MiB): "
                     f"{exc.message}")
        elif isinstance(exc, openai.APIConnectionError):
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, httpx2.TransportError) and isinstance(cause.__cause__, aiohttp.ClientError):
                cause = cause.__cause__  # what aiohttp said, under httpx's name (`_raise_as_httpx`)
            why = f": {type(cause).__name__}: {cause}" if cause is not None else ""
            error = f"could not connect to {where} after {_retries(exc)}{self.ex.redact(why)}"
        elif isinstance(exc, openai.APIStatusError):
            error = (f"HTTP {exc.status_code} from {where} after {_retries(exc)}; "
                     f"the endpoint said: {detail}")
        elif isinstance(exc, ValueError):
            error = f"{where} answered with a body that is not a JSON chat completion ({detail})"
        else:
            error = f"the model call failed: {type(exc).__name__}: {detail}"
        return StepResult("failed", error=error, summary=_clip(self.last_text, 2000))

    # -- one response ----------------------------------------------------------------------

    async def handle(self, reply: _Reply) -> StepResult | None:
        """Append the assistant message, run its tool calls in order, and decide what comes next."""
        choice, text, calls = reply.choice, reply.text, reply.calls
        if text.strip():
            self.last_text = text
        assistant: dict[str, Any] = {"role": "assistant", "content": text or ("" if not calls else None)}
        if calls:
            assistant["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in calls]
        self.messages.append(cast(ChatCompletionMessageParam, assistant))
        self.counted_upto = len(self.messages)
        self.logged = len(self.messages)  # the response record holds it

        for index, call in enumerate(calls):
            ending = await self.run_tool(call)
            if ending is not None:
                for skipped in calls[index + 1:]:
                    self.record("tool", tool=skipped.name, call_id=skipped.id, skipped=True,
                                result="not run: the attempt had ended")
                return ending

        if self.wrap_turns_left is not None:
            self.wrap_turns_left -= 1
            if not calls:
                self.finish_wrap_up(text)
            elif self.wrap_turns_left <= 0:
                self.finish_wrap_up(None)
            return None
        if not calls:
            cut = choice is not None and choice.get("finish_reason") == "length"
            self.messages.append({"role": "user", "content": NUDGE_CUT if cut else NUDGE})
        return None

    async def run_tool(self, call: _Call) -> StepResult | None:
        ctx = self.ctx
        started = time.monotonic()
        tool = self.tools.get(call.name) if call.kind == "function" else None
        shown: Any = self.ex.redact(_clip(call.arguments, EVENT_TEXT_LIMIT))
        args_dict: dict[str, Any] | None = None
        if call.kind != "function":
            result = ToolResult.error(f"only function tools are supported, not {call.kind!r}")
        elif tool is None:
            result = ToolResult.error(self.unknown_tool(call.name))
        else:
            try:
                args = tool.parse(call.arguments)
            except ToolError as exc:
                result = ToolResult.error(str(exc))
            else:
                args_dict = args.model_dump()
                shown = self.event_arguments(args_dict)
                reason = await ctx.guard.before_tool_call(call.name, args_dict)
                if reason is None and ctx.cancel.is_set():
                    reason = "cancelled"
                if reason:
                    self.record("tool", tool=call.name, call_id=call.id, arguments=args_dict,
                                result=f"not run: {reason}")
                    return self.interrupted(reason)
                result = await execute(tool, args, self.env)
                ctx.guard.after_tool_call(call.name, args_dict, None if result.ok else result.text)
        text = clip_output(self.ex.redact(result.text))
        self.messages.append({"role": "tool", "tool_call_id": call.id, "content": text})
        seconds = round(time.monotonic() - started, 3)
        self.record("tool", tool=call.name, call_id=call.id,
                    arguments=args_dict if args_dict is not None else call.arguments,
                    ok=result.ok, result=text, seconds=seconds)
        called = ToolCalled(tool=call.name, arguments=shown, ok=result.ok, seconds=seconds)
        if not result.ok:
            called.error = _clip(text, EVENT_TEXT_LIMIT)  # written only when set
        self.emit(called)
        self.calls_made.append(f"{call.name} {self.brief(args_dict)}".strip())
        if result.ending is None:
            return None
        e = result.ending
        if e.outcome == "completed":
            return StepResult("completed", summary=e.summary)
        if e.outcome == "failed":
            return StepResult("failed", error=e.error or "the agent reported failure",
                              summary=_clip(self.last_text, 2000))
        if e.outcome == "request_human":
            return StepResult("request_human", question=e.question, summary=_clip(self.last_text, 2000))
        return self.interrupted(e.stop_reason or "interrupted")

    def unknown_tool(self, name: str) -> str:
        if name == "run_command":
            return "run_command is disabled (tools.shell.enabled is false): use the file tools"
        return f"there is no tool {name!r}; the tools are: {', '.join(self.tools)}"

    def event_arguments(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """Arguments for the event log: long texts as their length, everything short and redacted."""
        out: dict[str, Any] = {}
        for key, value in args.items():
            if isinstance(value, str):
                out[key] = (f"<{len(value)} characters>" if key in LONG_ARGUMENTS
                            else self.ex.redact(_clip(value, EVENT_TEXT_LIMIT)))
            elif isinstance(value, list):
                out[key] = [self.ex.redact(_clip(str(v), EVENT_TEXT_LIMIT)) for v in value[:10]]
            else:
                out[key] = value
        return out

    @staticmethod
    def brief(args: Mapping[str, Any] | None) -> str:
        if not args:
            return ""
        for key in ("path", "command", "query", "pattern", "summary", "error", "question"):
            value = args.get(key)
            if isinstance(value, str):
                return _clip(value, 80)
        return ""

    # -- context budget (seed 002) ---------------------------------------------------------

    def context_tokens(self) -> int:
        """The conversation's size: the last response's prompt+completion tokens plus an estimate
        for what was appended since; all estimated (chars/4) when the endpoint reports no usage."""
        if self.counted_tokens is not None:
            return self.counted_tokens + _chars(self.messages[self.counted_upto:]) // CHARS_PER_TOKEN
        schema_chars = len(json.dumps(self.schemas))
        return (_chars(self.messages) + schema_chars) // CHARS_PER_TOKEN

    def wrap_limit(self) -> int:
        return int(self.llm.wrap_up_threshold * self.llm.context_window_tokens)

    def should_wrap_up(self) -> bool:
        # A fresh conversation (system + one user message) is never wrapped: there is nothing to save.
        return len(self.messages) > 2 and self.context_tokens() >= self.wrap_limit()

    def start_wrap_up(self) -> None:
        tokens = self.context_tokens()
        turns_left = min(WRAP_UP_TURNS, self.llm.max_turns_per_step - self.turns)
        text = prompts.template("wrap_up.md", self.ctx.workspace).safe_substitute(
            tokens=tokens, window=self.llm.context_window_tokens, turns=turns_left,
            threshold=f"{self.llm.wrap_up_threshold:.0%}")
        self.messages.append({"role": "user", "content": text})
        self.wrap_turns_left = WRAP_UP_TURNS
        self.wrap_saved_from = len(self.env.memory_saved)
        self.record("wrap_up", tokens=tokens, threshold=self.wrap_limit(),
                    window=self.llm.context_window_tokens)
        self.emit(ContextWrapped(tokens=tokens, threshold=self.wrap_limit(), window=self.llm.context_window_tokens,
                                 turn=self.turns + 1, restart=self.restarts + 1))

    def finish_wrap_up(self, text: str | None) -> None:
        """Store the summary (the model's text, else what it saved, else kiro's list of its tool
        calls) and arrange for the next model call to start afresh."""
        summary = (text or "").strip()
        source = "text"
        if not summary:
            saved = self.env.memory_saved[self.wrap_saved_from:]
            summary = "\n\n".join(saved).strip()
            source = "memory_save"
        if not summary:
            recent = "\n".join(f"- {c}" for c in self.calls_made[-30:]) or "- (no tool calls)"
            last = f"\nLast reply: {_clip(self.last_text, 1000)}" if self.last_text.strip() else ""
            summary = f"(The model wrote no summary. Tool calls so far in this step:)\n{recent}{last}"
            source = "kiro"
        summary = self.ex.redact(_clip(summary, 8000))
        step = self.ctx.step
        content = self.ex.redact(f"Step {step.id} ({step.title or step.text}), iteration {self.ctx.iteration}, "
                                 f"attempt {self.ctx.attempt}, context restart {self.restarts + 1}:\n{summary}")
        with contained():  # losing the memory row must not lose the step
            self.ex.memory.save(content, "summary", 0.6, self.env.memory_source)
        self.record("summary", summary=summary, source=source, restart=self.restarts + 1)
        self.restart_summary = summary
        self.wrap_turns_left = None

    def restart(self) -> None:
        summary = self.restart_summary or ""
        self.restarts += 1
        text = prompts.template("restart.md", self.ctx.workspace).safe_substitute(
            mission=self.ctx.prompt, summary=summary, restart=self.restarts)
        self.start_conversation(text)
        self.restart_summary = None
        self.record("restart", restart=self.restarts)
