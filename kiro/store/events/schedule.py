"""Schedules (SPEC §11, kiro.core.schedule).

Every kind here is made on first use: `kiro.store.events` imports this module when one of its names
is asked for (`ev.X`, `from kiro.store.events import X`) or every kind is read (the log's reader)."""

from typing import Literal

from kiro.store.events import Event


class ScheduleFired(Event):
    """A scheduled task's run starts: its boxes were unchecked."""

    event: Literal["schedule_fired"] = "schedule_fired"
    run: int
    schedule: str
    catch_up: bool = False
    missed: int = 0  # fires missed while nothing ran, made up by this one run
    unchecked: int = 0  # boxes kiro unchecked for this run


class RunSummarySaved(Event):
    """The summary of a finished run, saved as a memory tagged `schedule:<task_id>`."""

    event: Literal["run_summary_saved"] = "run_summary_saved"
    run: int
    source: str  # "model" (the agent wrote it) or "kiro" (made from the steps' summaries)
    memory_id: int | None = None
    chars: int = 0
    note: str | None = None  # why kiro wrote it, when the model did not


class RunFinished(Event):
    """A scheduled task's run is done; the loop waits for the next fire."""

    event: Literal["run_finished"] = "run_finished"
    run: int
    report: str
    next_run_at: str | None = None
    duration_seconds: float = 0.0
