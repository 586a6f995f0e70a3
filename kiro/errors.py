"""One error tree. Each error carries the exit code it maps to; the CLI converts it once.

A `UserError` is something the person can fix (bad config, missing task file, held lock);
a `RunError` is kiro itself unable to go on. Both end the run with exit code 1 (SPEC §6)
unless a subclass says otherwise. Messages are one line, for a person, naming the file
(and key or line) and, where there is one, the fix.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType


def raise_errors() -> bool:
    """True under `KIRO_RAISE_ERRORS=1` (every test sets it) or `KIRO_DEBUG=1`: an unexpected exception
    that kiro would otherwise turn into data (a failed attempt, a tool error the model reads, the CLI's
    "internal error" line) re-raises instead, so a bug fails the test that provoked it."""
    return any(os.environ.get(name, "") not in ("", "0") for name in ("KIRO_RAISE_ERRORS", "KIRO_DEBUG"))


class contained:  # noqa: N801 - used as `with contained():`, like contextlib.suppress
    """`contextlib.suppress(Exception)` for clean-up that must not end the loop (closing an executor,
    releasing a lock, saving a memory row), except under KIRO_RAISE_ERRORS/KIRO_DEBUG, where a bug in
    it surfaces. (A class, not a @contextmanager: this module is on the read path, which does without
    importing contextlib.)"""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> bool:
        return kind is not None and issubclass(kind, Exception) and not raise_errors()


class KiroError(Exception):
    """Base of every error kiro reports to a person."""

    exit_code: int = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class UserError(KiroError):
    """Something the person can fix: input, configuration, a name that does not exist."""


class ConfigError(UserError):
    """A config file, frontmatter key or environment variable that does not validate."""

    def __init__(self, message: str, *, file: Path | str | None = None, line: int | None = None,
                 key: str | None = None) -> None:
        where = ""
        if file is not None:
            where = f"{file}:{line}: " if line else f"{file}: "
        super().__init__(where + message)
        self.file = file
        self.line = line
        self.key = key


class TaskFileError(UserError):
    """A task file that cannot be read or has no steps."""


class TaskNotFound(UserError):
    """A --task path or --task-id that names nothing."""


class StateError(KiroError):
    """The state file and every backup of it are unreadable."""


class Conflict(UserError):
    """What the loop's state refuses now (it runs already, it is completed, its task has an unfinished loop):
    `kiro serve` answers 409."""


class LockHeld(Conflict):
    """Another process runs this loop."""

    def __init__(self, task_id: str, pid: int | None, *, ended_lock_file: str = "") -> None:
        who = f"process {pid}" if pid else "another process"
        if ended_lock_file:  # its taker has ended; a process it started holds a copy (a step's child before its
            # exec, or the loop's own process of a --detach start before it took the lock over)
            who = (f"another process: its lock file {ended_lock_file} was taken by process {pid}, which has ended, "
                   f"and is held by a process it started (`fuser -v {ended_lock_file}` names it)")
        super().__init__(
            f"loop {task_id!r} is already running in {who}; "
            f"stop it with `kiro loop stop --task-id {task_id}` or wait for it to finish"
        )
        self.task_id = task_id
        self.pid = pid


class ExecutorError(UserError):
    """An executor that cannot run at all (not configured, bad credentials, unknown model)."""


class RunError(KiroError):
    """kiro could not go on for a reason that is not the person's input."""
