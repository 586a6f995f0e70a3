"""What a loop is: one `Status` enum that knows its exit code, whether a process works on it, whether
it has ended, whether a plain `resume` continues it, and where the dashboards put it (STYLE 14); and why it
left `running`: one `StopReason` enum whose members carry the status it leaves, the exit code, the advice a
person sees, the `kiro loop stats` bucket and the dashboard label.

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
    Bucket = Literal["backoff", "budgets", "hours", "rate_limits", "usage_limits", "other"]


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
        that code is the `StopReason`'s, not the status's."""
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


RECORDED: frozenset[Status] = frozenset(s for s in Status if s is not Status.INTERRUPTED)
"""The statuses a state file may hold."""


_CONFIG = "in config/autonomous_loop.yaml"
_RAISE = "Raise `{key}` " + _CONFIG + "{env}, then resume: `{{command}}`"


def _raise(key: str) -> str:
    """The advice of a limit set in the config: the key to raise (and its `KIRO_<SECTION>__<KEY>` variable,
    kiro.store.config), then the command that resumes."""
    section, _, name = key.rpartition(".")
    env = f" (or KIRO_{section.upper()}__{name.upper()})" if section else ""
    return _RAISE.format(key=key, env=env)


class StopReason(StrEnum):
    """Why a loop left `running` (`stop_reason` of the state file, `reason` of `loop_finished`; a wait's
    `limit`). Each member carries, in this order:

    - `status`: the status the loop is left in (`sleeping` for a wait: it goes on by itself);
    - `exit_code`: what `start`/`resume` exit with (SPEC §6), None for a wait;
    - `bucket`: the "Time spent waiting" line of `kiro loop stats` a wait of this name counts in;
    - `label`: how Dashboard.md names it ("" = the name, title-cased);
    - `advice`: what a person does next, when the command that resumes is not all of it (a limit to raise
      in the config first); `{command}` is that command;
    - `flag`: what `resume` needs besides the task id (`{more}`: a suggested max_iterations, `{timeout}`:
      a suggested run-time limit).

    Adding a stop condition: one member here, and the `Stop` that names it (kiro.core.conditions).
    """

    _status: Status
    exit_code: int | None
    bucket: Bucket
    label: str
    advice: str | None
    flag: str | None

    def __new__(cls, value: str, status: Status, exit_code: int | None, bucket: Bucket = "other", label: str = "",
                advice: str | None = None, flag: str | None = None) -> StopReason:
        member = str.__new__(cls, value)
        member._value_ = value
        member._status, member.exit_code, member.bucket = status, exit_code, bucket
        member.label = label or value.replace("_", " ").title()
        member.advice, member.flag = advice, flag
        return member

    # done (exit 0)
    ALL_STEPS_DONE = "all_steps_done", Status.COMPLETED, 0
    TASK_IN_DONE = "task_in_done", Status.COMPLETED, 0  # a person moved the task to Done/
    # a person stopped it; a plain `resume` continues (exit 3)
    STOP_HOOK = "stop_hook", Status.PAUSED, 3, "other", "Stop Hook"
    SIGNAL = "signal", Status.STOPPED, 3, "other", "Stopped by signal"  # SIGTERM/SIGINT, `stop --force`
    TASK_MISSING = "task_missing", Status.STOPPED, 3, "other", "Task file missing"
    INTERRUPTED = "interrupted", Status.STOPPED, 3  # an attempt cut short, no other stop named
    ROLLED_BACK = "rolled_back", Status.STOPPED, 3  # `kiro loop rollback` of a completed loop
    RESTARTED = "restarted", Status.STOPPED, 3  # set aside by `kiro loop start --fresh`
    STEP_DONE = "step_done", Status.STOPPED, 0  # `kiro loop start --step ID`: that step is done
    # kiro could not go on (exit 1; `error` exits with its KiroError's code)
    STEP_MISSING = "step_missing", Status.STOPPED, 1  # `--step ID` names a step no longer in the task
    DISK_FULL = "disk_full", Status.STOPPED, 1
    EXECUTOR_ERROR = "executor_error", Status.STOPPED, 1, "other", "Executor error"
    ERROR = "error", Status.STOPPED, 1, "other", "Error"
    CRASH = "crash", Status.STOPPED, 1, "other", "kiro crashed"
    # a person is needed (exit 6)
    NEEDS_ACTION = "needs_action", Status.PAUSED, 6, "other", "Task in Needs_Action"
    REQUEST_HUMAN = "request_human", Status.PAUSED, 6, "other", "Agent asked for help"
    APPROVAL_PENDING = "approval_pending", Status.PAUSED, 6  # step proposals wait in Pending_Approval/
    MERGE_CONFLICT = "merge_conflict", Status.PAUSED, 6  # a step branch did not merge back
    STEP_CONFLICT = "step_conflict", Status.PAUSED, 6  # parallel steps: a step's work conflicts
    DEPENDS_WAITING = "depends_waiting", Status.PAUSED, 6  # parallel steps: no open step can start
    CHECKPOINT = "checkpoint", Status.PAUSED, 6  # a review point (pause_at_checkpoints, pause_every)
    REVIEW_CHANGES = "review_changes", Status.PAUSED, 6  # the reviewer asked for changes too often
    # a limit to raise (exit 4)
    MAX_ITERATIONS = ("max_iterations", Status.MAX_ITERATIONS, 4, "other", "Max Iterations Reached",
                      "Increase max iterations and resume: `{command}`", "--max-iterations {more}")
    TIMEOUT_SECONDS = ("timeout_seconds", Status.TIMED_OUT, 4, "other", "Time Limit Reached",
                       "Raise the run-time limit and resume: `{command}`", "--timeout {timeout}")
    MAX_TOTAL_TOKENS = ("max_total_tokens", Status.MAX_ITERATIONS, 4, "budgets", "",
                        _raise("guardrails.max_total_tokens"))
    MAX_COST_USD = "max_cost_usd", Status.MAX_ITERATIONS, 4, "budgets", "", _raise("guardrails.max_cost_usd")
    IDLE_TIMEOUT_SECONDS = ("idle_timeout_seconds", Status.TIMED_OUT, 4, "other", "",
                            _raise("guardrails.idle_timeout_seconds"))
    MAX_MEMORY_MB = "max_memory_mb", Status.MAX_ITERATIONS, 4, "other", "", _raise("resource_limits.max_memory_mb")
    MAX_LIMIT_WAIT_SECONDS = ("max_limit_wait_seconds", Status.TIMED_OUT, 4, "usage_limits", "",
                              _raise("max_limit_wait_seconds"))  # an agent CLI's usage limit, too long to wait
    # failures (exit 5): `resume --reset-failures`
    FAILURE_THRESHOLD = ("failure_threshold", Status.FAILED, 5, "other", "Threshold Exceeded", None,
                         "--reset-failures")
    MAX_STEP_RETRIES = "max_step_retries", Status.FAILED, 5, "other", "Step Retries Exhausted", None, "--reset-failures"
    LOOP_DETECTION_REPEATS = "loop_detection_repeats", Status.FAILED, 5, "other", "", None, "--reset-failures"
    # waits: the loop sleeps, and goes on by itself
    BACKOFF = "backoff", Status.SLEEPING, None, "backoff", "Backoff"
    ACTIVE_HOURS = "active_hours", Status.SLEEPING, None, "hours"
    TOKEN_BUDGET_PER_HOUR = "token_budget_per_hour", Status.SLEEPING, None, "budgets"
    MAX_API_CALLS_PER_MINUTE = "max_api_calls_per_minute", Status.SLEEPING, None, "rate_limits"
    MAX_ACTIONS_PER_MINUTE = "max_actions_per_minute", Status.SLEEPING, None, "rate_limits"
    MAX_CPU_PERCENT = "max_cpu_percent", Status.SLEEPING, None, "rate_limits"
    MAX_DISK_WRITES_PER_MINUTE = "max_disk_writes_per_minute", Status.SLEEPING, None, "rate_limits"
    MAX_CONSECUTIVE_TURNS = "max_consecutive_turns", Status.SLEEPING, None  # a forced rest
    USAGE_LIMIT = "usage_limit", Status.SLEEPING, None, "usage_limits"  # an agent CLI's usage limit
    RETRY_AFTER = "retry_after", Status.SLEEPING, None  # a model server's long Retry-After

    @property
    def status(self) -> Status:
        return self._status

    @classmethod
    def named(cls, reason: str) -> StopReason:
        """The member of this name; ValueError for a name this kiro does not know (a bug: every stop names
        a member)."""
        member = cls._value2member_map_.get(reason)
        if not isinstance(member, cls):
            raise ValueError(f"{reason!r} is not a StopReason")
        return member

    @classmethod
    def of(cls, reason: str | None, status: Status | str | None = None) -> StopReason | None:
        """The member a stored `stop_reason` names; None for no reason or a name this kiro does not know.
        With `status`, a loop's recorded status: a reason that does not leave that status is not taken,
        and a loop at a limit with no reason (or an unknown one) counts as the plain limit of its status."""
        member = cls._value2member_map_.get(reason) if reason else None
        if status is None:
            return member if isinstance(member, cls) else None
        status = Status(status)
        if isinstance(member, cls) and member.status == status:
            return member
        return _PLAIN.get(status)

    @property
    def state_flag(self) -> str | None:
        """The seed's `stop_conditions` flag of the state file this reason sets (SPEC §4)."""
        if self.status == Status.COMPLETED:
            return "task_in_done"
        if self is StopReason.STOP_HOOK:
            return "stop_hook_triggered"
        if self.status == Status.PAUSED:
            return "manual_intervention"
        if self is StopReason.MAX_ITERATIONS:
            return "max_iterations_reached"
        if self.status == Status.FAILED:
            return "failure_threshold_exceeded"
        return None


_PLAIN: dict[Status, StopReason] = {
    Status.MAX_ITERATIONS: StopReason.MAX_ITERATIONS,
    Status.TIMED_OUT: StopReason.TIMEOUT_SECONDS,
    Status.FAILED: StopReason.FAILURE_THRESHOLD,
}
"""The reason a loop recorded at a limit counts as when its own is missing (a state written before
`stop_reason`) or unknown."""



def success_rate(completed: int, failed: int) -> float | None:
    """The one success rate every view shows (`status`, `stats`, the dashboards, reports): steps
    completed over steps completed or failed. A usage limit, a guardrail's wait or an interruption is
    neither. None while nothing has finished (shown `-`, not 0%)."""
    finished = completed + failed
    return round(completed / finished, 4) if finished else None


def percent(rate: float | None) -> str:
    """A success rate as a person reads it: `93%`, or `-` while nothing has finished."""
    return "-" if rate is None else f"{rate:.0%}"
