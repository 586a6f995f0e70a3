"""kiro's control files stay kiro's: what an external agent (the command executor) changed in
`.state/`, `.hooks/`, `config/`, or in the task file beyond its own step's box, is found after the
attempt, put back, and named.

Before the attempt: every file's size and mtime (and its bytes, within a budget) in the three
folders, and the task file's bytes. After: a file whose size or mtime moved, or that appeared or
went, was touched. Put back: the old bytes (or the file removed again); a file too big to have been
kept is named as touched but not restored. Exceptions, because kiro or a person writes them while
an agent runs: lock files, the files of other loops that
are running now (their own lock is held), what `kiro serve` and `kiro loop watch` keep there (see
STATE_KIRO_*), what this loop's own state journal wrote meanwhile (kiro.journal.own_write),
and stop hooks created or deleted in `.hooks/` (a stop or a `kiro loop resume` of
another loop, which a person may do while this agent runs; whoever asks for a stop gets it).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from kiro import journal, locks, state
from kiro.ownwrites import TEMP_SUFFIX
from kiro.workspace import Workspace

KEEP_BYTES = 4 * 1024 * 1024  # the most kept to restore from, over all control files
# What kiro itself (this loop, other loops, `kiro serve`, `kiro loop watch`) may write in .state/ while an
# agent runs: prompt files, process-group ledgers, message inboxes, the event index, the memory database
# (live SQLite), the history index, step-proposal markers, the server token, the watcher's pid file. Not watched.
STATE_KIRO_DIRS = frozenset({"prompts", "processes", "inbox", "proposals"})
STATE_KIRO_FILES = ("events.idx", "memory.db", "kiro.db", "serve.token", "watch.pid")


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

    @classmethod
    def take(cls, ws: Workspace, task_id: str, task_path: Path) -> ControlSnapshot:
        snap = cls(ws, task_id, task_path)
        budget = KEEP_BYTES
        for path, (size, mtime_ns) in snap._walk().items():
            data = None
            if size <= budget:
                try:
                    with open(path, "rb") as fh:
                        data = fh.read()
                    budget -= len(data)
                except OSError:
                    continue
            snap.files[path] = _Entry(size, mtime_ns, data)
        with contextlib.suppress(OSError):
            snap.task_bytes = task_path.read_bytes()
        # changes from before this attempt are not the agent's (this loop's own files too, present or not)
        journal.take_overwritten(snap.files.keys() | snap._own_files())
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

    def _live_others(self) -> list[str]:
        """The task ids of the other loops running now (their lock is held)."""
        found = []
        for lock in self.ws.state_dir.glob("autonomous_loop_*.lock"):
            tid = lock.name[len("autonomous_loop_"):-len(".lock")]
            if tid != self.task_id and locks.is_held(lock):
                found.append(tid)
        return found

    def _belongs_to(self, path: Path, tids: list[str]) -> bool:
        """A file of one of the loops `tids` (its state, backups, archive, transcript)."""
        name = path.name
        return any(name.startswith(f"autonomous_loop_{tid}.") or name == f"{tid}.jsonl" for tid in tids)

    def _is_stop_hook(self, path: Path) -> bool:
        return path in (self.ws.hook_file(self.task_id), self.ws.global_hook_file) or (
            path.parent == self.ws.hooks and path.name.startswith("stop"))

    def restore(self, step_line: int, step_box: int) -> list[str]:
        """Put back what the agent changed; return what it touched, one phrase each. `step_line`
        (0-based) and `step_box` (the box's offset in the file) name the one change allowed in the
        task file: the current step's box."""
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
        rewrite = False
        now = self._walk()
        written_over = journal.take_overwritten(now.keys() | self.files.keys())
        others: list[str] | None = None
        for name in sorted(now.keys() | self.files.keys()):
            old = self.files.get(name)
            stat = now.get(name)
            if name in written_over:  # changed by the agent, then written over by kiro's own snapshot
                touched.append(f"{self.ws.relative(Path(name))} (changed; restored)")
                continue
            if old is not None and stat == (old.size, old.mtime_ns):
                continue
            if journal.own_write(name, stat):
                continue  # kiro's own: this loop's state snapshot, journal, summary or backup (kiro.journal)
            if name in own:
                verb = "created" if old is None else "deleted" if stat is None else "changed"
                touched.append(f"{self.ws.relative(Path(name))} ({verb}; restored)")
                rewrite = True
                continue
            path = Path(name)
            rel = self.ws.relative(path)
            if others is None:
                others = self._live_others()
            if old is None:
                if self._is_stop_hook(path) or self._belongs_to(path, others):
                    continue
                with contextlib.suppress(OSError):
                    path.unlink()
                touched.append(f"{rel} (created; removed)")
                continue
            if self._belongs_to(path, others) or (stat is None and self._is_stop_hook(path)):
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
