"""Executors: how one step is carried out (SPEC §5). `create()` picks one by name."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kiro.errors import ExecutorError

if TYPE_CHECKING:
    from kiro.executors.base import Executor
    from kiro.store.config import Config
    from kiro.store.workspace import Workspace

NAMES = ("shell", "command", "openai")


def create(name: str, config: Config, workspace: Workspace, task_id: str) -> Executor:
    """Build the executor called `name`. Imports are lazy: `openai` loads only when used."""
    if name == "shell":
        from kiro.executors.shell import ShellExecutor

        return ShellExecutor(config, workspace)
    if name == "command":
        from kiro.executors.command import CommandExecutor

        return CommandExecutor(config, workspace, task_id)
    if name == "openai":
        from kiro.executors.openai_agent import OpenAIExecutor

        return OpenAIExecutor(config, workspace, task_id)
    raise ExecutorError(f"unknown executor {name!r}; choose one of {', '.join(NAMES)}")
