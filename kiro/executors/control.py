"""kiro's control files stay kiro's: what an external agent (the command executor) changed in
`.state/`, `.hooks/`, `config/`, or in the task file beyond its own step's box, is found after the
attempt, put back, and named.

Before the attempt: every file's size and mtime (and its bytes, within a budget) in the three
folders, and the task file's bytes. After: a file whose size or mtime moved, or that appeared or
went, was touched. Put back: the old bytes (or the file removed again); a file too big to have been
kept is named as touched but not restored.

Checked: this loop's own files in `.state/` (its state, journal, summary, archive, backups,
transcript, precheck record), `config/`, `.hooks/`, the task file, and any file in `.state/` whose
name kiro never writes. Except what this loop's own state journal wrote meanwhile
(kiro.store.journal.own_write), and stop hooks created or deleted in `.hooks/` (a stop or a `kiro loop
resume` of another loop, which a person may do while this agent runs; whoever asks for a stop gets it).

Not checked, and never put back or removed: kiro's files of other loops and those all loops share
(`.starts`, the start lock, disk reserves, the history and memory databases, what `kiro serve` and
`kiro loop watch` keep; see `ControlSnapshot.owner`). Other loops, in this process or another, write
them while this agent runs: a loop starting (`.starts`), saving, finishing (its archive appears and
its state file goes), or killed and resumed. Nothing on disk tells those writes from the agent's,
and "restoring" them deleted a finished loop's archive and failed this agent's good attempt. Only a
sandbox that keeps the agent out of `.state/` can protect them; without one, what changed there is
listed in the attempt log (`unchecked`), as a warning, and left as it is. Logs/ and Dashboard.md are
not watched at all.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Literal

from kiro.fs.diskfull import RESERVE_PREFIX
from kiro.fs.ownwrites import TEMP_SUFFIX
from kiro.store import journal, state, taskmap
from kiro.store.workspace import Workspace

KEEP_BYTES = 4 * 1024 * 1024  # the most kept to restore from, over all control files
# What kiro itself (this loop, other loops, `kiro serve`, `kiro loop watch`) may write in .state/ while an
# agent runs: prompt files, process-group ledgers, message inboxes, the event index, the memory database
# (live SQLite), the history index, step-proposal markers, the server token, the watcher's pid file. Not watched.
STATE_KIRO_DIRS = frozenset({"prompts", "processes", "inbox", "proposals"})
STATE_KIRO_FILES = ("events.idx", "memory.db", "kiro.db", "serve.token", "watch.pid")
# kiro's other files in .state/ that no loop owns: the start counter, the start lock, the watcher's lock, the
# workspace's id and worker lock (temporal backend), the map of task files (every start writes it); disk reserves
# (RESERVE_PREFIX) and temp files go by prefix
STATE_SHARED_FILES = frozenset({".starts", ".start.lock", "watch.lock", "workspace_id", "temporal_worker.lock",
                                taskmap.FILE})
# kiro's folders in .state/ that hold one file per loop, named by task id (`<task_id><suffix>`)
STATE_LOOP_DIRS = {"transcripts": ".jsonl", "precheck": ".json"}
LOOP_PREFIX = "autonomous_loop_"
LOOP_SUFFIXES = (".json", journal.JOURNAL_SUFFIX, journal.SUMMARY_SUFFIX, ".lock")
# a backup's name after its task id: `.<%Y%m%dT%H%M%S%f>.i<iteration>.json` (kiro.store.state), and its journal
BACKUP_TAIL = re.compile(r"\.\d{8}T\d{12}\.i\d+\.json(?:" + re.escape(journal.JOURNAL_SUFFIX) + ")?")
UNCHECKED_NAMED = 6  # of the other loops' files that changed during an attempt, named in its log
Owner = Literal["loop", "kiro"]  # this loop's file in .state/; kiro's file of another loop, or shared


@dataclass
class _Entry:
    size: int
    mtime_ns: int
    data: bytes | None


@dataclass
class ControlSnapshot:
    ws: Workspace
    task_id: str
    task_path: Path
    files: dict[str, _Entry] = field(default_factory=dict)
    task_bytes: bytes | None = None
    unchecked: list[str] = field(default_factory=list)
    """After `restore`: kiro's files of other loops, or shared, that changed during the attempt (not
    checked, left as they are: see the module's doc), for the attempt log."""

    @classmethod
    def take(cls, ws: Workspace, task_id: str, task_path: Path) -> ControlSnapshot:
        snap = cls(ws, task_id, task_path)
        budget = KEEP_BYTES
        for path, (size, mtime_ns) in snap._walk().items():
            data = None
            if size <= budget and snap.owner(path) != "kiro":
                try:
                    with open(path, "rb") as fh:
                        data = fh.read()
                    budget -= len(data)
                except OSError:
                    continue
            snap.files[path] = _Entry(size, mtime_ns, data)
        with contextlib.suppress(OSError):
            snap.task_bytes = task_path.read_bytes()
        # changes from before this attempt are not the agent's (this loop's own files too, present or not);
        # other loops' notes are theirs to take (one process runs many loops under `kiro loop watch`)
        journal.take_overwritten(snap._mine(snap.files.keys()) | snap._own_files())
        return snap

    def _walk(self) -> dict[str, tuple[int, int]]:
        """Every watched file (path -> size, mtime): plain strings and scandir's cached stats, so
        that a workspace with hundreds of archived states costs milliseconds per attempt."""
        found: dict[str, tuple[int, int]] = {}
        state_dir = str(self.ws.state_dir)

        def scan(folder: str) -> None:
            try:
                entries = list(os.scandir(folder))
            except OSError:
                return
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if not (folder == state_dir and entry.name in STATE_KIRO_DIRS):
                            scan(entry.path)
                        continue
                    if self._ignored(folder, entry.name, state_dir):
                        continue
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                found[entry.path] = (st.st_size, st.st_mtime_ns)

        for folder in (self.ws.state_dir, self.ws.hooks, self.ws.root / "config"):
            scan(str(folder))
        return found

    @staticmethod
    def _ignored(folder: str, name: str, state_dir: str) -> bool:
        # kiro's own temp files (atomic_write's, of a snapshot or backup its writer thread makes
        # while the step runs) come and go on their own: seen at the start and gone at the end, one
        # was "restored" and the attempt failed as if the agent had touched kiro's files
        return (name.endswith((".lock", ".kiro-restore", TEMP_SUFFIX))
                or (folder == state_dir and name.startswith(STATE_KIRO_FILES)))

    def owner(self, path: str) -> Owner | None:
        """Whose file `path` is, by its name: "loop", this loop's own file in `.state/` (checked: the
        agent must not touch it); "kiro", kiro's file of another loop or one every loop shares (not
        checked: see the module's doc); None, a file kiro never writes (`config/`, `.hooks/`, a
        stray file in `.state/`: checked)."""
        state_dir = str(self.ws.state_dir) + os.sep
        if not path.startswith(state_dir):
            return None
        folder, _, name = path[len(state_dir):].rpartition(os.sep)
        tid = self.task_id
        if folder in ("", "archive"):
            if name.startswith(LOOP_PREFIX):
                return "loop" if name in self._loop_names else "kiro"
            if folder == "archive":
                return None
            shared = (name in STATE_SHARED_FILES or name.startswith(RESERVE_PREFIX)
                      or name.startswith(STATE_KIRO_FILES) or (name.startswith(".") and name.endswith(".tmp")))
            return "kiro" if shared else None
        if folder == "backups" and name.startswith(LOOP_PREFIX):
            head = LOOP_PREFIX + tid
            mine = name.startswith(head) and BACKUP_TAIL.fullmatch(name, len(head)) is not None
            return "loop" if mine else "kiro"
        suffix = STATE_LOOP_DIRS.get(folder)
        if suffix is not None and name.endswith(suffix):
            return "loop" if name == tid + suffix else "kiro"
        return None

    @cached_property
    def _loop_names(self) -> frozenset[str]:
        """The names of this loop's state, journal, summary and lock (in `.state/` and `.state/archive/`)."""
        return frozenset(f"{LOOP_PREFIX}{self.task_id}{suffix}" for suffix in LOOP_SUFFIXES)

    def _mine(self, paths: Iterable[str]) -> set[str]:
        return {p for p in paths if self.owner(p) == "loop"}

    def _is_stop_hook(self, path: Path) -> bool:
        return path in (self.ws.hook_file(self.task_id), self.ws.global_hook_file) or (
            path.parent == self.ws.hooks and path.name.startswith("stop"))

    def restore(self, step_line: int, step_box: int) -> list[str]:
        """Put back what the agent changed; return what it touched, one phrase each. `step_line`
        (0-based) and `step_box` (the box's offset in the file) name the one change allowed in the
        task file: the current step's box. What changed among the files not checked is in
        `unchecked` afterwards."""
        live = state.live_journal(self.task_id)
        own = self._own_files() if live is not None else set()
        with journal.task_lock(self.task_id):  # no snapshot of this loop's state is half made meanwhile
            touched, rewrite = self._restore(step_line, step_box, own)
        if rewrite and live is not None:
            # written again from what kiro last saved, never from the bytes before the attempt: a snapshot
            # the timer made meanwhile emptied the journal, and the old bytes would lose what it held
            try:
                live.rewrite()
            except OSError as exc:
                touched.append(f"{self.ws.relative_name(self.ws.state_file(self.task_id))} could not be "
                               f"written again: {exc.strerror or exc}")
        return touched + self._restore_task(step_line, step_box)

    def _own_files(self) -> set[str]:
        """This loop's state file, journal and summary, which its open journal writes again (`rewrite`)."""
        state_file = self.ws.state_file(self.task_id)
        return {str(state_file), str(journal.journal_path(state_file)), str(journal.summary_path(state_file))}

    def _restore(self, step_line: int, step_box: int, own: set[str]) -> tuple[list[str], bool]:
        touched: list[str] = []
        unchecked: list[str] = []
        rewrite = False
        now = self._walk()
        written_over = journal.take_overwritten(self._mine(now.keys() | self.files.keys()))
        for name in sorted(now.keys() | self.files.keys()):
            old = self.files.get(name)
            stat = now.get(name)
            if name in written_over:  # changed by the agent, then written over by kiro's own snapshot
                touched.append(f"{self.ws.relative(Path(name))} (changed; restored)")
                continue
            if old is not None and stat == (old.size, old.mtime_ns):
                continue
            if journal.own_write(name, stat):
                # kiro's own: a state snapshot, journal, summary or backup this process wrote (kiro.store.journal)
                continue
            if name in own:
                verb = "created" if old is None else "deleted" if stat is None else "changed"
                touched.append(f"{self.ws.relative(Path(name))} ({verb}; restored)")
                rewrite = True
                continue
            path = Path(name)
            rel = self.ws.relative(path)
            if self.owner(name) == "kiro":
                # another loop's (starting, saving, archiving, resumed after a kill, in any process) or
                # shared: never blamed, never put back or removed (the module's doc says why)
                unchecked.append(rel)
                continue
            if old is None:
                if self._is_stop_hook(path):
                    continue
                with contextlib.suppress(OSError):
                    path.unlink()
                touched.append(f"{rel} (created; removed)")
                continue
            if stat is None and self._is_stop_hook(path):
                continue  # a deleted stop hook is a resume: `kiro loop resume` of another loop
            if stat is not None and old.data is not None:
                with contextlib.suppress(OSError):
                    if path.read_bytes() == old.data:
                        continue  # rewritten with the same bytes
            verb = "deleted" if stat is None else "changed"
            if old.data is None:
                touched.append(f"{rel} ({verb}; too big to have been kept, not restored)")
                continue
            try:
                _write_back(path, old.data, old.mtime_ns)
                touched.append(f"{rel} ({verb}; restored)")
            except OSError as exc:
                touched.append(f"{rel} ({verb}; could not restore: {exc.strerror or exc})")
        self.unchecked = unchecked
        return touched, rewrite

    def _restore_task(self, step_line: int, step_box: int) -> list[str]:
        before = self.task_bytes
        if before is None:
            return []
        try:
            after = self.task_path.read_bytes()
        except FileNotFoundError:
            _write_back(self.task_path, before, None)
            return [f"{self.ws.relative(self.task_path)} (deleted; restored)"]
        except OSError:
            return []
        if after == before or _only_box_changed(before, after, step_box):
            return []
        old_lines = before.decode("utf-8", "replace").splitlines()
        new_lines = after.decode("utf-8", "replace").splitlines()
        changed = [i + 1 for i in range(max(len(old_lines), len(new_lines)))
                   if (old_lines[i] if i < len(old_lines) else None) != (new_lines[i] if i < len(new_lines) else None)
                   and i != step_line]
        where = ", ".join(str(n) for n in changed[:8]) + (", ..." if len(changed) > 8 else "")
        _write_back(self.task_path, before, None)
        return [f"{self.ws.relative(self.task_path)} lines other than the step's box (line {where}; restored)"]


def _text(raw: bytes) -> str:
    return raw[3:].decode("utf-8", "replace") if raw.startswith(b"\xef\xbb\xbf") else raw.decode("utf-8", "replace")


def _only_box_changed(before: bytes, after: bytes, box: int) -> bool:
    """The current step's box, and nothing else, differs (`[-]` -> `[x]`); `box` is the marker's
    offset in the decoded text, as `tasks.Step.box_offset` gives it."""
    old, new = _text(before), _text(after)
    if len(old) != len(new) or box < 0 or box >= len(old):
        return False
    return old[:box] == new[:box] and old[box + 1:] == new[box + 1:] and new[box] in "xX"


def _write_back(path: Path, data: bytes, mtime_ns: int | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.kiro-restore")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    if mtime_ns is not None:
        with contextlib.suppress(OSError):
            os.utime(path, ns=(mtime_ns, mtime_ns))
