"""kiro as the client of an agent that speaks the Agent Client Protocol (ACP: JSON-RPC 2.0 over the
agent's stdin and stdout, by Zed), through the PyPI SDK `agent-client-protocol` (`acp`).

One attempt is one session: the agent is started as the command executor starts an agent CLI (its
process group, the step's environment and box: kiro.processes.spawn), kiro sends `initialize`
(offering `fs`: the agent reads and writes files through kiro), `session/new` with the project as its
cwd, and `session/prompt` with the step's prompt. What comes back while the turn runs:

- every `session/update` becomes kiro's events as it arrives: a tool call (its kind, title, status
  and locations) a `tool_called`, the agent's plan a `plan_updated`; its messages are in the attempt
  log, which keeps the whole JSON-RPC conversation (each line tagged `"from": "agent"` or `"kiro"`);
- `session/request_permission` is answered by the rules of kiro's own agent's tools (kiro.executors.tools):
  reads and edits inside the project allowed; kiro's control folders, `.git/`, the workspace's records
  and anything outside the project refused, the task file allowed (its other lines are put back
  afterwards, as for any agent CLI: kiro.executors.control); a command by `tools.shell` (enabled, on the
  allow-list, no code runner unless `trust_agent_code`); any other tool refused. Each answer is a
  `permission_answered` event. kiro never picks an "always" option, so it is asked every time;
- `fs/read_text_file` and `fs/write_text_file` go through the same rules (Confinement, which also
  refuses symbolic links out and hard links to control files); a write has each secret kiro knows
  that the file did not already hold cut (`KiroClient.write_text_file` says why reads are not cut).
  `terminal` is not offered: an agent runs its commands itself, inside the step's box, after kiro
  allowed them (an agent may also run some without asking: Claude Code and Gemini CLI run read-only
  commands such as `ls` on their own say).

kiro chooses the session's permission mode before the prompt (`hold_mode`): the agent's most asking mode
(Preset.acp_modes), set with `session/set_mode` when the session opened in another, and held: a
`current_mode_update` (or an update of its `mode` config option) to a mode that does not ask ends the
attempt, failed closed (a usage error: the run ends), and an agent that offers none is not prompted.

The turn ends when `session/prompt` answers (its stop reason), the agent exits, or kiro ends it. An
agent whose only way to take a refusal is to end its turn (codex-acp: `cancel`, stop reason
`cancelled`) is prompted again in the same session with kiro's reasons (GO_ON_TURNS at most), so the
attempt goes on as it does with an agent that takes the refusal and carries on. What ends it early is
the watchdog of every step's process (kiro.processes.spawn.Watchdog, as for an agent CLI): a stop (a
stop hook, the task file moved, `stop --force`, a signal), the step timeout, the idle timeout (no
message and no stderr for `step_idle_timeout_seconds`; not while kiro decides a permission), a mode
that does not ask, or a guardrail that ended the loop at a tool call. kiro then sends `session/cancel`
and gives the agent CANCEL_GRACE_SECONDS to end its turn. Then its stdin is closed (an ACP agent
exits on that: EXIT_GRACE_SECONDS) and its process group is ended as any step's is. The outcome is
a ProcessResult like an agent CLI's, whose `output` is the transcript: the command executor reads it
through the preset (kiro.executors.agents.acp) for usage, failures and the summary, and checks the
box, puts back kiro's files and writes the attempt log as for any agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import acp
from acp.schema import (
    AgentMessageChunk,
    AgentPlanUpdate,
    AllowedOutcome,
    ClientCapabilities,
    ConfigOptionUpdate,
    CurrentModeUpdate,
    DeniedOutcome,
    FileSystemCapabilities,
    Implementation,
    NewSessionResponse,
    PermissionOption,
    ReadTextFileResponse,
    RequestPermissionResponse,
    SessionConfigOptionSelect,
    SessionConfigSelectGroup,
    TextContentBlock,
    ToolCallProgress,
    ToolCallStart,
    ToolCallUpdate,
    WriteTextFileResponse,
)

from kiro.errors import UserError
from kiro.executors.agents import TOOL_ARGUMENT_CHARS
from kiro.executors.base import StepContext
from kiro.executors.tools.errors import ToolError
from kiro.executors.tools.paths import Confinement
from kiro.executors.tools.shell import permitted
from kiro.fs import safeio
from kiro.fs.atomic import atomic_write
from kiro.processes.sandbox import Box
from kiro.processes.spawn import ProcessResult, Watchdog, end_process, spawn
from kiro.store.events import PermissionAnswered, PlanUpdated, ToolCalled
from kiro.store.redact import Redactor

# an agent whose only refusal ends its turn (codex-acp's `cancel`) is prompted again, with kiro's reasons,
# in the same session, at most this many times a turn
GO_ON_TURNS = 10
AUTH_REQUIRED = -32000  # ACP's error code for "Authentication required"
CANCEL_GRACE_SECONDS = 1.0  # after session/cancel, the turn has this long to end before its process is ended
EXIT_GRACE_SECONDS = 2.0  # after the turn, the agent has this long to exit on its closed stdin before SIGTERM
LINE_LIMIT = 50 * 1024 * 1024  # of one JSON-RPC message from the agent (a whole file's content)
READ_LIMIT = 10 * 1024 * 1024  # of a file the agent reads through kiro
READ_KINDS = frozenset({"read", "search", "think", "fetch", "switch_mode"})
WRITE_KINDS = frozenset({"edit", "delete", "move"})
PATH_KEYS = ("file_path", "path", "filePath", "notebook_path", "absolute_path", "dir_path", "directory")


class _Transcript:
    """The attempt's JSON-RPC messages, one a line, tagged with who sent it; the tail kept."""

    def __init__(self, limit: int, heard: Callable[[], None]) -> None:
        self.limit = limit
        self.data = bytearray()
        self.heard = heard  # the agent said something (its watchdog's idle timer)

    def observe(self, event: Any) -> None:
        incoming = event.direction.value == "incoming"
        if incoming:
            self.heard()
        line = json.dumps({"from": "agent" if incoming else "kiro", **event.message}, ensure_ascii=False)
        self.data += line.encode("utf-8", "replace") + b"\n"
        if len(self.data) > self.limit * 2:
            del self.data[: len(self.data) - self.limit]

    def note(self, key: str, text: str) -> None:
        """kiro's own line in the transcript (`{"from": "kiro", key: text}`): the mode it set, or why it
        refused the agent (kiro.executors.agents.acp reads that as the attempt's failure)."""
        self.data += json.dumps({"from": "kiro", key: text}, ensure_ascii=False).encode("utf-8") + b"\n"

    def text(self) -> str:
        return bytes(self.data[-self.limit:]).decode("utf-8", "replace")


