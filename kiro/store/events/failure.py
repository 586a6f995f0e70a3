"""A step that failed its checks (verify, the test count), and the wait before its next attempt.

Every kind here is made on first use: `kiro.store.events` imports this module when one of its names
is asked for (`ev.X`, `from kiro.store.events import X`) or every kind is read (the log's reader)."""

from typing import Any, Literal

from kiro.store.events import Event


class StepFailed(Event):
    """An attempt at a step failed: the error, the failures in a row, the attempt's log."""

    event: Literal["step_failed"] = "step_failed"
    step_id: str
    attempt: int
    error: str
    consecutive_failures: int = 0
    agent: str | None = None
    log: str | None = None  # the attempt's full output (workspace-relative), shown whole
    cost_usd: float | None = None  # the loop's cost so far, when its executor reports one


class GuardrailTriggered(Event):
    """A guardrail acted (a wait, or a stop at a budget): which limit, its value and the figure reached."""

    event: Literal["guardrail_triggered"] = "guardrail_triggered"
    limit: str
    value: Any = None
    figure: Any = None
    action: str = ""
    message: str = ""
    seconds: float | None = None


class VerifyFailed(Event):
    """The step's `verify` command exited non-zero: the step does not count as done."""

    event: Literal["verify_failed"] = "verify_failed"
    step_id: str
    command: str
    output: str = ""


class TestsShrank(Event):
    """verify_report counted fewer passed, or more skipped or xfailed, tests than the last completed step's."""

    __test__ = False  # not a pytest test class

    event: Literal["tests_shrank"] = "tests_shrank"
    step_id: str
    message: str


class Backoff(Event):
    """The loop waits before the next attempt at a failed step."""

    event: Literal["backoff"] = "backoff"
    step_id: str
    seconds: float
    attempts: int = 0
