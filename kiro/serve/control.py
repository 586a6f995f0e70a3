"""Steering loops from the server, the way a person does from a terminal: the core API's start, stop,
resume and tell (kiro.core.api), as `kiro loop start --detach`, `kiro loop stop`, `kiro loop resume --detach`
and `kiro loop tell` call them (a loop started here runs in a process of its own, an ordinary background
loop that outlives the server).

Used by both the REST routes and the WebSocket; errors are `ControlError(http_status, message)`: what the API
refuses is a `KiroError` carrying its one line, answered 409 when the loop's state refuses it (`Conflict`), 404
when it names nothing (`TaskNotFound`), else 400.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kiro.core import api
from kiro.errors import Conflict, KiroError, TaskNotFound
from kiro.store import kirospec
from kiro.store.statestore import StateStore
from kiro.store.workspace import Workspace, check_task_id

T = TypeVar("T")
MESSAGE_MAX_CHARS = 20_000
TASK_PATH_MAX_CHARS = 1024


class ControlError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def refused(exc: KiroError) -> ControlError:
    """What the core API refused, as the HTTP answer that says so."""
    status = 409 if isinstance(exc, Conflict) else 404 if isinstance(exc, TaskNotFound) else 400
    return ControlError(status, str(exc))


class Said(api.Front):
    """The lines a command says as it runs, kept for the answer (a warning first)."""

    child_flags = ("--quiet",)

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.warnings: list[str] = []

    def warning(self, text: str) -> None:
        self.warnings.append(text)

    def line(self, text: str) -> None:
        self.lines.append(text)


class StartOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task_id: str | None = None
    max_iterations: int | None = Field(default=None, ge=1)
    failure_threshold: int | None = Field(default=None, ge=1)
    timeout: float | None = Field(default=None, gt=0)
    executor: str | None = None
    model: str | None = None


class StopOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    force: bool = False
    reason: str = Field(default="stopped from kiro serve", max_length=2000)


def _first_error(exc: ValidationError, where: str) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(x) for x in err["loc"]) or where
    return f"{where}.{loc}: {err['msg']}" if loc != where else f"{where}: {err['msg']}"


class Controller:
    def __init__(self, ws: Workspace, store: StateStore, token: str) -> None:
        from kiro.store.redact import Redactor

        self.ws = ws
        self.store = store
        self.token = Redactor([token])  # the server's token, from $KIRO_SERVE_TOKEN or generated: never stored

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A core API command, in a thread (it waits for a loop it starts to take its lock)."""
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except KiroError as exc:
            raise refused(exc) from None

    def task_id(self, raw: Any) -> str:
        if not isinstance(raw, str) or not raw:
            raise ControlError(400, "task_id: a loop's task id (a string) is required")
        try:
            check_task_id(raw)
        except KiroError as exc:
            raise ControlError(400, str(exc)) from None
        if not self.store.exists(raw) and not self.ws.event_log(raw).exists():
            raise ControlError(404, f"no loop with task id {raw!r} in this workspace")
        return raw

    # -- operations --------------------------------------------------------------------------

    async def start(self, task: Any, options: Any) -> dict[str, Any]:
        if not isinstance(task, str) or not task.strip():
            raise ControlError(400, "task: the task file's path (e.g. \"Specs/feature/tasks.md\") or a Kiro spec's "
                                    "name is required")
        try:
            opts = StartOptions.model_validate(options or {})
        except ValidationError as exc:
            raise ControlError(400, _first_error(exc, "options")) from None
        if "\x00" in task:
            raise ControlError(400, "task: a path holds no NUL character")
        if len(task) > TASK_PATH_MAX_CHARS:
            raise ControlError(400, f"task: a path of at most {TASK_PATH_MAX_CHARS} characters")
        spec = kirospec.find_spec(self.ws.root, task.strip())  # a Kiro spec's name, as `--spec` takes (no `/`)
        try:
            path = spec if spec is not None else self.ws.resolve_task(task)
            path.resolve().relative_to(self.ws.root.resolve())
        except KiroError as exc:
            raise ControlError(404, str(exc)) from None
        except ValueError:
            raise ControlError(400, f"task {task!r} is outside the workspace {self.ws.root}") from None
        except (OSError, RuntimeError) as exc:  # a name too long for the file system; `~nobody/...`
            raise ControlError(400, f"task: {getattr(exc, 'strerror', None) or exc}") from None
        given = api.Options(max_iterations=opts.max_iterations, failure_threshold=opts.failure_threshold,
                            timeout=opts.timeout, executor=opts.executor, model=opts.model)
        said = Said()
        started = await self._call(api.start, [str(path)], workspace_path=self.ws.root, options=given,
                                   task_id=opts.task_id, detach=True, front=said)
        return {"task_id": started.task_ids[0], "task_path": self.ws.relative(path), "warnings": said.warnings}

    async def stop(self, raw_id: Any, options: Any) -> dict[str, Any]:
        tid = self.task_id(raw_id)
        try:
            opts = StopOptions.model_validate(options or {})
        except ValidationError as exc:
            raise ControlError(400, _first_error(exc, "body")) from None
        said = Said()
        await self._call(api.stop, tid, workspace_path=self.ws.root, reason=opts.reason, force=opts.force,
                         front=said, redact=self.token)
        return {"task_id": tid, "force": opts.force, "hook": self.ws.relative(self.ws.hook_file(tid)),
                "message": said.lines[0] if said.lines else ""}

    async def resume(self, raw_id: Any) -> dict[str, Any]:
        tid = self.task_id(raw_id)
        said = Said()
        started = await self._call(api.resume, tid, workspace_path=self.ws.root, detach=True, front=said)
        return {"task_id": tid, "message": said.lines[-1] if said.lines else (started.task_ids or [""])[-1],
                "warnings": said.warnings}

    def message(self, raw_id: Any, content: Any) -> dict[str, Any]:
        """Queue a message in the loop's inbox (`kiro.store.messages`, the same one `kiro loop tell` uses): the
        agent reads it in its next prompt, once."""
        tid = self.task_id(raw_id)
        if not isinstance(content, str) or not content.strip():
            raise ControlError(400, "content: the message text (a non-empty string) is required")
        if len(content) > MESSAGE_MAX_CHARS:
            raise ControlError(413, f"content: at most {MESSAGE_MAX_CHARS} characters")
        try:  # e.g. the server's own token, pasted by mistake, is cut too
            told = api.tell(tid, content, workspace_path=self.ws.root, via="kiro serve", redact=self.token)
        except KiroError as exc:
            raise refused(exc) from None
        msg = told.message
        return {"task_id": tid, "id": msg.id, "queued": True, "delivered": False, "inbox": told.inbox,
                "note": "queued in the loop's inbox; the agent reads it in its next prompt"}