_turn: contextvars.ContextVar[_Transcript | None] = contextvars.ContextVar("kiro_acp_turn", default=None)
_ACP_DIR = str(Path(acp.__file__).parent) + os.sep


class _LibraryErrors(logging.Filter):
    """The acp library logs what fails on its side of a connection on Python's root logger, traceback and all
    (a write to an agent that closed its stdin: "Send loop failed ... ConnectionResetError"), which reaches the
    person's terminal. kiro says what went wrong with the agent in its own words; the library's record becomes
    one line of the turn's transcript (its log), where the connection it belongs to is known."""

    def filter(self, record: logging.LogRecord) -> bool:
        transcript = _turn.get()
        if transcript is None or not record.pathname.startswith(_ACP_DIR):
            return True
        exc = record.exc_info[1] if record.exc_info else None
        transcript.note("connection", record.getMessage() + (f": {type(exc).__name__}: {exc}" if exc else ""))
        return False


@functools.cache
def _quiet_library() -> None:
    logging.getLogger().addFilter(_LibraryErrors())  # acp logs through the root logger itself


class Refused(Exception):
    """kiro will not go on with this agent (a mode that does not ask kiro): the attempt fails closed."""


class Policy:
    """kiro's answers to an ACP agent: its own agent's path rules and shell rules."""

    def __init__(self, ctx: StepContext) -> None:
        self.ctx = ctx
        self.confinement = Confinement(ctx.project_dir, ctx.workspace.root, state_dir=ctx.workspace.state_dir)
        self.task_file = Path(ctx.task_path).resolve()

    def path(self, raw: str, *, write: bool) -> Path:
        """The real path the agent means, or a ToolError. The task file is the agent's to check its box in."""
        with contextlib.suppress(OSError, ValueError):
            given = Path(raw)
            if (given if given.is_absolute() else self.confinement.root / given).resolve() == self.task_file:
                return self.task_file
        real = self.confinement.resolve(raw, write=write)
        if write:  # what Confinement.write_bytes refuses, also for an agent that writes the file itself
            with contextlib.suppress(OSError):
                links = os.lstat(real).st_nlink
                if links > 1 and real.is_file():
                    raise ToolError(f"{raw!r} has {links} hard links: it may be the same file as one outside the "
                                    f"project, so kiro does not let it be written")
        return real

    def task_bytes(self, folder: int | None = None) -> bytes | None:
        """The task file's bytes (None when it is missing), read through a descriptor of its folder reached
        without following a symlink, the file itself not followed either: a swap of the file or a folder
        on its way for a symlink after the path was checked is refused, not read."""
        if folder is None:
            with safeio.folder_fd(self.task_file.parent) as fd:
                return self.task_bytes(fd)
        try:
            return safeio.read_bytes(self.task_file.name, limit=READ_LIMIT, name=self.task_file.name, dir_fd=folder,
                                     follow_symlinks=False)
        except FileNotFoundError:
            return None

    def write_task(self, new: Callable[[str], str]) -> None:
        """Write the task file, `new` given its text before, by name in a descriptor of its folder (the
        same walk as `task_bytes`): whatever was swapped in after the check, the write lands there only."""
        with safeio.folder_fd(self.task_file.parent) as folder:
            before = (self.task_bytes(folder) or b"").decode("utf-8", "replace")
            atomic_write(self.task_file.name, new(before).encode("utf-8"), fsync=False, dir_fd=folder)

    def tool(self, call: ToolCallUpdate) -> str | None:
        """Why the tool call is refused, or None when it may run."""
        kind = call.kind or "other"
        paths = call_paths(call)
        write = kind in WRITE_KINDS
        if kind == "execute":
            command = _raw(call).get("command")
            if not isinstance(command, str):
                return "kiro cannot tell which command this runs"
            try:
                permitted(command, self.ctx.config.tools.shell)
            except ToolError as exc:
                return str(exc)
            return None
        if kind not in READ_KINDS and not write:
            return f"kiro does not let an agent use a tool of kind {kind!r} (it cannot tell what it touches)"
        for raw in paths:
            try:
                self.path(raw, write=write)
            except ToolError as exc:
                return str(exc)
        return None


