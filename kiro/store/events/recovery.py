"""A loop taken up again: after a kill or a stop, a broken state file, a box checked that kiro never recorded.

Every kind here is made on first use: `kiro.store.events` imports this module when one of its names
is asked for (`ev.X`, `from kiro.store.events import X`) or every kind is read (the log's reader)."""

from typing import Literal

from kiro.store.events import Event


class StepRecovered(Event):
    """A step's box checked while kiro was not running was taken as done."""

    event: Literal["step_recovered"] = "step_recovered"
    step_id: str
    description: str | None = None


class LoopResumed(Event):
    """A process took up a paused, stopped or interrupted loop again."""

    event: Literal["loop_resumed"] = "loop_resumed"
    task_path: str
    executor: str
    max_iterations: int
    pid: int | None = None
    workspace: str = ""


class StateRecovered(Event):
    """A broken state file was replaced by the newest good backup (or its journal replayed)."""

    event: Literal["state_recovered"] = "state_recovered"
    message: str = ""
    path: str | None = None


class StepInterrupted(Event):
    """An attempt was cut short (a person moved the task, a timeout, stop --force): not a failure."""

    event: Literal["step_interrupted"] = "step_interrupted"
    step_id: str
    reason: str


class StepReopened(Event):
    """A box found checked after a kill (or stop) that kiro never recorded did not pass verify or the
    protected-path check (or was checked by the agent during an attempt at another step): unchecked."""

    event: Literal["step_reopened"] = "step_reopened"
    step_id: str
    reason: str
