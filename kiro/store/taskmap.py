"""Which loop a task file belongs to, kept in kiro's own state (`.state/task_files.json`: task id ->
the file's real path, its (device, inode) and its size), so that kiro writes nothing into a person's task file but
box characters (issue #31 item 2). A `kiro_task_id` a person wrote in a task file's frontmatter is
honoured and kept current (kiro.core.runner): that is how a person asks for the id in the file.

A move (`mv`, a rename in a file manager) keeps the inode and the size, so a moved task file is found
again in Done/, Needs_Action/ or Specs/ under any name (kiro.store.workspace `locate_task`; the same
relative path there is found without it). kiro's own box edits are made in place and keep both. The size
is asked too because a file system gives a deleted file's inode to the next new file: a new task file
that got it is not taken for the old one (unless it is just as long). Writes are
made under the workspace's start guard (kiro.core.runner), one start at a time; a batch start records
its loops with one write (`remember_all`).

Limits: a file copied to its new place (another file system, or copy-then-delete) is a new inode, and a
file a person both moved and lengthened (a step added) is not found by its inode; only its relative path
finds it then, as it finds any file without an id.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from kiro.errors import StateError
from kiro.fs import safeio
from kiro.fs.atomic import Staged, atomic_write
from kiro.fs.statcache import StatCache

FILE = "task_files.json"

Entries = dict[str, dict[str, Any]]


class _Map:
    """The entries of one file, with the look-ups a scan makes once per task file."""

    def __init__(self, entries: Entries) -> None:
        self.entries = entries
        self.by_path: dict[Any, str] = {}
        self.by_inode: dict[tuple[Any, Any], tuple[str, Any]] = {}  # -> (task id, size)
        for task_id, entry in entries.items():
            self.by_path.setdefault(entry.get("path"), task_id)
            self.by_inode.setdefault((entry.get("dev"), entry.get("ino")), (task_id, entry.get("size")))


_EMPTY = _Map({})
_maps: StatCache[_Map] = StatCache(most=64)  # the file's path -> its map, read again only when changed


def _map(state_dir: Path) -> _Map:
    """The map, read again only when the file changed (a watch asks once per task file per scan)."""
    path = os.fspath(state_dir / FILE)
    try:
        st = os.stat(path)
    except OSError:
        return _EMPTY
    return _maps.read(path, st, lambda: _parse(path), keep=lambda found: found is not _EMPTY)


def _parse(path: str) -> _Map:
    try:  # the one safe reader: a FIFO or a huge file in its place must not hang or fill memory
        data = json.loads(safeio.read_bytes(path, limit=safeio.STATE_MAX_BYTES))
    except (OSError, ValueError, safeio.UnreadableFile):
        return _EMPTY  # an unreadable map finds no moved file: the relative path still finds it
    return _Map({k: v for k, v in data.items() if _valid(v)} if isinstance(data, dict) else {})


def _valid(entry: object) -> bool:
    return (isinstance(entry, dict) and isinstance(entry.get("path"), str)
            and all(type(entry.get(k)) is int for k in ("dev", "ino"))
            and (entry.get("size") is None or type(entry.get("size")) is int))


def _identity(path: Path) -> tuple[str, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return os.path.realpath(path), st.st_dev, st.st_ino, st.st_size


def _same_file(size: Any, st_size: int) -> bool:
    """The inode's file is the one recorded: as long (an entry an older kiro wrote has no size)."""
    return size is None or size == st_size


def remember(state_dir: Path, task_id: str, path: Path) -> None:
    """Record that the loop `task_id` works on the task file at `path`."""
    remember_all(state_dir, [(task_id, path)])


def remember_all(state_dir: Path, loops: Iterable[tuple[str, Path]], staged: Staged | None = None) -> None:
    """Record several loops' task files with one write (`staged`: put in place with a batch's other files)."""
    data = dict(_map(state_dir).entries)
    changed = False
    for task_id, path in loops:
        ident = _identity(path)
        if ident is None:
            continue
        data = {k: v for k, v in data.items()  # the file's earlier loops are done with; an inode names one file
                if v.get("path") != ident[0] and (v.get("dev"), v.get("ino")) != ident[1:3]}
        data[task_id] = {"path": ident[0], "dev": ident[1], "ino": ident[2], "size": ident[3]}
        changed = True
    if not changed:
        return
    raw = (json.dumps(data, separators=(",", ":"), sort_keys=True) + "\n").encode()
    if staged is not None:
        staged.add(state_dir / FILE, raw, error=_cannot_write)
        return
    try:  # read again at the next look (kiro.fs.statcache: a file this fresh is not kept)
        atomic_write(state_dir / FILE, raw)
    except OSError as exc:
        raise _cannot_write(exc) from None


def _cannot_write(exc: OSError) -> StateError:
    return StateError(f"{FILE}: cannot record which loop works on which task file: {exc.strerror or exc}")


def task_id_for(state_dir: Path, path: Path) -> str | None:
    """The loop recorded for the file at `path`: by its real path, else by its inode (it was moved)."""
    ident = _identity(path)
    if ident is None:
        return None
    found = _map(state_dir)
    by_path = found.by_path.get(ident[0])
    if by_path is not None:
        return by_path
    task_id, size = found.by_inode.get(ident[1:3], (None, None))
    return task_id if task_id is not None and _same_file(size, ident[3]) else None


def find_moved(state_dir: Path, task_id: str, files: Callable[[], Iterable[Path]]) -> Path | None:
    """Of `files()` (listed only for a task file recorded here), the recorded task file of `task_id`,
    moved there (the same inode)."""
    entry = _map(state_dir).entries.get(task_id)
    if entry is None:
        return None
    want = (entry.get("dev"), entry.get("ino"))
    for p in files():
        try:
            st = os.stat(p)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == want and _same_file(entry.get("size"), st.st_size):
            return p
    return None
