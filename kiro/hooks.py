"""What a running loop offers the parts that plug in beside the engine (STYLE 13): the listeners
(kiro.listeners), the pre-check gate (kiro.precheck) and a recurring task's runs (kiro.scheduled).

They are handed the engine's `Loop` and use it through this protocol only, so none of them imports
the engine (the engine imports them, to plug them in): the package has no import circle.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from kiro.conditions import Stop
    from kiro.config import Config, LoopSettings
    from kiro.events import Event
    from kiro.executors.base import Executor
    from kiro.guardrails import LoopGuardrails
    from kiro.redact import Redactor
    from kiro.state import LoopState, StateStore
    from kiro.status import Status
    from kiro.workspace import Workspace
    from kiro.writer import WriteQueue


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

    def emit(self, event: Event | str, /, **fields: Any) -> None: ...

    def save(self) -> None: ...

    async def asave(self) -> None: ...

    def write_report(self, path: Path, text: str, *, fsync: bool = True) -> None: ...

    def relocate(self, path: Path, *, area: str | None = None) -> None: ...

    def transition(self, to: Status, reason: str | None = None) -> None: ...

    def elapsed(self) -> float: ...

    def interrupt_check(self) -> Stop | None: ...

    async def wait(self, seconds: float, *, messages: bool = False) -> Stop | None: ...
