"""Which loop a task file belongs to, for task files kiro writes nothing into but box characters (a
Kiro spec's `tasks.md`, kiro.store.kirospec): kept in kiro's own state, `.state/task_files.json`, as
task id -> the file's real path and its (device, inode). Other task files carry the id in their
frontmatter (`kiro_task_id`, SPEC §2); an id a person wrote there is honoured for every file.

A move (`mv`, a rename in a file manager) keeps the inode, so a moved spec file is found again as
`kiro_task_id` finds a moved task file: in Done/, Needs_Action/ or Specs/ (kiro.store.workspace
`locate_task`). kiro's own box edits are made in place and keep it too. Writes are made under the
workspace's start guard (kiro.core.runner), one start at a time.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from kiro.fs.atomic import atomic_write

FILE = "task_files.json"


def _load(state_dir: Path) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads((state_dir / FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, dict)}


def _identity(path: Path) -> tuple[str, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return os.path.realpath(path), st.st_dev, st.st_ino


def remember(state_dir: Path, task_id: str, path: Path) -> None:
    """Record that the loop `task_id` works on the task file at `path`."""
    ident = _identity(path)
    if ident is None:
        return
    data = _load(state_dir)
    data = {k: v for k, v in data.items() if v.get("path") != ident[0]}  # the file's earlier loops are done with
    data[task_id] = {"path": ident[0], "dev": ident[1], "ino": ident[2]}
    atomic_write(state_dir / FILE, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())


def task_id_for(state_dir: Path, path: Path) -> str | None:
    """The loop recorded for the file at `path`: by its real path, else by its inode (it was moved)."""
    ident = _identity(path)
    if ident is None:
        return None
    data = _load(state_dir)
    for task_id, entry in data.items():
        if entry.get("path") == ident[0]:
            return task_id
    for task_id, entry in data.items():
        if (entry.get("dev"), entry.get("ino")) == ident[1:]:
            return task_id
    return None


def find_moved(state_dir: Path, task_id: str, files: Callable[[], Iterable[Path]]) -> Path | None:
    """Of `files()` (listed only for a task file recorded here), the recorded task file of `task_id`,
    moved there (the same inode)."""
    entry = _load(state_dir).get(task_id)
    if entry is None:
        return None
    want = (entry.get("dev"), entry.get("ino"))
    for p in files():
        try:
            st = os.stat(p)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == want:
            return p
    return None