class KiroClient:
    """The ACP client side of one attempt: session updates into events, permission requests and file
    access answered by `Policy`."""

    def __init__(self, ctx: StepContext, policy: Policy, *, empty_when_missing: bool = False,
                 modes: Sequence[str] = (), watchdog: Watchdog | None = None) -> None:
        self.ctx = ctx
        self.policy = policy
        self.watchdog = watchdog or Watchdog()  # the turn's: what kiro finds here that ends the turn ends it
        self.empty_when_missing = empty_when_missing  # a missing file reads as "" (AcpPreset.empty_when_missing)
        self.modes = tuple(modes)  # the agent's modes in which it asks kiro (Preset.acp_modes), most asking first
        self.session_id: str | None = None
        self.mode: str | None = None  # the session's mode, as the agent last said
        self.held = False  # kiro has set the mode: from here on, a mode it does not accept ends the attempt
        self.left_mode: str | None = None  # why kiro ends the attempt: the agent went to a mode that does not ask
        self.refused: list[str] = []  # this turn's refusals (title: why), for an agent whose refusal ends its turn
        self.shown: dict[str, tuple[str | None, str]] = {}  # tool call id -> (status, title) last shown
        self.calls: dict[str, ToolCallUpdate | ToolCallStart] = {}
        self.stopped: str | None = None  # a guardrail ended the loop at a tool call: the turn is cancelled

    # -- what the agent reports ------------------------------------------------------------

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        if isinstance(update, CurrentModeUpdate):
            self.mode_said(session_id, update.current_mode_id)
        elif isinstance(update, ConfigOptionUpdate):
            for option in update.config_options:
                if _is_mode_option(option):
                    self.mode_said(session_id, str(option.current_value))
        elif isinstance(update, ToolCallStart | ToolCallProgress):
            self._tool(update)
        elif isinstance(update, AgentPlanUpdate):
            entries = [f"[{e.status}] {self.ctx.redact.text(e.content)}"[:300] for e in update.entries]
            self.ctx.emit(PlanUpdated(entries=entries))
        elif isinstance(update, AgentMessageChunk):
            return  # in the transcript (the attempt log); the summary is read from there

    def mode_said(self, session_id: str, mode: str) -> None:
        """The agent says its session is now in `mode` (`current_mode_update`, or its `mode` config option):
        one kiro does not accept ends the attempt (the turn loop cancels it), and every request after it is
        refused. A mode the agent leaves kiro's for stays a refusal: it is not taken back by a later one."""
        if self.session_id is not None and session_id != self.session_id:
            return
        self.mode = mode
        if self.held and mode not in self.modes and self.left_mode is None:
            self.left_mode = (f"the agent switched its session to mode {mode!r} during the turn, in which it does "
                              f"not ask kiro before each edit and command (kiro holds it in "
                              f"{' or '.join(map(repr, self.modes))}): kiro ended the attempt")
            self.watchdog.end("left_mode")

    def _tool(self, update: ToolCallStart | ToolCallProgress | ToolCallUpdate) -> None:
        """One event per tool call once it says what it does, and one when it ends."""
        known = self.calls.get(update.tool_call_id)
        merged = _merge(known, update)
        self.calls[update.tool_call_id] = merged
        described = bool(merged.locations or _raw(merged) or merged.status in ("in_progress", "completed", "failed"))
        if not described:
            return
        before = self.shown.get(update.tool_call_id)
        status = merged.status or "pending"
        ending = status in ("completed", "failed")
        if before is not None and (not ending or before[0] == status):
            return
        self.shown[update.tool_call_id] = (status, merged.title or "")
        where = ", ".join(self._shown_path(p) for p in call_paths(merged))
        if merged.kind == "execute" and isinstance(_raw(merged).get("command"), str):
            where = str(_raw(merged)["command"])
        title = merged.title or merged.kind or "tool"
        argument = "" if where and where in title else self.ctx.redact.text(" ".join(where.split()))
        if len(argument) > TOOL_ARGUMENT_CHARS:
            argument = argument[: TOOL_ARGUMENT_CHARS - 1] + "…"
        self.ctx.emit(ToolCalled(tool=self.ctx.redact.text(title)[:120],
                                 arguments=argument, kind=merged.kind, status=status, ok=status != "failed"))

    def _shown_path(self, raw: str) -> str:
        root = f"{str(self.ctx.project_dir).rstrip('/')}/"
        return raw[len(root):] if raw.startswith(root) else raw

    # -- what the agent asks ---------------------------------------------------------------

    async def request_permission(self, options: list[PermissionOption], session_id: str, tool_call: ToolCallUpdate,
                                 **kwargs: Any) -> RequestPermissionResponse:
        merged = _merge(self.calls.get(tool_call.tool_call_id), tool_call)
        self.calls[tool_call.tool_call_id] = merged
        self._tool(merged)
        why = self.left_mode or self.policy.tool(merged)
        if why is None:
            with self.watchdog.hold():  # kiro decides (a guardrail may wait): the agent's silence is kiro's
                stop = await self.ctx.guard.before_tool_call(merged.title or merged.kind or "tool", _raw(merged))
            if stop is not None:
                self.stopped = stop
                self.watchdog.end("cancelled")
                why = f"the loop is stopping ({stop})"
        # never an "always" option that lets the agent skip kiro next time (a stricter "reject always" is fine)
        option = next((o for o in options if o.kind == "allow_once"), None) if why is None else None
        if why is None and option is None:
            why = "the agent offered only to allow this tool for good; kiro answers each call on its own"
        if why is not None:
            option = next((o for kind in ("reject_once", "reject_always") for o in options if o.kind == kind), None)
        title = self.ctx.redact.text(merged.title or merged.kind or "tool")[:120]
        if why is not None:
            self.refused.append(f"{title}: {self.ctx.redact.text(why)}")
        self.ctx.emit(PermissionAnswered(tool=title, kind=merged.kind, allowed=why is None,
                                         paths=[self.ctx.redact.text(self._shown_path(p)) for p in call_paths(merged)],
                                         reason=self.ctx.redact.text(why) if why else None))
        if option is None:
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=option.option_id))

    async def read_text_file(self, path: str, session_id: str, limit: int | None = None, line: int | None = None,
                             **kwargs: Any) -> ReadTextFileResponse:
        """The file as it is (see `write_text_file` for why a read is not redacted)."""
        real = self._fs("fs/read_text_file", path, write=False)
        if not real.exists():
            if self.empty_when_missing:
                return ReadTextFileResponse(content="")
            raise acp.RequestError.resource_not_found(path)
        try:
            if real == self.policy.task_file:
                data = self.policy.task_bytes() or b""
            else:
                data, _ = self.policy.confinement.read_bytes(real, READ_LIMIT)
        except (ToolError, OSError, UserError) as exc:
            raise _refusal(str(exc)) from None
        text = data.decode("utf-8", "replace")
        if line is not None or limit is not None:
            lines = text.splitlines(keepends=True)
            start = max((line or 1) - 1, 0)
            text = "".join(lines[start: start + limit if limit is not None else None])
        return ReadTextFileResponse(content=text)

    async def write_text_file(self, content: str, path: str, session_id: str, **kwargs: Any) -> WriteTextFileResponse:
        """The whole new content, with each secret kiro knows that the file did not hold before cut. An agent
        edits by reading a file and writing all of it back: a read cut of its secrets, or a write cut of
        those the file held, would replace a project's own password by `[REDACTED]` at its next edit of
        another line (kiro's own edit_file cuts only the text it adds, for the same reason). So reads are
        served as they are; Gemini CLI's read_file reads files itself anyway, not through kiro."""
        real = self._fs("fs/write_text_file", path, write=True)
        try:
            if real == self.policy.task_file:
                self.policy.write_task(lambda before: _added_secrets_cut(self.ctx.redact, content, before))
            else:
                before = real.read_text(encoding="utf-8", errors="replace") if real.is_file() else ""
                data = _added_secrets_cut(self.ctx.redact, content, before).encode("utf-8")
                self.policy.confinement.write_bytes(real, data)
        except (ToolError, OSError, UserError) as exc:
            raise _refusal(str(exc)) from None
        return WriteTextFileResponse()

    def _fs(self, tool: str, path: str, *, write: bool) -> Path:
        """The real path of a file the agent reads or writes through kiro; a refusal (an event, and the
        agent's error) when the rules say no. Writes are events either way; reads only when refused."""
        shown = self.ctx.redact.text(self._shown_path(path))
        try:
            if self.left_mode is not None:
                raise ToolError(self.left_mode)
            real = self.policy.path(path, write=write)
        except ToolError as exc:
            self.ctx.emit(PermissionAnswered(tool=tool, paths=[shown], allowed=False,
                                             reason=self.ctx.redact.text(str(exc))))
            raise _refusal(str(exc)) from None
        if write:
            self.ctx.emit(PermissionAnswered(tool=tool, paths=[shown], allowed=True))
        return real


