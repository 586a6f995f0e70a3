"""The pre-check gate (SPEC §11, kiro.core.precheck).

Every kind here is made on first use: `kiro.store.events` imports this module when one of its names
is asked for (`ev.X`, `from kiro.store.events import X`) or every kind is read (the log's reader)."""

from typing import Literal

from kiro.store.events import Event


class PrecheckPassed(Event):
    """The pre-check gate let a run (or an attempt) go on: something changed, or the check failed open."""

    event: Literal["precheck_passed"] = "precheck_passed"
    model: str
    scope: str  # "run" | "iteration"
    reason: str
    asked: bool = False  # the pre-check model was called (else: a message waits, no baseline, new work)
    failed: bool = False  # the call failed or gave no answer: the gate failed open
    changes: str | None = None


class PrecheckSkipped(Event):
    """The pre-check gate found nothing changed: the run (or attempt) was skipped."""

    event: Literal["precheck_skipped"] = "precheck_skipped"
    model: str
    scope: str
    reason: str  # the pre-check model's
    changes: str = ""  # what the digest held, in one line
    next_check_seconds: float | None = None  # every_iteration: how long the loop sleeps before it looks again
