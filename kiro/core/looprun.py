"""A loop made ready to run (`LoopRun`): what kiro.core.runner's preparation (config resolved, state on disk,
lock held) hands the engine (kiro.core.engine), a backend or, for `kiro loop start --detach`, the loop's own
process. Light to import: the command that prepares a loop for the background imports neither the engine nor
the features it runs with (STYLE 19).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kiro.core.hooks import Feature
    from kiro.executors.base import Executor
    from kiro.store.config import Config
    from kiro.store.state import LoopState
    from kiro.store.statestore import StateStore
    from kiro.store.tasks import TaskFile
    from kiro.store.workspace import Workspace


@dataclass(eq=False, repr=False)
class LoopRun:
    """Everything one loop needs, prepared by `kiro.core.runner` (config resolved, lock held)."""

    ws: Workspace
    store: StateStore
    config: Config
    state: LoopState
    task_path: Path
    executor_name: str
    resumed: bool = False
    warnings: list[str] = field(default_factory=list)
    release: Callable[[], None] | None = None
    executor: Executor | None = None
    lock: Any = None  # the loop's FileLock, for a supervisor that keeps it across runs
    make_features: Callable[[], list[Feature]] = list
    """The features the loop runs with (`features`), made when first asked for: where the loop runs, not in
    a `--detach` start's command, which only prepares it (kiro.core.runner: kiro.core.features.standard)."""
    _features: list[Feature] | None = field(default=None, init=False, repr=False)
    make_notes: Callable[[], list[str]] = list
    """The lines to show at its start that are no warning (`notes`), made when first asked for: the box its steps
    run in is worked out where the loop runs, not by a `--detach` start's command, which shows none."""
    _notes: list[str] | None = field(default=None, init=False, repr=False)

    @property
    def features(self) -> list[Feature]:
        """git, approval, schedule, pre-check...: what plugs in beside the engine (kiro.core.hooks.Feature)."""
        if self._features is None:
            self._features = self.make_features()
        return self._features

    @features.setter
    def features(self, value: list[Feature]) -> None:
        self._features = value

    @property
    def notes(self) -> list[str]:
        """What a resume answered, the box its steps run in: shown at its start (kiro.core.api, the supervisor)."""
        if self._notes is None:
            self._notes = self.make_notes()
        return self._notes


def names_schedule(task: TaskFile) -> bool:
    """The task's frontmatter has a `schedule:` or a `stateful:` value: only then is there a schedule to check
    or run (kiro.core.schedule.of_task is None for any other task), so only then are kiro.core.schedule and
    kiro.core.scheduled imported (a plain loop's start and run import neither)."""
    fm = task.frontmatter
    return fm.get("schedule") is not None or fm.get("stateful") is not None