def _added_secrets_cut(redact: Redactor, content: str, before: str) -> str:
    """`content` as is when every secret in it was in `before` already, else with its secrets cut."""
    if not redact.contains_secret(content):
        return content
    known = redact.secrets | redact.literal_forms
    if not any(secret in content and secret not in before for secret in known):
        return content
    return redact.text(content)


def offered_modes(new: NewSessionResponse) -> tuple[list[str], str | None]:
    """The modes `session/new` offers and the one the session opened in: its `modes`, else its config
    option of category `mode` (ACP's newer form); none when it has neither."""
    if new.modes is not None:
        return [mode.id for mode in new.modes.available_modes], new.modes.current_mode_id
    for option in new.config_options or []:
        if _is_mode_option(option) and isinstance(option, SessionConfigOptionSelect):
            values: list[str] = []
            for item in option.options:
                grouped = isinstance(item, SessionConfigSelectGroup)
                values += [o.value for o in item.options] if grouped else [item.value]
            return values, str(option.current_value)
    return [], None


def _is_mode_option(option: Any) -> bool:
    return getattr(option, "category", None) == "mode" or getattr(option, "id", None) == "mode"


def _refusal(why: str) -> acp.RequestError:
    return acp.RequestError(-32000, why[:500])


def _raw(call: ToolCallUpdate | ToolCallStart) -> dict[str, Any]:
    raw = call.raw_input
    return raw if isinstance(raw, dict) else {}


