"""Temp files left by writes that were killed: removed at `start` and `resume`.

kiro writes files atomically through a temp file beside the target (`kiro.fs.atomic.atomic_write`:
state, backups, archive, reports, hooks, Dashboard.md, task-file edits): `.NAME.<pid>-<hex>.kiro.tmp`;
older versions wrote `.NAME.<pid>.tmp` and `.NAME.<random>.kiro-tmp`. A SIGKILL between creating the
temp file and renaming it leaves the temp file behind. One is stale when the process its name records
is gone; a `.kiro-tmp` (no pid) when it is older than a minute (its writer is the loop that owns the
task, whose lock the caller holds, and a write takes milliseconds).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path

from kiro.fs.locks import process_exists
from kiro.store.workspace import Workspace

_PID_TMP = re.compile(r"^\..+\.(?P<pid>\d+)(?:-[0-9a-f]+\.kiro)?\.tmp$")
_TASK_TMP = re.compile(r"^\..+\.kiro-tmp$")
TASK_TMP_MIN_AGE_SECONDS = 60.0


def remove_stale_temp_files(ws: Workspace, task_path: Path | None = None, *,
                            workspace_folders: bool = True) -> list[Path]:
    """Remove the stale temp files in the folders kiro writes to (and the task file's folder);
    return what was removed. Never raises: a folder it cannot read is skipped. `workspace_folders=False`:
    only the task file's folder (loops started together: the workspace's were swept for the first)."""
    state = ws.state_dir
    folders = [ws.root, state, state / "backups", state / "archive", ws.logs, ws.logs / "completion_reports",
               ws.logs / "progress_reports", ws.hooks, ws.needs_action] if workspace_folders else []
    if task_path is not None:
        folders.append(task_path.parent)
    removed: list[Path] = []
    now = time.time()
    for folder in dict.fromkeys(folders):
        try:
            with os.scandir(folder) as it:
                entries = [e for e in it if e.name.startswith(".")]
        except OSError:
            continue
        for entry in entries:
            m = _PID_TMP.match(entry.name)
            if m is not None:
                stale = not process_exists(int(m["pid"]))  # this process too (several loops)
            elif _TASK_TMP.match(entry.name):
                try:
                    stale = now - entry.stat(follow_symlinks=False).st_mtime > TASK_TMP_MIN_AGE_SECONDS
                except OSError:
                    continue
            else:
                continue
            if stale and entry.is_file(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                    removed.append(Path(entry.path))
    return removed
