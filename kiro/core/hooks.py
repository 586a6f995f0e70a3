"""How parts plug in beside the engine (STYLE 13). `LoopHandle` is what a running loop offers them;
`Feature` is the hooks the engine calls: git checkpoints, a recurring task's runs, the pre-check
gate and step approval (kiro.core.features) are features, handed to the loop by whoever prepares it
(kiro.core.runner); reports, the dashboard and notifiers are listeners of its events (kiro.core.listeners).
None of them imports the engine, and the engine imports none of them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from kiro.core.conditions import Stop
    from kiro.core.guardrails import LoopGuardrails
    from kiro.executors.base import Executor, Guard, StepResult
    from kiro.fs.writer import WriteQueue
    from kiro.status import Status
    from kiro.store.config import Config, LoopSettings
    from kiro.store.events import Event
    from kiro.store.receipts import VerifyRun
    from kiro.store.redact import Redactor
    from kiro.store.state import LoopState
    from kiro.store.statestore import StateStore
    from kiro.store.tasks import Step, TaskFile
    from kiro.store.workspace import Workspace

T = TypeVar("T")


class LoopHandle(Protocol):
    """One running loop, as its listeners and hooks see it."""

    ws: Workspace
    store: StateStore
    cfg: Config
    settings: LoopSettings
    state: LoopState
    task_path: Path
    project_dir: Path
    executor: Executor
    redact: Redactor
    guardrails: LoopGuardrails
    writes: WriteQueue
    slot: Any  # the watch supervisor's place for this loop, if any
    cancel: asyncio.Event  # set when the loop must stop now (for a feature that runs a process, as a step does)
    slept: float  # seconds this run spent in backoff and guardrail waits

    def emit(self, event: Event, /) -> None: ...

    def save(self) -> None: ...

    def subscribe(self, *listeners: Callable[[Event], None]) -> None: ...

    async def asave(self) -> None: ...

    async def aside(self, waiting: Awaitable[T]) -> T:
        """Await `waiting`, in which the loop does nothing anyone can see: the save it owes waits for its next
        yield (for the look the loops of a process share)."""
        ...

    def write_report(self, path: Path, text: str, *, fsync: bool = True) -> None: ...

    def relocate(self, path: Path, *, area: str | None = None) -> None: ...

    def transition(self, to: Status, reason: str | None = None) -> None: ...

    def elapsed(self) -> float: ...

    def interrupt_check(self) -> Stop | None: ...

    async def wait(self, seconds: float, *, messages: bool = False) -> Stop | None: ...

    def step_guard(self) -> Guard:
        """The guard a step's executor is given (its waits are the loop's `sleeping`, its hard limits the
        loop's stop): for a feature that runs an agent as a step does (a reviewer)."""
        ...

    async def flush(self) -> None: ...

    @property
    def resumed(self) -> bool: ...


class LoopListener:
    """A listener that works for one loop. Subclasses override what they need."""

    def __init__(self, loop: LoopHandle) -> None:
        self.loop = loop

    def __call__(self, event: Event) -> None:
        return None

    def saved(self, state: LoopState) -> None:
        """After every save of the loop's state."""
        return None

    async def aclose(self) -> None:
        """The run is over (also after a crash): finish what is under way."""
        return None


class Checkpoint(Protocol):
    """What a step's git checkpoint recorded (kiro.git.checkpoints.Result)."""

    commit: str | None
    note: str | None


@dataclass(eq=False)
class Reopen:
    """What `Feature.check_step` returns for a step sent back to its agent without a failure counted (a
    reviewer asked for changes, SPEC §14): the step runs again with `reason` in its prompt (no backoff, no
    failure toward failure_threshold), or the loop ends with `stop` (a pause for a person)."""

    reason: str
    stop: Stop | None = None

    def __str__(self) -> str:
        return self.reason


class Feature:
    """A part of a loop that plugs in beside the engine: git checkpoints, a recurring task's runs, the
    pre-check gate, the approval of proposed steps (kiro.core.features). The engine calls each hook of each
    of its features, in their order, at the points named below; a hook a feature does not override
    does nothing. The engine imports none of them."""

    async def open(self, loop: LoopHandle) -> None:
        """Once per run, after the task file was first read, before a crashed step is reconciled."""

    async def begin(self, loop: LoopHandle, task: TaskFile) -> Stop | None:
        """Once per run, before the first step; a stop ends the run there."""
        return None

    def each_round(self, loop: LoopHandle) -> None:
        """Each time round the loop, after the stop conditions, before the task file is read again."""

    def choose_step(self, loop: LoopHandle, task: TaskFile, step: Step | None) -> Step | Stop | None:
        """The step to do next, given the one the engine found (the first open step; None: every step is
        done): another step, or a stop that ends the run there."""
        return step

    async def before_step(self, loop: LoopHandle, step_id: str, attempts: int) -> tuple[Stop | None, bool]:
        """Before an attempt: (a stop that ends the run, go ahead with the attempt?)."""
        return None, True

    def prompt_addition(self, loop: LoopHandle) -> str | None:
        """Text added to the attempt's prompt (for executors that read prompts)."""
        return None

    async def after_step(self, loop: LoopHandle, step_id: str) -> None:
        """After an attempt, however it went."""

    async def check_step(self, loop: LoopHandle, step: Step, verify: VerifyRun | None, *,
                         recovering: bool = False, result: StepResult | None = None) -> str | Reopen | None:
        """The executor says the step is done (`result`: what it said) and `verify` (None: none is set)
        passed; `recovering`: the step's box was found checked after a kill, before kiro recorded it. Why the
        step is not done after all (the attempt fails with that reason; recovering, the box is reopened), a
        `Reopen` (the step goes back to its agent, no failure counted), or None."""
        return None

    async def step_done(self, loop: LoopHandle, step: Step, *, recovering: bool = False) -> Checkpoint | None:
        """A step's box is checked and the state does not record the step yet (`recovering`: found
        so after a crash). A checkpoint the state records with the step, if any."""
        return None

    async def all_done(self, loop: LoopHandle, task: TaskFile) -> Stop | bool | None:
        """Every step is done: a stop ends the run there, True goes round again (a recurring task's
        next run), None lets the run complete."""
        return None

    async def completing(self, loop: LoopHandle, stop: Stop) -> Stop:
        """The run is about to end completed: the stop it ends with."""
        return stop

    def run_base(self) -> tuple[float, int]:
        """Seconds and iterations spent before the current run (a recurring task's earlier runs),
        which the run's limits do not count."""
        return 0.0, 0
