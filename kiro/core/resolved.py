"""What a loop leaves behind once it is over, put right.

Requests a loop left for a person in `Needs_Action/` (`intervention_<id>.md`, `escalation_<id>.md`,
`request_<id>.md`, `review_<id>.md`) are answered once the loop resumes or completes. They then move to
`Logs/resolved/<name>_<UTC time>.md`, so `Needs_Action/` lists only what still waits for someone and
the history stays readable. And kiro's in-progress marker `[-]` goes back to `[ ]` when no step runs
(the loop ended, or `stop --force` had to kill it)."""

from __future__ import annotations

import os
from pathlib import Path

from kiro import timeutil
from kiro.store.workspace import Workspace, locate_task


def release_in_progress_box(ws: Workspace, task_path: Path, task_id: str, step_id: str) -> bool:
    """No step runs any more: kiro's `[-]` on `step_id` goes back to `[ ]`, wherever the task file
    is now. A box a step completed (`[x]`) or a person changed is left alone. True when changed."""
    from kiro.errors import TaskFileError, TaskNotFound
    from kiro.store import tasks

    try:
        _where, path = locate_task(ws, task_path, task_id)
        if path is None:
            return False
        fresh = tasks.load(path)
        step = next((x for x in fresh.steps if x.id == step_id), None)
        if step is None or step.marker != "-":
            return False
        tasks.set_marker(path, step.key, " ", expected=fresh)
        return True
    except (TaskFileError, TaskNotFound, OSError):
        return False


def resolved_dir(ws: Workspace) -> Path:
    return ws.logs / "resolved"


def archive_requests(ws: Workspace, task_id: str) -> list[str]:
    """Move this loop's open requests to Logs/resolved/; one line per file moved, for the person."""
    notes: list[str] = []
    stamp = timeutil.now().strftime("%Y%m%dT%H%M%SZ")
    for path in (ws.intervention_request(task_id), ws.escalation(task_id), ws.human_request(task_id),
                 ws.review_note(task_id)):
        if not path.is_file():
            continue
        dest = resolved_dir(ws) / f"{path.stem}_{stamp}{path.suffix}"
        n = 1
        while dest.exists():
            n += 1
            dest = resolved_dir(ws) / f"{path.stem}_{stamp}_{n}{path.suffix}"
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, dest)
        except OSError:
            continue
        notes.append(f"moved {ws.relative(path)} to {ws.relative(dest)}")
    return notes
