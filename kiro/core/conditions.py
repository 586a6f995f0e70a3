"""Stop conditions (SPEC §6) as small objects. Each returns a `Stop` that names itself: the status
the loop ends in, its exit code, the limit and the figure that hit it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiro.status import Status
from kiro.store.state import LoopState
from kiro.store.workspace import Workspace

NEEDS_PERSON = 6  # exit code of a pause that waits for a person (Needs_Action/, request_human)

@dataclass(frozen=True)
class Stop:
    status: Status  # the state's final status
    reason: str  # stop_reason: stop_hook, task_in_done, max_iterations, ...
    message: str  # one line for a person
    exit_code: int  # status.exit_code, or 6 (a person is needed), 1 (kiro could not go on), 0 (`--step`'s step done)
    limit: str | None = None
    value: Any = None
    figure: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", Status(self.status))  # a plain string from older callers

    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status, "reason": self.reason, "message": self.message,
                               "exit_code": self.exit_code}
        if self.limit is not None:
            out.update(limit=self.limit, value=self.value, figure=self.figure)
        return out


def _code(status: Status) -> int:
    code = status.exit_code
    assert code is not None, status
    return code


def completed(message: str, reason: str = "all_steps_done") -> Stop:
    return Stop(Status.COMPLETED, reason, message, _code(Status.COMPLETED))


def stop_hook(path: Path, ws: Workspace) -> Stop:
    if path == ws.global_hook_file:
        return Stop(Status.PAUSED, "stop_hook", f"global stop hook {ws.relative(path)} found (every loop pauses); "
                                                f"delete it or run `kiro loop resume --all` to continue",
                    _code(Status.PAUSED))
    return Stop(Status.PAUSED, "stop_hook", f"stop hook {ws.relative(path)} found; delete it or run "
                                            f"`kiro loop resume` to continue", _code(Status.PAUSED))


def stopped(reason: str, message: str) -> Stop:
    return Stop(Status.STOPPED, reason, message, _code(Status.STOPPED))


def needs_action(message: str, reason: str = "needs_action") -> Stop:
    return Stop(Status.PAUSED, reason, message, NEEDS_PERSON)


def max_iterations(state: LoopState) -> Stop:
    return Stop(Status.MAX_ITERATIONS, "max_iterations",
                f"max_iterations {state.max_iterations} reached after {state.iteration} iterations",
                _code(Status.MAX_ITERATIONS), "max_iterations", state.max_iterations, state.iteration)


def timed_out(limit: float, elapsed: float) -> Stop:
    return Stop(Status.TIMED_OUT, "timeout_seconds",
                f"timeout_seconds {limit:g} reached ({elapsed:.1f} s of run time)", _code(Status.TIMED_OUT),
                "timeout_seconds", limit, round(elapsed, 3))


def guardrail(limit: str, value: Any, figure: Any, message: str) -> Stop:
    """A hard guardrail (max_total_tokens, max_cost_usd, idle_timeout_seconds): exit 4, and
    `stop_reason` names the limit. Time limits end as timed_out, budgets as max_iterations."""
    status = Status.TIMED_OUT if limit.endswith("seconds") else Status.MAX_ITERATIONS
    return Stop(status, limit, message, _code(status), limit, value, figure)


def failure_threshold(state: LoopState) -> Stop:
    return Stop(Status.FAILED, "failure_threshold",
                f"failure_threshold {state.failure_threshold} reached ({state.consecutive_failures} consecutive "
                f"failures)", _code(Status.FAILED), "failure_threshold", state.failure_threshold,
                state.consecutive_failures)


def step_retries(step_id: str, attempts: int, max_retries: int) -> Stop:
    return Stop(Status.FAILED, "max_step_retries",
                f"step {step_id} failed {attempts} times (max_step_retries {max_retries})", _code(Status.FAILED),
                "max_step_retries", max_retries, attempts - 1)


STEP_DONE = "step_done"  # stop_reason of a `--step` loop whose step is done


def step_done(step_id: str, task_id: str) -> Stop:
    """`kiro loop start --step ID`: the step asked for is done, and other steps are still open. Exit 0 (what was
    asked is done); the loop is `stopped`, so a plain `kiro loop resume` goes on with the rest."""
    return Stop(Status.STOPPED, STEP_DONE, f"step {step_id} is done; `kiro loop resume --task-id {task_id}` does "
                                             f"the steps still open", 0)
