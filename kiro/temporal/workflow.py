"""Workflow code: deterministic, no I/O, no kiro imports (the SDK's sandbox re-imports this module).

`KiroLoop` (workflow id `kiro.<workspace_id>.<task_id>`) runs the loop in *segments*: one `run_segment`
activity on the workspace host runs kiro's own engine until the loop stops (completed, paused, failed, ...).
A completed loop closes the workflow; any other outcome leaves it open, waiting for the `resume` signal,
at no cost. `force_stop` cancels the running segment (the engine stops the step, saves, exit 3).

`KiroStep` (one per step attempt, started by the engine's remote executor on the workspace host) runs the
`run_attempt` activity on the step queue, where every `kiro worker` polls. Temporal retries an attempt whose
worker died (heartbeat timeout) on another worker; kiro's own retry rules (failed attempts, backoff,
thresholds) stay in the engine.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, CancelledError

# An attempt lost this many times (its worker died each time) is recorded as one failed attempt.
LOST_ATTEMPTS = 5


def _cancelled(exc: BaseException) -> bool:
    return isinstance(exc, CancelledError) or isinstance(getattr(exc, "cause", None), CancelledError)


@workflow.defn(name="KiroLoop")
class KiroLoop:
    def __init__(self) -> None:
        self._resume = False
        self._force = False
        self._outcomes: list[dict[str, Any]] = []
        self._phase = "starting"

    @workflow.run
    async def run(self, inp: dict[str, Any]) -> dict[str, Any]:
        resumed = bool(inp.get("resumed"))
        while True:
            self._phase = "running"
            handle = workflow.start_activity(
                "run_segment", {**inp, "resumed": resumed, "segment": len(self._outcomes) + 1},
                task_queue=inp["ws_queue"], start_to_close_timeout=timedelta(days=365),
                heartbeat_timeout=timedelta(seconds=float(inp["segment_heartbeat_timeout"])),
                retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=10)),
                cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED)
            await workflow.wait_condition(lambda h=handle: h.done() or self._force)  # type: ignore[misc]
            if not handle.done():
                handle.cancel()
            try:
                outcome: dict[str, Any] = await handle
            except ActivityError as exc:
                if not _cancelled(exc):
                    raise
                outcome = {"status": "stopped", "reason": "signal", "exit_code": 3, "report": None,
                           "message": "stopped by `kiro loop stop --force`"}
            self._force = False
            self._outcomes.append(outcome)
            if outcome.get("status") == "completed":
                self._phase = "completed"
                return outcome
            self._phase = "waiting"
            await workflow.wait_condition(lambda: self._resume)
            self._resume, resumed = False, True

    @workflow.signal
    def resume(self) -> None:
        """`kiro loop resume` (the CLI has already removed the hook and applied its options to the state)."""
        if self._phase == "waiting":
            self._resume = True

    @workflow.signal
    def force_stop(self) -> None:
        """`kiro loop stop --force`."""
        if self._phase == "running":
            self._force = True

    @workflow.query
    def status(self) -> dict[str, Any]:
        return {"phase": self._phase, "outcomes": list(self._outcomes)}


@workflow.defn(name="KiroStep")
class KiroStep:
    @workflow.run
    async def run(self, inp: dict[str, Any]) -> dict[str, Any]:
        hb = float(inp["heartbeat_seconds"])
        try:
            result: dict[str, Any] = await workflow.execute_activity(
                "run_attempt", inp, task_queue=inp["step_queue"],
                start_to_close_timeout=timedelta(seconds=float(inp["timeout_seconds"]) + 120),
                heartbeat_timeout=timedelta(seconds=3 * hb),
                retry_policy=RetryPolicy(initial_interval=timedelta(seconds=min(hb, 1.0)),
                                         maximum_interval=timedelta(seconds=10), maximum_attempts=LOST_ATTEMPTS,
                                         non_retryable_error_types=["ExecutorError", "UserError", "ConfigError"]),
                cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED)
        except ActivityError as exc:
            if _cancelled(exc):
                raise
            cause = exc.cause if exc.cause is not None else exc
            kind = getattr(cause, "type", None) or type(cause).__name__
            if kind in ("ExecutorError", "UserError", "ConfigError"):
                return {"outcome": "error", "error": str(cause), "kind": kind}
            return {"outcome": "failed", "lost": LOST_ATTEMPTS, "summary": "",
                    "error": f"lost on {LOST_ATTEMPTS} workers: {cause}"}
        return result
