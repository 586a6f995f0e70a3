"""What a loop is: one `Status` enum that knows its exit code, whether a process works on it, whether
it has ended, whether a plain `resume` continues it, and where the dashboards put it (STYLE 14).

The values are the strings of the state file (SPEC §4); `interrupted` is never written: it is what the
read commands show for a state that says running or sleeping whose process is gone.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Literal

    Group = Literal["Active", "Paused", "Completed", "Failed"]
    Tone = Literal["active", "waiting", "good", "bad", "neutral", "warn"]
    NotifyKind = Literal["completed", "failed", "paused", "limit"]


class Status(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SLEEPING = "sleeping"  # backoff, a guardrail's wait, active hours
    PAUSED = "paused"  # stop hook, task in Needs_Action/, request_human
    STOPPED = "stopped"  # signal, stop --force, task missing, an error
    COMPLETED = "completed"
    FAILED = "failed"  # failure_threshold, max_step_retries
    MAX_ITERATIONS = "max_iterations"  # max_iterations or a budget guardrail
    TIMED_OUT = "timed_out"  # timeout_seconds or idle_timeout_seconds
    INTERRUPTED = "interrupted"  # display only: recorded active, but no process holds the loop

    @property
    def exit_code(self) -> int | None:
        """What `start`/`resume` exit with when a run ends in this status (SPEC §6); None while the
        loop has not ended. A pause because a person is needed (Needs_Action/, request_human) exits 6:
        that code travels on the `Stop`, not here."""
        return _EXIT[self]

    def shown(self, alive: bool) -> Status:
        """What `status` shows for a loop recorded as this: running or sleeping with no process
        holding its lock is `interrupted`."""
        return Status.INTERRUPTED if self.is_active and not alive else self

    @property
    def is_active(self) -> bool:
        """A process works on the loop (when the lock says it is alive)."""
        return self in (Status.RUNNING, Status.SLEEPING)

    @property
    def may_be_alive(self) -> bool:
        """Recorded statuses whose loop may be held by a live process: worth a look at the lock."""
        return self in (Status.PENDING, Status.RUNNING, Status.SLEEPING)

    @property
    def is_terminal(self) -> bool:
        """The loop ended where it cannot go on as it is: done, or a limit a person must raise
        (`resume --max-iterations`, `--reset-failures`, `--timeout`)."""
        return self in (Status.COMPLETED, Status.FAILED, Status.MAX_ITERATIONS, Status.TIMED_OUT)

    @property
    def is_resumable(self) -> bool:
        """A plain `kiro loop resume` continues it (no limit to raise)."""
        return self in (Status.PENDING, Status.PAUSED, Status.STOPPED, Status.INTERRUPTED)

    @property
    def group(self) -> Group:
        """The Dashboard.md / web dashboard section (SPEC §10): a loop stopped at a limit waits for a
        person's `resume --max-iterations`/`--timeout` with the paused ones; Failed is for failures."""
        if self.is_active:
            return "Active"
        if self is Status.COMPLETED:
            return "Completed"
        if self is Status.FAILED:
            return "Failed"
        return "Paused"

    @property
    def tone(self) -> Tone:
        """How a renderer colours it (console: a rich style, the web page: a CSS class)."""
        return _TONE[self]

    @property
    def badge(self) -> str:
        """The markdown badge of reports and Dashboard.md."""
        return _BADGE[self]

    @property
    def notify_kind(self) -> NotifyKind | None:
        """The `on_event` kind a run that ends in this status fires (besides `finished`)."""
        return _NOTIFY.get(self)

    @property
    def resume_flag(self) -> str | None:
        """What `resume` needs besides the task id to go on from here: the limit to raise. A
        template: `{more}` is the suggested new max_iterations."""
        return _RESUME_FLAG.get(self)


_EXIT: dict[Status, int | None] = {
    Status.PENDING: None,
    Status.RUNNING: None,
    Status.SLEEPING: None,
    Status.PAUSED: 3,
    Status.STOPPED: 3,
    Status.INTERRUPTED: 3,
    Status.COMPLETED: 0,
    Status.FAILED: 5,
    Status.MAX_ITERATIONS: 4,
    Status.TIMED_OUT: 4,
}

_TONE: dict[Status, Tone] = {
    Status.PENDING: "neutral",
    Status.RUNNING: "active",
    Status.SLEEPING: "waiting",
    Status.PAUSED: "warn",
    Status.STOPPED: "neutral",
    Status.INTERRUPTED: "warn",
    Status.COMPLETED: "good",
    Status.FAILED: "bad",
    Status.MAX_ITERATIONS: "bad",
    Status.TIMED_OUT: "bad",
}

_BADGE: dict[Status, str] = {
    Status.RUNNING: "🟢 RUNNING",
    Status.SLEEPING: "🔵 SLEEPING",
    Status.PAUSED: "🟡 PAUSED",
    Status.STOPPED: "⚪ STOPPED",
    Status.INTERRUPTED: "🟠 INTERRUPTED",
    Status.COMPLETED: "✅ COMPLETED",
    Status.FAILED: "❌ FAILED",
    Status.MAX_ITERATIONS: "🛑 MAX ITERATIONS",
    Status.TIMED_OUT: "⏱️ TIMED OUT",
    Status.PENDING: "⚪ PENDING",
}

_NOTIFY: dict[Status, NotifyKind] = {
    Status.COMPLETED: "completed",
    Status.FAILED: "failed",
    Status.PAUSED: "paused",
    Status.STOPPED: "paused",
    Status.MAX_ITERATIONS: "limit",
    Status.TIMED_OUT: "limit",
}

_RESUME_FLAG: dict[Status, str] = {
    Status.MAX_ITERATIONS: "--max-iterations {more}",
    Status.FAILED: "--reset-failures",
    Status.TIMED_OUT: "--timeout SECONDS",
}

RECORDED: frozenset[Status] = frozenset(s for s in Status if s is not Status.INTERRUPTED)
"""The statuses a state file may hold."""



def success_rate(completed: int, failed: int) -> float | None:
    """The one success rate every view shows (`status`, `stats`, the dashboards, reports): steps
    completed over steps completed or failed. A usage limit, a guardrail's wait or an interruption is
    neither. None while nothing has finished (shown `-`, not 0%)."""
    finished = completed + failed
    return round(completed / finished, 4) if finished else None


def percent(rate: float | None) -> str:
    """A success rate as a person reads it: `93%`, or `-` while nothing has finished."""
    return "-" if rate is None else f"{rate:.0%}"
