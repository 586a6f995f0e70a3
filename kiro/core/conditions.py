"""Stop conditions (SPEC §6) as small objects. Each returns a `Stop` that names itself: its reason
(kiro.status.StopReason, which knows the status the loop ends in and its exit code), the limit and the
figure that hit it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiro.status import Status, StopReason
from kiro.store.state import LoopState
from kiro.store.workspace import Workspace


@dataclass(frozen=True, eq=False)
class Stop:
    status: Status  # the state's final status: reason.status
    reason: StopReason  # stop_reason: stop_hook, task_in_done, max_iterations, ... (a plain string is taken)
    message: str  # one line for a person
    exit_code: int  # reason.exit_code; a KiroError's own code for `error`
    limit: str | None = None
    value: Any = None
    figure: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", Status(self.status))  # a plain string from older callers
        object.__setattr__(self, "reason", StopReason.named(self.reason))  # a name this kiro does not know is a bug

    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status, "reason": self.reason, "message": self.message,
                               "exit_code": self.exit_code}
        if self.limit is not None:
            out.update(limit=self.limit, value=self.value, figure=self.figure)
        return out


def because(reason: StopReason | str, message: str, limit: str | None = None, value: Any = None,
          figure: Any = None) -> Stop:
    """The `Stop` of `reason`: its status and exit code are the reason's (kiro.status.StopReason). The
    functions below name the usual ones."""
    reason = StopReason.named(reason)
    code = reason.exit_code
    assert code is not None, f"{reason} is a wait, not a stop"
    return Stop(reason.status, reason, message, code, limit, value, figure)


def completed(message: str, reason: StopReason | str = StopReason.ALL_STEPS_DONE) -> Stop:
    return because(reason, message)


def stop_hook(path: Path, ws: Workspace) -> Stop:
    if path == ws.global_hook_file:
        return because(StopReason.STOP_HOOK, f"global stop hook {ws.relative(path)} found (every loop pauses); "
                                           f"delete it or run `kiro loop resume --all` to continue")
    return because(StopReason.STOP_HOOK, f"stop hook {ws.relative(path)} found; delete it or run "
                                       f"`kiro loop resume` to continue")


def stopped(reason: StopReason | str, message: str) -> Stop:
    """A stop a signal, the task file or an attempt cut short names; a name this kiro does not know (an
    executor's own, or a wait's) is `interrupted`."""
    member = StopReason.of(reason)
    return because(member if member is not None and member.exit_code is not None else StopReason.INTERRUPTED, message)


def needs_action(message: str, reason: StopReason | str = StopReason.NEEDS_ACTION) -> Stop:
    return because(reason, message)


def max_iterations(state: LoopState) -> Stop:
    return because(StopReason.MAX_ITERATIONS,
                 f"max_iterations {state.max_iterations} reached after {state.iteration} iterations",
                 "max_iterations", state.max_iterations, state.iteration)


def timed_out(limit: float, elapsed: float) -> Stop:
    return because(StopReason.TIMEOUT_SECONDS, f"timeout_seconds {limit:g} reached ({elapsed:.1f} s of run time)",
                 "timeout_seconds", limit, round(elapsed, 3))


def guardrail(limit: str, value: Any, figure: Any, message: str) -> Stop:
    """A hard guardrail (max_total_tokens, max_cost_usd, idle_timeout_seconds, max_memory_mb, ...):
    `stop_reason` names the limit, whose member says how the loop ends (exit 4, or 5 for an escalation)."""
    return because(limit, message, limit, value, figure)


def failure_threshold(state: LoopState) -> Stop:
    return because(StopReason.FAILURE_THRESHOLD,
                 f"failure_threshold {state.failure_threshold} reached ({state.consecutive_failures} consecutive "
                 f"failures)", "failure_threshold", state.failure_threshold, state.consecutive_failures)


def step_retries(step_id: str, attempts: int, max_retries: int) -> Stop:
    return because(StopReason.MAX_STEP_RETRIES,
                 f"step {step_id} failed {attempts} times (max_step_retries {max_retries})",
                 "max_step_retries", max_retries, attempts - 1)


def step_done(step_id: str, task_id: str) -> Stop:
    """`kiro loop start --step ID`: the step asked for is done, and other steps are still open. Exit 0 (what was
    asked is done); the loop is `stopped`, so a plain `kiro loop resume` goes on with the rest."""
    return because(StopReason.STEP_DONE, f"step {step_id} is done; `kiro loop resume --task-id {task_id}` does the "
                                       f"steps still open")