def call_paths(call: ToolCallUpdate | ToolCallStart) -> list[str]:
    """Every path a tool call names: its locations, the paths in its input and in its diffs."""
    found: list[str] = [loc.path for loc in call.locations or []]
    raw = _raw(call)
    found += [raw[k] for k in PATH_KEYS if isinstance(raw.get(k), str)]
    for item in call.content or []:
        path = getattr(item, "path", None)
        if isinstance(path, str):
            found.append(path)
    return list(dict.fromkeys(found))


def _merge(known: ToolCallUpdate | ToolCallStart | None,
           update: ToolCallStart | ToolCallProgress | ToolCallUpdate) -> ToolCallUpdate:
    """A tool call as reported so far: each update's fields replace the earlier ones."""
    fields = {} if known is None else known.model_dump(exclude_none=True)
    fields.update(update.model_dump(exclude_none=True, exclude={"session_update"}))
    fields.pop("session_update", None)
    return ToolCallUpdate.model_validate(fields)


async def hold_mode(conn: Any, client: KiroClient, new: NewSessionResponse, transcript: _Transcript) -> None:
    """Set the session's mode to the most asking one of `client.modes` it offers (`session/set_mode`, when
    it opened in another: claude-agent-acp 0.101 opens in `auto`, in which edits are not asked), or raise
    Refused when it offers none of them. An agent that offers no modes at all has none to leave: it runs
    as it is. From here on the mode is held: `KiroClient.mode_said` ends the attempt when it changes."""
    offered, current = offered_modes(new)
    client.session_id = new.session_id
    if not offered or not client.modes:
        transcript.note("mode", "the agent offers no modes" if not offered else f"mode {current} (the agent's own)")
        return
    chosen = next((mode for mode in client.modes if mode in offered), None)
    if chosen is None:
        raise Refused(f"the agent offers the modes {', '.join(offered)}, none of which asks kiro before each edit "
                      f"and command ({' or '.join(client.modes)}): kiro does not run it")
    client.mode = None
    if current != chosen:
        try:
            await conn.set_session_mode(session_id=new.session_id, mode_id=chosen)
        except acp.RequestError as exc:
            raise Refused(f"the agent refused kiro's session/set_mode to {chosen!r} ({exc}): kiro does not run it "
                          f"in the mode it opened in, {current!r}") from None
    if client.mode is not None and client.mode != chosen:  # it said it went to another (claude's auto fallback)
        raise Refused(f"asked for mode {chosen!r}, the agent went to {client.mode!r}: kiro does not run it")
    client.mode, client.held = chosen, True
    transcript.note("mode", f"mode {chosen}" + (f" (kiro set it; the session opened in {current})"
                                                 if current != chosen else ""))


