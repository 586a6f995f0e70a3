"""Steering loops from the server, the way a person does from a terminal: `kiro loop start --detach`,
`kiro loop stop`, `kiro loop resume --detach` run as subprocesses (so a loop started here is an
ordinary background loop that outlives the server), and messages queued in an inbox file.

Used by both the REST routes and the WebSocket; errors are `ControlError(http_status, message)`.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kiro.errors import KiroError
from kiro.status import Status
from kiro.store.state import StateStore
from kiro.store.workspace import Workspace, check_task_id

CLI_TIMEOUT = 60.0
MESSAGE_MAX_CHARS = 20_000
TASK_PATH_MAX_CHARS = 1024


class ControlError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


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

    # -- helpers -----------------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "KIRO_SERVE_TOKEN"}  # loops never see the token
        env["PYTHONUNBUFFERED"] = "1"
        return env

    async def _kiro(self, *args: str) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kiro", *args, "-w", str(self.ws.root), cwd=str(self.ws.root), env=self._env(),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), CLI_TIMEOUT)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise ControlError(504, f"`kiro {' '.join(args[:2])}` did not answer within {CLI_TIMEOUT:.0f} s") from None
        assert proc.returncode is not None
        return proc.returncode, out.decode(errors="replace").strip(), err.decode(errors="replace").strip()

    @staticmethod
    def _why(err: str, out: str) -> str:
        lines = [ln for ln in (err or out).splitlines() if ln.strip()]
        text = lines[-1] if lines else "no output"
        return text[len("error: "):] if text.startswith("error: ") else text

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

    def _completed(self, tid: str) -> bool:
        try:
            return self.store.load(tid).state.status == Status.COMPLETED
        except KiroError:
            return False  # unreadable or missing: the CLI says what is wrong

    # -- operations --------------------------------------------------------------------------

    async def start(self, task: Any, options: Any) -> dict[str, Any]:
        if not isinstance(task, str) or not task.strip():
            raise ControlError(400, "task: the task file's path (e.g. \"Specs/feature/tasks.md\") is required")
        try:
            opts = StartOptions.model_validate(options or {})
        except ValidationError as exc:
            raise ControlError(400, _first_error(exc, "options")) from None
        if "\x00" in task:
            raise ControlError(400, "task: a path holds no NUL character")
        if len(task) > TASK_PATH_MAX_CHARS:
            raise ControlError(400, f"task: a path of at most {TASK_PATH_MAX_CHARS} characters")
        try:
            path = self.ws.resolve_task(task)
            path.resolve().relative_to(self.ws.root.resolve())
        except KiroError as exc:
            raise ControlError(404, str(exc)) from None
        except ValueError:
            raise ControlError(400, f"task {task!r} is outside the workspace {self.ws.root}") from None
        except (OSError, RuntimeError) as exc:  # a name too long for the file system; `~nobody/...`
            raise ControlError(400, f"task: {getattr(exc, 'strerror', None) or exc}") from None
        args = ["loop", "start", "--task", self.ws.relative(path), "--detach", "--quiet"]
        if opts.task_id:
            args += ["--task-id", opts.task_id]
        for flag, value in (("--max-iterations", opts.max_iterations), ("--failure-threshold", opts.failure_threshold),
                            ("--timeout", opts.timeout), ("--executor", opts.executor), ("--model", opts.model)):
            if value is not None:
                args += [flag, str(value)]
        code, out, err = await self._kiro(*args)
        if code != 0:
            why = self._why(err, out)
            raise ControlError(409 if "already" in why or "lock" in why else 400, why)
        task_id = out.splitlines()[-1].strip() if out else ""
        return {"task_id": task_id, "task_path": self.ws.relative(path)}

    async def stop(self, raw_id: Any, options: Any) -> dict[str, Any]:
        tid = self.task_id(raw_id)
        try:
            opts = StopOptions.model_validate(options or {})
        except ValidationError as exc:
            raise ControlError(400, _first_error(exc, "body")) from None
        args = ["loop", "stop", "--task-id", tid, "--reason", opts.reason]
        if opts.force:
            args.append("--force")
        code, out, err = await self._kiro(*args)
        if code != 0:
            raise ControlError(400, self._why(err, out))
        return {"task_id": tid, "force": opts.force, "hook": self.ws.relative(self.ws.hook_file(tid)),
                "message": out.splitlines()[0] if out else ""}

    async def resume(self, raw_id: Any) -> dict[str, Any]:
        tid = self.task_id(raw_id)
        if self._completed(tid):  # the CLI says so with exit 0 (nothing to do is no error for a script)
            raise ControlError(409, f"loop {tid!r} is already completed; nothing to resume")
        code, out, err = await self._kiro("loop", "resume", "--task-id", tid, "--detach", "--quiet")
        if code != 0:
            raise ControlError(409, self._why(err, out))
        return {"task_id": tid, "message": out.splitlines()[-1] if out else ""}

    def message(self, raw_id: Any, content: Any) -> dict[str, Any]:
        """Queue a message in the loop's inbox (`kiro.store.messages`, the same one `kiro loop tell` uses): the
        agent reads it in its next prompt, once."""
        from kiro.store.messages import Inbox
        from kiro.store.redact import Redactor

        tid = self.task_id(raw_id)
        if not isinstance(content, str) or not content.strip():
            raise ControlError(400, "content: the message text (a non-empty string) is required")
        if len(content) > MESSAGE_MAX_CHARS:
            raise ControlError(413, f"content: at most {MESSAGE_MAX_CHARS} characters")
        # e.g. the server's own token, pasted by mistake; and the config's secrets, as every write of the loop's
        content = (self.store.redact | Redactor.from_environment(None) | self.token).text(content)
        inbox = Inbox(self.store.ws, tid)
        msg = inbox.queue(content, via="kiro serve")
        return {"task_id": tid, "id": msg.id, "queued": True, "delivered": False,
                "inbox": self.ws.relative(inbox.path),
                "note": "queued in the loop's inbox; the agent reads it in its next prompt"}
