"""A workspace's settings: the resolved config and the state store it implies. Light on imports,
so that read commands (`kiro loop status`) need not load the engine."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from kiro.store.config import Config, resolve_config
from kiro.store.redact import Redactor
from kiro.store.statestore import StateStore
from kiro.store.workspace import Workspace

if TYPE_CHECKING:
    from kiro.store import tasks


class Located(NamedTuple):  # (a NamedTuple, as kiro.store.tasks' TaskCounts)
    ws: Workspace
    store: StateStore
    config: Config


def settings_for(ws0: Workspace, *, config_file: Path | None = None, task: tasks.TaskFile | None = None,
                 overrides: Mapping[str, Any] | None = None) -> Located:
    """Resolve the config (defaults < file < task frontmatter < KIRO_* < flags) and the state folder."""
    frontmatter: dict[str, Any] = dict(task.frontmatter) if task is not None else {}
    cfg = resolve_config(
        workspace_root=ws0.root, config_file=config_file, frontmatter=frontmatter,
        task_path=task.path if task is not None else None,
        frontmatter_lines=getattr(task, "frontmatter_lines", None) if task is not None else None,
        env=os.environ, overrides=dict(overrides or {}),
    )
    ws = ws0.with_state_directory(cfg.autonomous_loop.state_directory)
    ws.check_folders()
    return Located(ws, StateStore(ws, Redactor.for_run(cfg)), cfg)