def _version() -> str:
    try:
        return metadata.version("kiro-loop")
    except metadata.PackageNotFoundError:
        return "0"


async def run_turn(argv: list[str], *, ctx: StepContext, env: dict[str, str], box: Box | None, prompt: str,
                   idle_timeout: float | None, output_limit: int, empty_when_missing: bool = False,
                   auth_method: str | None = None, exits_on_eof: bool = True,
                   modes: Sequence[str] = ()) -> ProcessResult:
    """One attempt's session with the ACP agent `argv` (see the module's account): its transcript as a
    ProcessResult, ended (cancelled, timed out, idle) the way run_process ends an agent CLI.
    `auth_method`: the auth method (Preset.acp_auth) kiro authenticates with when `session/new` says
    authentication is required (the agent's own login, when it has one, is used first). `exits_on_eof`:
    False for an agent that does not exit when its stdin is closed (codex-acp): SIGTERM at once. `modes`:
    the agent's modes in which it asks kiro (Preset.acp_modes), most asking first: kiro sets the first
    one the session offers and holds it (`hold_mode`)."""
    started = time.monotonic()
    child = await spawn(argv, cwd=ctx.project_dir, env=env, box=box, stdin=asyncio.subprocess.PIPE,
                        stderr=asyncio.subprocess.PIPE, limit=LINE_LIMIT)
    proc = child.proc
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    dog = Watchdog(timeout=max(ctx.timeout_seconds - (time.monotonic() - started), 0.0), cancel=ctx.cancel,
                   idle_timeout=idle_timeout, stop=ctx.guard.interruption)
    transcript = _Transcript(output_limit, dog.heard)
    _quiet_library()
    turn_token = _turn.set(transcript)  # seen by the connection's tasks, made below in this context (`_LibraryErrors`)
    errors = bytearray()
    client = KiroClient(ctx, Policy(ctx), empty_when_missing=empty_when_missing, modes=modes, watchdog=dog)
    conn = acp.connect_to_agent(client, proc.stdin, proc.stdout, observers=[transcript.observe])  # type: ignore[arg-type]
    session: list[str] = []

    async def pump_stderr(stream: asyncio.StreamReader) -> None:
        while data := await stream.read(65536):
            dog.heard()
            errors.extend(data)
            if len(errors) > output_limit * 2:
                del errors[: len(errors) - output_limit]

    async def turn() -> Any:
        init = await conn.initialize(protocol_version=acp.PROTOCOL_VERSION, client_info=Implementation(
            name="kiro", title="kiro", version=_version()), client_capabilities=ClientCapabilities(
            fs=FileSystemCapabilities(read_text_file=True, write_text_file=True), terminal=False))
        try:
            new = await conn.new_session(cwd=str(ctx.project_dir), mcp_servers=[])
        except acp.RequestError as exc:
            offered = {method.id for method in init.auth_methods or []}
            if exc.code != AUTH_REQUIRED or auth_method not in offered:
                raise
            await conn.authenticate(method_id=auth_method)
            new = await conn.new_session(cwd=str(ctx.project_dir), mcp_servers=[])
        session.append(new.session_id)
        await hold_mode(conn, client, new, transcript)
        result = await conn.prompt(session_id=new.session_id, prompt=[TextContentBlock(type="text", text=prompt)])
        for _ in range(GO_ON_TURNS):  # an agent that ended its turn at kiro's refusal (codex-acp) is told why
            if result.stop_reason != "cancelled" or not client.refused or ended is not None or client.stopped \
                    or client.left_mode:
                break
            said = "\n".join(f"- {line}" for line in client.refused)
            client.refused.clear()
            again = f"kiro refused:\n{said}\nDo the step without it, then check its box as asked."
            result = await conn.prompt(session_id=new.session_id, prompt=[TextContentBlock(type="text", text=again)])
        return result

    work = asyncio.ensure_future(turn())
    exited = asyncio.ensure_future(proc.wait())
    stderr_pump = asyncio.ensure_future(pump_stderr(proc.stderr))
    ended: str | None = None  # left_mode | cancelled | timed_out | idle
    try:
        ended = await dog.watch(work, exited)
        if ended is not None and session and not work.done():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.cancel(session_id=session[0]), CANCEL_GRACE_SECONDS)
            await asyncio.wait({work, exited}, timeout=CANCEL_GRACE_SECONDS, return_when=asyncio.FIRST_COMPLETED)
    finally:
        with contextlib.suppress(Exception):
            await conn.close()
        # its stdin closed, an ACP agent exits (Gemini CLI ignores SIGTERM in ACP mode: 3 s, then SIGKILL)
        with contextlib.suppress(Exception):
            proc.stdin.close()
        if exits_on_eof:
            await asyncio.wait({exited}, timeout=EXIT_GRACE_SECONDS)
        await end_process(proc)
        child.release()
        for task in (work, exited, stderr_pump):
            if not task.done():
                task.cancel()
        await asyncio.gather(work, exited, stderr_pump, return_exceptions=True)
        _turn.reset(turn_token)  # the step's task holds no finished turn's transcript
    refused = work.exception() if work.done() and not work.cancelled() else None
    if isinstance(refused, Refused):
        transcript.note("refused", str(refused))
    elif client.left_mode is not None:  # also when the turn ended before kiro's poll saw it
        transcript.note("refused", client.left_mode)
    if work.done() and not work.cancelled() and work.exception() is None and ended is None \
            and client.left_mode is None:
        returncode: int | None = 0
    else:
        returncode = proc.returncode
    stderr = bytes(errors[-output_limit:]).decode("utf-8", "replace")
    return ProcessResult(returncode, transcript.text(), time.monotonic() - started, timed_out=ended == "timed_out",
                         cancelled=ended == "cancelled", stderr=stderr, idle_timed_out=ended == "idle")
