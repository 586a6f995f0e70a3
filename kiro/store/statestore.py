"""The store of the loop states (kiro.store.state has their model): it writes a state file crash-safely
(whole, or as a journal of what changed: `LiveJournal`), keeps backups, archives it, reads it back, and holds
the per-loop lock.

Apart from the model, so that a command that reads what the loops wrote beside their states (`kiro loop
status` reads their summaries, kiro.store.journal) neither imports nor builds the state's models, receipts and
usage: they are imported when a state is first read or written (issue #41).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import functools
import json
import os
import re
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from kiro import timeutil
from kiro.errors import LockHeld, StateError, TaskNotFound
from kiro.fs import diskfull, locks, ownwrites, safeio, writer
from kiro.fs.atomic import Staged, atomic_write, fsync_dir
from kiro.store import journal
from kiro.store.redact import Redactor
from kiro.store.workspace import Workspace

if TYPE_CHECKING:
    import asyncio  # a live journal's timer; imported where it runs (read commands do without it)

    from kiro.store.state import LoopState

BACKUPS_KEPT = 5
# A backup's name (`_backup_name`), its journal's too; the task id may hold dots, the stamp never does.
# Text, compiled by `re` where first used: a read command never lists backups.
_BACKUP_NAME = (rf"^autonomous_loop_(?P<task_id>.+)\.\d{{8}}T\d+\.i\d+"
                rf"(?P<suffix>\.json|{re.escape(journal.JOURNAL_SUFFIX)})$")
LOW_SPACE_BYTES = 256 * 1024  # free space under which a journal append notes the disk as full (kiro.fs.diskfull)


class LoadResult(NamedTuple):
    """A loaded state, with where it came from and any warning for a person. (A NamedTuple, as
    kiro.store.tasks' TaskCounts.)"""

    state: LoopState
    path: Path
    archived: bool = False
    warning: str | None = None


# In the state folder: the token `kiro serve` generated (kiro.serve.auth), in a folder of its own that every
# step's box hides (kiro.processes.sandbox.SERVE_FOLDER); or the person's own, in this variable, never a step's.
SERVE_TOKEN = "serve/token"
SERVE_TOKEN_ENV = "KIRO_SERVE_TOKEN"
_GENERATED_TOKEN = r"[A-Za-z0-9_\-]{43}"  # what secrets.token_urlsafe(32) makes


def serve_token(ws: Workspace) -> Redactor:
    """The token `kiro serve` generated for this workspace, as a secret kiro knows of: a message, a prompt,
    an agent's output or a line that holds it is cut like one holding `$KIRO_SERVE_TOKEN`. What is in the
    file when it is no such token (`secrets.token_urlsafe(32)`: an agent may write there) is nothing to cut."""
    try:
        text = safeio.read_bytes(ws.state_dir / SERVE_TOKEN, limit=safeio.SMALL_MAX_BYTES).decode().strip()
    except (OSError, UnicodeDecodeError, safeio.UnreadableFile):
        return Redactor()
    return Redactor([text]) if re.fullmatch(_GENERATED_TOKEN, text) else Redactor()


# Seconds to wait for a lock whose taker has ended: what holds it then is a process that kiro was starting when
# it was killed, which lets go at its exec (tests/test_lock_probe.py)
ENDED_HOLDER_WAIT = 2.0


class StateStore:
    """Reads and writes the state files of one workspace."""

    def __init__(self, workspace: Workspace, redact: Redactor | None = None) -> None:
        self.ws = workspace
        # a loop adds its own (`use`): no secret reaches a state file; nor the server's generated token
        self.redact = (redact or Redactor()) | serve_token(workspace)
        self.journals: dict[str, LiveJournal] = {}  # task id -> the journal of a loop running here

    def use(self, redact: Redactor) -> None:
        """Also cut what `redact` knows from every state this store writes."""
        self.redact = redact | self.redact

    def encode(self, state: LoopState) -> str:
        """The state file's text: the state as JSON, redacted. Every state write goes through here."""
        return self.redact.text(state.dump_json())

    def encode_with_summary(self, state: LoopState) -> tuple[str, dict[str, Any]]:
        """`encode(state)` and the loop's summary (kiro.store.journal), both from one dump of the state and
        both redacted: a secret in a task's title reached the summary file, which status reads."""
        data = state.model_dump(mode="json", by_alias=True)
        from kiro.store.state import state_text

        text = state_text(data)
        clean = self.redact.text(text)
        if clean != text:
            data = json.loads(clean)
        return clean, journal.summary_of(data)

    # -- paths -----------------------------------------------------------------------------

    def path(self, task_id: str) -> Path:
        return self.ws.state_file(task_id)

    def exists(self, task_id: str) -> bool:
        return self.path(task_id).exists() or self.ws.archived_state_file(task_id).exists()

    # -- write -----------------------------------------------------------------------------

    def save(self, state: LoopState, *, fsync: bool = True) -> None:
        self.save_job(state, fsync=fsync)()

    def save_job(self, state: LoopState, *, fsync: bool = True) -> Callable[[], object]:
        """A save in two halves: the state is stamped and encoded now (in the caller's thread, the
        only one that touches it), the returned function writes it (in any thread: `kiro.fs.writer`).
        With the loop's journal open (`open_journal`) the record of what changed is made now and the
        job writes every record not written yet, so a later job that replaces this one in the queue
        writes it too. Otherwise the job writes a whole new state file (and removes any journal
        beside it: its records are in that file)."""
        live = self.journals.get(state.task_id)
        if live is not None:
            return live.prepare(state)
        path, data, summary = self._whole(state)

        def write() -> None:
            atomic_write(path, data, fsync=fsync)
            self._after_whole(path, summary)

        return write

    def stage_new(self, state: LoopState, staged: Staged) -> None:
        """The first save of a loop made by a batch start (kiro.core.runner.StartBatch): the state file
        is staged in `staged`, put in place (durably) when the batch commits; its summary after it."""
        path, data, summary = self._whole(state)
        staged.add(path, data)
        staged.then(lambda: self._after_whole(path, summary))

    def _whole(self, state: LoopState) -> tuple[Path, str, dict[str, Any]]:
        """A whole state file's path and text, and its summary: the state stamped and encoded now."""
        state.bound()
        state.updated_at = timeutil.iso()
        text, summary = self.encode_with_summary(state)
        return self.path(state.task_id), text, summary

    def _after_whole(self, path: Path, summary: dict[str, Any]) -> None:
        """A whole state file is in place: any journal beside it is stale (its records are in the
        file), and the summary shows the new state."""
        with contextlib.suppress(FileNotFoundError):
            journal.journal_path(path).unlink()
        self._write_summary(path, summary)

    def open_journal(self, state: LoopState) -> None:
        """From now on `save(state)` appends to the loop's journal (kiro.store.journal); the next save
        writes a snapshot first."""
        if state.task_id not in self.journals:
            self.journals[state.task_id] = LiveJournal(self, state)

    def close_journal(self, task_id: str, *, snapshot: bool = True) -> None:
        """Fold the journal into a last snapshot (if one is owed) and remove it; later saves write
        whole files."""
        live = self.journals.pop(task_id, None)
        if live is not None:
            live.close(snapshot=snapshot)

    def sync_before_next_save(self, task_id: str, fd: int) -> None:
        """`fd` holds bytes (a checked box) that must be on disk before the next state write that
        may record them: the loop's journal fdatasyncs (and closes) it before its next append or
        snapshot; without a journal it is synced now."""
        live = self.journals.get(task_id)
        if live is not None:
            live.sync_first(fd)
            return
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def _write_summary(self, state_file: Path, summary: dict[str, Any]) -> None:
        writer = journal.SummaryWriter(journal.summary_path(state_file))
        try:
            writer.write(summary)
            ownwrites.note_own_write(writer.path)
        except OSError:
            pass  # a view: status falls back to the state file
        finally:
            writer.close()

    def backup(self, state: LoopState) -> Path | None:
        """Copy the current state to `.state/backups/`; keep the newest BACKUPS_KEPT per task. A loop
        with a journal takes a snapshot now and copies it (None is returned)."""
        return self.backup_job(state)()

    def backup_job(self, state: LoopState) -> Callable[[], Path | None]:
        """`backup` in two halves, as `save_job` (with a journal: nothing to encode now)."""
        live = self.journals.get(state.task_id)
        if live is not None:
            upto, iteration = live.seq, state.iteration  # the record of the save just made
            return lambda: live.backup_now(upto, iteration)
        task_id, iteration, text = state.task_id, state.iteration, self.encode(state)
        return lambda: self._write_backup(task_id, iteration, text)

    def _backup_name(self, task_id: str, iteration: int) -> Path:
        stamp = timeutil.now().strftime("%Y%m%dT%H%M%S%f")
        return self.ws.backups_dir() / f"autonomous_loop_{task_id}.{stamp}.i{iteration:06d}.json"

    def _write_backup(self, task_id: str, iteration: int, text: str | list[bytes]) -> Path:
        target = self._backup_name(task_id, iteration)
        with journal.task_lock(task_id):  # a running loop's snapshot may make it while an agent runs
            atomic_write(target, text)
            journal.note_own_write(target)
            self._prune_backups(task_id)
        return target

    def _link_backup(self, task_id: str, iteration: int, snapshot: Path, records: bytes) -> Path:
        """A backup of a running loop whose state is `snapshot` plus the journal `records` after it,
        made without copying the snapshot (O(history) bytes): the records go to a journal file
        beside the backup (written and synced first), then the backup's name is a hard link to the
        snapshot's file, which kiro never writes in place (a new snapshot is a new file). Every kiro
        reader replays a state file's journal (`StateStore._read`), backups included."""
        target = self._backup_name(task_id, iteration)
        side = journal.journal_path(target)
        try:
            folder = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:  # made on first need
            target.parent.mkdir(parents=True, exist_ok=True)
            folder = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:  # every step through the one descriptor of the folder (one open, no path walked again)
            with journal.task_lock(task_id):  # made while an agent may run: each write noted as kiro's own
                if records:
                    atomic_write(side.name, records, dir_fd=folder)
                    ownwrites.note_own_write(side, journal.note_own_write(side))
                try:
                    os.link(snapshot, target.name, dst_dir_fd=folder)
                except OSError:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(side.name, dir_fd=folder)
                    journal.note_own_removal(side)
                    raise
                fsync_dir(folder)
                journal.note_own_write(target)
                self._prune_backups(task_id, folder)
        finally:
            os.close(folder)
        return target

    def _prune_backups(self, task_id: str, folder_fd: int | None = None) -> None:
        """Keep the newest BACKUPS_KEPT backups of `task_id`, with their journals; a journal left
        without its backup (a kill between the two) goes too. One listing of the folder for both
        (`folder_fd`: the backups folder, open)."""
        folder = self.ws.backups_dir()
        backups, sides = self._listed(folder if folder_fd is None else folder_fd, task_id)

        def remove(name: str) -> None:
            with contextlib.suppress(FileNotFoundError):
                if folder_fd is None:
                    (folder / name).unlink()
                else:
                    os.unlink(name, dir_fd=folder_fd)

        for old in backups[BACKUPS_KEPT:]:
            for name in (old, old[: -len(".json")] + journal.JOURNAL_SUFFIX):
                remove(name)
                journal.note_own_removal(folder / name)
        listed = {name[: -len(".json")] for name in backups}  # an old backup's journal went with it above
        for side in sides:
            if side[: -len(journal.JOURNAL_SUFFIX)] not in listed:
                remove(side)

    def _backups(self, task_id: str, suffix: str = ".json") -> list[Path]:
        """`task_id`'s backups (or their journals, by `suffix`), newest first."""
        folder = self.ws.backups_dir()
        backups, sides = self._listed(folder, task_id)
        return [folder / name for name in (backups if suffix == ".json" else sides)]

    @staticmethod
    def _listed(folder: Path | int, task_id: str) -> tuple[list[str], list[str]]:
        """The names of `task_id`'s backups and of their journals in `folder`, each newest first (the stamp
        sorts). Matched by the whole id: the prefix `autonomous_loop_a.` is also that of loop `a.b`'s backups."""
        try:
            names = os.listdir(folder)
        except (FileNotFoundError, NotADirectoryError):
            return [], []
        backups: list[str] = []
        sides: list[str] = []
        for name in names:
            if (m := re.match(_BACKUP_NAME, name)) and m["task_id"] == task_id:
                (backups if m["suffix"] == ".json" else sides).append(name)
        backups.sort(reverse=True)
        sides.sort(reverse=True)
        return backups, sides

    def archive(self, state: LoopState) -> Path:
        return self.archive_job(state)()

    def archive_job(self, state: LoopState) -> Callable[[], Path]:
        """`archive` in two halves, as `save_job`; the write also ends the loop's journal. The archived file
        holds everything a save of `state` would: queued with the key of the loop's saves, it replaces the last
        save when that has not started yet (kiro.core.listeners.Archiver), as a newer save replaces an older."""
        target = self.ws.archived_state_file(state.task_id)
        (data, summary), main = self.encode_with_summary(state), self.path(state.task_id)
        task_id = state.task_id

        def write() -> Path:
            live = self.journals.get(task_id)
            if live is not None:
                live._sync_first()  # what the save it replaced would have synced first (a checked box)
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(target, data)
            # the archived file is the last snapshot; only once it is on disk do the journal's records go with it
            self.close_journal(task_id, snapshot=False)
            for leftover in (main, journal.journal_path(main), journal.summary_path(main)):
                with contextlib.suppress(FileNotFoundError):
                    leftover.unlink()
                ownwrites.note_own_removal(leftover)
            fsync_dir(main.parent)
            self._write_summary(target, summary)
            return target

        return write

    def unarchive(self, task_id: str) -> None:
        src = self.ws.archived_state_file(task_id)
        if src.exists() and not self.path(task_id).exists():
            os.replace(src, self.path(task_id))
            with contextlib.suppress(FileNotFoundError):
                journal.summary_path(src).unlink()

    # -- read ------------------------------------------------------------------------------

    @staticmethod
    def _read(path: Path, task_id: str | None = None) -> LoopState:
        """The state in `path`, with its journal (if any) replayed: the loop's last save."""
        from kiro.store.state import LoopState  # its models are built when a state is first read

        raw = safeio.read_bytes(path, limit=safeio.STATE_MAX_BYTES)
        if journal.journal_path(path).exists():
            state = LoopState.model_validate(journal.with_journal(
                path, raw, lambda: safeio.read_bytes(path, limit=safeio.STATE_MAX_BYTES)))
        else:
            state = LoopState.model_validate_json(raw)
        if task_id is not None and state.task_id != task_id:
            raise ValueError(f"its task_id {state.task_id!r} is not {task_id!r}, the id in its file name")
        return state

    def load(self, task_id: str) -> LoadResult:
        """The state of `task_id`. A corrupt file falls back to the newest good backup, with a
        warning that says so; when nothing is readable, a StateError."""
        main = self.path(task_id)
        archived = self.ws.archived_state_file(task_id)
        problem: str | None = None
        for candidate, is_archive in ((main, False), (archived, True)):
            if not candidate.exists():
                continue
            try:
                return LoadResult(state=self._read(candidate, task_id), path=candidate, archived=is_archive)
            except (ValueError, OSError, safeio.UnreadableFile) as exc:
                problem = f"{self.ws.relative_name(candidate)} is unreadable ({_short(exc)})"
                break
        else:
            raise TaskNotFound(
                f"no loop with task id {task_id!r} in {self.ws.root} "
                f"(no {self.ws.relative_name(main)}); `kiro loop status` lists the loops"
            )
        for backup in self._backups(task_id):
            try:
                state = self._read(backup, task_id)
            except (ValueError, OSError, safeio.UnreadableFile):
                continue
            warning = (f"{problem}; using the newest good backup {self.ws.relative_name(backup)} "
                       f"(iteration {state.iteration})")
            return LoadResult(state=state, path=main, warning=warning)
        raise StateError(f"{problem}, and no readable backup in {self.ws.relative_name(self.ws.backups_dir())}; "
                         f"move the file away to start the task afresh")

    def try_read(self, path: Path) -> LoopState | None:
        try:
            return self._read(path)
        except (ValueError, OSError, safeio.UnreadableFile):
            return None

    def all_states(self, *, include_archive: bool = True, skip: set[str] | frozenset[str] = frozenset(),
                   each: Callable[[LoopState], object] | None = None) -> list[tuple[Path, LoopState | None]]:
        """Every state file in the workspace (unreadable ones as None), newest first; task ids in
        `skip` are not read at all. `each` is handed each state as it is read, before the next one is
        read (a caller that keeps less than the whole state of every loop takes what it needs there)."""
        found: list[tuple[Path, LoopState | None]] = []
        for tid, p in self.state_files(include_archive=include_archive):
            if tid not in skip:
                st = self.try_read(p)
                if st is not None and each is not None:
                    each(st)
                found.append((p, st))
        return sorted(found, key=lambda item: item[1].updated_at if item[1] else "", reverse=True)

    def state_files(self, *, include_archive: bool = True) -> list[tuple[str, Path]]:
        """(task id, path) of every state file, the state folder's before the archive's; a task id once."""
        folders = [self.ws.state_dir]
        if include_archive:
            folders.append(self.ws.state_dir / "archive")
        seen: dict[str, Path] = {}
        for folder in folders:
            if not folder.is_dir():
                continue
            for p in folder.glob("autonomous_loop_*.json"):
                seen.setdefault(p.name[len("autonomous_loop_"):-len(".json")], p)
        return list(seen.items())

    # -- locks -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self, task_id: str, *, wait_seconds: float = 0.0) -> Iterator[None]:
        """Hold the loop's lock: one process at a time. An OS file lock (flock), so it dies with
        the process that holds it, whatever way that process ends."""
        lock = self.acquire(task_id, wait_seconds=wait_seconds)
        try:
            yield
        finally:
            self.release(task_id, lock)

    def acquire(self, task_id: str, *, wait_seconds: float = 0.0, role: str = "loop",
                write_role: bool = True) -> locks.Flock:
        """Take the loop's lock or raise LockHeld naming the holder. `role` is recorded beside the
        pid: "watch" when a `kiro loop watch` supervisor keeps a paused loop. `write_role=False`: the
        caller writes it (`set_role`) itself, with the loop's other first writes (a `StartBatch`)."""
        path = self.ws.lock_file(task_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = locks.Flock(path)
        try:
            self._take(lock, task_id, wait_seconds)
        except OSError as exc:
            raise self._lock_file_error(path, exc) from None
        if write_role:
            self.set_role(task_id, role)
        return lock

    def _take(self, lock: locks.Flock, task_id: str, wait_seconds: float) -> None:
        """`lock` taken, or LockHeld: after a wait of ENDED_HOLDER_WAIT more when its taker has ended."""
        try:
            lock.acquire(wait_seconds)
            return
        except locks.Timeout:
            pid = self.holder_pid(task_id)
        if pid is None or locks.process_exists(pid):
            raise LockHeld(task_id, pid)
        # the kiro that took it has ended (a kill -9): a child it was starting, caught between its fork and its
        # exec, holds a copy of the lock until its exec closes it, a moment later
        try:
            lock.acquire(ENDED_HOLDER_WAIT)
        except locks.Timeout:
            raise LockHeld(task_id, pid, ended_lock_file=self.ws.relative_name(Path(lock.path))) from None

    def probe_lock_file(self, path: Path) -> None:
        """A lock file kiro cannot create would make the wait for it last until its timeout: say so now."""
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise self._lock_file_error(path, exc) from None
        os.close(fd)

    def _lock_file_error(self, path: Path, exc: OSError) -> StateError:
        if exc.errno == errno.ELOOP:  # kiro's locks never follow a symlink (kiro.fs.locks.Flock)
            return StateError(f"the lock file {self.ws.relative_name(path)} is a symlink; kiro takes no lock "
                              f"through one: remove it")
        return StateError(f"cannot create the lock file {self.ws.relative(path)} ({exc.strerror}); make "
                          f"{self.ws.relative(path.parent)} a writable folder (autonomous_loop.state_directory "
                          f"in the config chooses it)")

    def set_role(self, task_id: str, role: str) -> None:
        """Write who holds the loop's lock (pid, host, role: "watch" when a `kiro loop watch`
        supervisor keeps a paused loop) into the lock file itself, in place: the holder's lock
        makes it the only writer, and no file is created per start (a `.pid` file beside the lock
        was one more new file per loop, the dearest thing a start does on a disk that scans for
        free inodes). A reader that comes between the write and the truncation reads the new
        lines first."""
        data = f"{os.getpid()}\n{socket.gethostname()}\n{role}\n".encode()
        path = self.ws.lock_file(task_id)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                os.pwrite(fd, data, 0)
                os.ftruncate(fd, len(data))
                ownwrites.note_own_write(path, os.fstat(fd))
            finally:
                os.close(fd)
        except OSError:
            # a name, not the lock: the lock is held, and the kernel's lock table names its holder. On a
            # full disk (the file's first block) the start goes on to its reserve, which says so in one line
            pass

    def _holder_lines(self, task_id: str) -> list[str]:
        try:
            return safeio.read_bytes(self.ws.lock_file(task_id), limit=4096).decode("utf-8", "replace").split()
        except (OSError, safeio.UnreadableFile):
            return []

    def holder_role(self, task_id: str) -> str | None:
        parts = self._holder_lines(task_id)
        return parts[2] if len(parts) > 2 else None

    def release(self, task_id: str, lock: locks.Flock) -> None:
        """Let the loop's lock go, and remove its file: a workspace of many finished loops keeps no
        `.lock` file per loop (the next holder makes it again; `locks.Flock.remove`)."""
        lock.clear()  # no holder named once it is let go (if the file cannot be removed)
        lock.remove()
        lock.release()

    def holder_pid(self, task_id: str) -> int | None:
        """The process holding the loop's lock. The kernel's lock table says (on Linux): a pid written
        in a file could name any process, and `kiro loop stop --force` signals this one."""
        pid = locks.holder_pid(self.ws.lock_file(task_id))
        if pid is not None:
            return pid
        parts = self._holder_lines(task_id)
        try:
            return int(parts[0]) if parts else None
        except ValueError:
            return None

    def is_locked(self, task_id: str) -> bool:
        """True when some process holds the loop's lock right now (the loop is alive). A probe: it
        never takes the lock, so it cannot make a concurrent `start` fail."""
        return locks.is_held(self.ws.lock_file(task_id))

    def locked(self, task_ids: Iterable[str]) -> set[str]:
        """Those of the loops `task_ids` whose lock some process holds right now: `is_locked` of each, the
        kernel's lock table read once for all of them (`locks.held_among`)."""
        files = {self.ws.lock_file(task_id): task_id for task_id in task_ids}
        return {files[path] for path in locks.held_among(files)}


_live_journals: weakref.WeakSet[LiveJournal] = weakref.WeakSet()  # the journals open in this process
_snapshot_cpu = 0.001  # seconds of its thread's CPU a timer's snapshot took lately (`snapshot_cpu`); a guess until one


def snapshot_cpu() -> float:
    """The CPU time (its thread's, the kernel's part with it: the fsyncs) a timer's snapshot took lately: a moving
    average of the last ~10 of any loop in this process. The timer of each of N loops waits N times this /
    SNAPSHOT_CPU_SHARE, so that all the timers' snapshots together keep to that share of a core."""
    return _snapshot_cpu


def _note_snapshot_cpu(seconds: float) -> None:
    global _snapshot_cpu
    _snapshot_cpu += (seconds - _snapshot_cpu) / 10  # writer threads race here: a lost sample is harmless


def live_journal(task_id: str) -> LiveJournal | None:
    """The open journal of loop `task_id` in this process, if any."""
    return next((j for j in list(_live_journals) if j.task_id == task_id and not j.closed), None)


class LiveJournal:
    """The journal of one loop running in this process (kiro.store.journal has the file formats).

    `prepare(state)` works out what changed since the last save (on the caller's thread: the
    loop's own task, the only writer of its state) and applies it to `shadow`, the state as
    recorded (a JSON dict), and to `encoded`, the JSON (bytes) of each item of its long lists; the
    call it returns appends the record and fdatasyncs, or writes a snapshot. A snapshot is made
    from `shadow`, never from the live model, so it is always exactly some save, also when the
    timer writes it while a step runs; its bytes are the cached pieces, written a batch at a time
    (no O(history) encoding, no string the size of the file). Locks: `shadow_lock` (held briefly,
    to change or copy out the shadow), `file_lock` (the journal's appends and truncation, the
    summary), `snap_lock` (one snapshot at a time)."""

    def __init__(self, store: StateStore, state: LoopState) -> None:
        self.store = store
        self.state_file = store.path(state.task_id)
        self.path = journal.journal_path(self.state_file)
        self.summary = journal.SummaryWriter(journal.summary_path(self.state_file))
        self.shadow_lock = threading.Lock()
        self.file_lock = threading.Lock()
        self.snap_lock = threading.Lock()
        self.fd: int | None = None
        self.shadow: dict[str, Any] | None = None
        self.encoded: dict[str, list[bytes]] = {}  # long list -> the JSON of each item, as in shadow
        self.tracked: dict[str, tuple[list[Any], int, Any]] = {}  # list -> (object, items recorded, last item)
        self.steps_seen: dict[str, tuple[Any, dict[str, Any], str | None]] = {}  # steps{} as recorded (_step_marks)
        self.seq = state.journal_seq
        self.last_snapshot = 0.0
        self.snapshot_seq = -1  # the journal_seq of the newest snapshot written
        self.snapshot_bytes = 0
        self.journal_bytes = 0
        self.journal_last_seq = 0  # the newest record appended
        self.backup_owed = False
        self.snapshot_owed = False
        self.pending: list[tuple[int, bytes]] = []  # records made, not yet appended: (seq, the line)
        self.pending_bytes = 0
        self.task_id = state.task_id
        self.task_lock = journal.task_lock(self.task_id)  # one lock a task id for the process's life
        self.timer: asyncio.TimerHandle | None = None
        self.closed = False
        self.sync_lock = threading.Lock()  # held while the files below are synced: no write overtakes them
        self.sync_fds: list[int] = []  # written files (a checked box) to fdatasync before the next write
        self.sync_error: OSError | None = None
        self.appended_iteration = 0  # `iteration` as of the last record on disk (a backup's name)
        self.ends: collections.deque[tuple[int, int]] = collections.deque(maxlen=256)  # (seq, journal size after it)
        _live_journals.add(self)

    # -- the record ------------------------------------------------------------------------

    def _track(self, state: LoopState) -> None:
        for name in journal.BIG_LISTS:
            items = getattr(state, name)
            self.tracked[name] = (items, len(items), items[-1] if items else None)
        self.steps_seen = _step_marks(state.steps)

    def _diff(self, state: LoopState, shadow: dict[str, Any]) -> dict[str, Any]:
        small = state.model_dump(mode="json", by_alias=True, exclude=_NOT_DUMPED_WHOLE)
        changed = {k: v for k, v in small.items() if k not in shadow or shadow[k] != v}
        put = self._steps_diff(state, shadow)
        if put is None:  # not expressible entry by entry: the whole dict
            changed["steps"] = {k: r.model_dump(mode="json", by_alias=True) for k, r in state.steps.items()}
        add: dict[str, Any] = {}
        keep: dict[str, int] = {}
        for name in journal.BIG_LISTS:
            items: list[Any] = getattr(state, name)
            known, recorded, last = self.tracked[name]
            new: list[Any] | None = None
            if known is items:
                if recorded == 0:
                    new = items
                else:
                    at = next((j for j in range(len(items) - 1, -1, -1) if items[j] is last), None)
                    if at is not None and at + 1 <= recorded:  # appended to, maybe trimmed at the front
                        new = items[at + 1:]
                        if at + 1 < recorded:
                            keep[name] = len(items)
            if new is None:  # replaced or rewritten: record it whole
                changed[name] = [x.model_dump(mode="json", by_alias=True) for x in items]
                keep.pop(name, None)
            elif new:
                add[name] = [x.model_dump(mode="json", by_alias=True) for x in new]
            self.tracked[name] = (items, len(items), items[-1] if items else None)
        record: dict[str, Any] = {"seq": 0, "set": changed}
        if put:
            record["put"] = {"steps": put}
        if add:
            record["add"] = add
        if keep:
            record["keep"] = keep
        return record

    def _steps_diff(self, state: LoopState, shadow: dict[str, Any]) -> dict[str, Any] | None:
        """steps{} entries added or changed since the last record (their JSON) and removed (None), in
        the order `journal.apply` puts them; None when the shadow could not follow entry by entry (a
        dict rebuilt in another order). A step's record is dropped when it succeeds, so a run that goes
        well holds one or two; with many (failed steps waiting for a retry, up to STEPS_KEPT) dumping and
        journaling all of them at every save cost ~0.15 ms and ~20 KB per save (issue #12)."""
        seen = self.steps_seen
        steps = state.steps
        old = shadow.get("steps")
        if not isinstance(old, dict) or len(old) != len(seen):
            self.steps_seen = _step_marks(steps)
            return None
        put: dict[str, Any] = {k: None for k in seen if k not in steps}
        for k, r in steps.items():
            mark = seen.get(k)
            if mark is None or mark[0] is not r or mark[1] != r.__dict__ or mark[2] != _extra_text(r):
                put[k] = r.model_dump(mode="json", by_alias=True)
        order = [k for k in old if put.get(k, 0) is not None] + [k for k in put if k not in old and put[k] is not None]
        if order != list(steps):  # an entry removed and added again moves to the end: say it all
            self.steps_seen = _step_marks(steps)
            return None
        for k, v in put.items():
            if v is None:
                del seen[k]
            else:
                seen[k] = _step_mark(steps[k])
        return put

    def _encode_lists(self, record: dict[str, Any]) -> None:
        """Keep `encoded` in step with `journal.apply(shadow, record)`."""
        for name in journal.BIG_LISTS:
            if name in record["set"]:
                self.encoded[name] = [_item_json(x) for x in record["set"][name]]
        for name, items in record.get("add", {}).items():
            self.encoded.setdefault(name, []).extend(_item_json(x) for x in items)
        for name, n in record.get("keep", {}).items():
            pieces = self.encoded.get(name, [])
            if len(pieces) > n:
                del pieces[: len(pieces) - n]

    @staticmethod
    def _drop_listed(shadow: dict[str, Any]) -> None:
        """The long lists' items are kept once, as their JSON in `encoded` (what a snapshot joins): the
        shadow (the state as recorded) holds an empty list in their place. Their dicts as well were a
        third copy of every completed step and its receipt (beside the live model and the text), ~1 KB
        a step of a loop (issue #41)."""
        for name in journal.BIG_LISTS:
            if shadow.get(name):
                shadow[name] = []

    def prepare(self, state: LoopState) -> Callable[[], None]:
        """Make the record of what changed (or owe a snapshot) now; the returned job writes what
        is pending. Any later job writes this record too: jobs are interchangeable."""
        with self.shadow_lock:
            state.bound()
            state.updated_at = timeutil.iso()
            if self.shadow is None:  # the first save: a snapshot, and a fresh journal after it
                state.journal_seq = self.seq
                self.shadow = self._clean_dump(state)
                self.encoded = {name: [_item_json(x) for x in self.shadow.get(name, [])]
                                for name in journal.BIG_LISTS}
                self._drop_listed(self.shadow)
                self._track(state)
                self.snapshot_owed = True
                return self.drain
            shadow = self.shadow
            record = self._diff(state, shadow)
            self.seq += 1
            record["seq"] = state.journal_seq = self.seq
            line = journal.dumps(record).decode("utf-8")
            clean = self.store.redact.text(line)
            if clean != line:
                line, record = clean, json.loads(clean)
            journal.apply(shadow, record)
            self._encode_lists(record)
            self._drop_listed(shadow)
            data = (line + "\n").encode("utf-8")
            self.pending.append((self.seq, data))
            self.pending_bytes += len(data)
            if ("status" in record["set"]  # a status change is in the state file at once
                    or self.journal_bytes + self.pending_bytes > max(journal.JOURNAL_MIN_BYTES, self.snapshot_bytes)):
                self.snapshot_owed = True
            else:
                self._arm_timer()  # otherwise within _interval(), off the loop's path
            return self.drain

    def _clean_dump(self, state: LoopState) -> dict[str, Any]:
        """The state as a JSON dict, redacted: what `json.loads(store.encode(state))` gives, without
        writing the indented text and parsing it back (at 10,000 completed steps ~75 of the first
        save's ~120 ms of CPU, paid by every start and resume; issue #41). The search for a secret
        runs over the compact JSON: the same strings, the same escapes."""
        data = state.model_dump(mode="json", by_alias=True)
        text = journal.dumps(data).decode("utf-8")
        clean = self.store.redact.text(text)
        return data if clean == text else dict(json.loads(clean))

    def sync_first(self, fd: int) -> None:
        """`fd` (closed here, later) must be synced before the next record or snapshot is written."""
        with self.shadow_lock:
            self.sync_fds.append(fd)

    def _sync_first(self) -> None:
        """fdatasync what `sync_first` queued, before any write that may record it. A failed sync
        fails every later write of this journal: after an fsync error the bytes may be lost, and
        a record of them must not reach the disk."""
        with self.sync_lock:
            with self.shadow_lock:
                fds, self.sync_fds = self.sync_fds, []
            for fd in fds:
                try:
                    if self.sync_error is None:
                        os.fdatasync(fd)
                except OSError as exc:
                    self.sync_error = exc
                finally:
                    os.close(fd)
            if self.sync_error is not None:
                raise OSError(self.sync_error.errno, f"could not sync the task file: {self.sync_error.strerror}")

    def backup_now(self, upto: int | None = None, iteration: int | None = None) -> None:
        """`backup_state_every_n_iterations`: the state as saved up to record `upto` (the save of
        the due iteration; None: so far), written to `.state/backups/` now, so each due iteration
        gets its own backup (the bare state file keeps its own cadence). Records saved after
        `upto` (the loop goes on while its writes are made) are left out of it, unless a snapshot
        holds them already (then the backup is that newer state, named by its iteration)."""
        self._sync_first()
        with self.snap_lock:  # no snapshot replaces the state file meanwhile
            if not self.closed and self.fd is not None and self.snapshot_seq >= 0:
                with self.file_lock:
                    size = self.journal_bytes
                    if upto is not None and self.snapshot_seq <= upto < self.journal_last_seq:
                        size = next((end for seq, end in self.ends if seq == upto), size)
                    else:
                        iteration = None
                    records = _pread_all(self.path, size)
                    if iteration is None or size == self.journal_bytes:
                        iteration = self.appended_iteration
                with contextlib.suppress(OSError):  # no hard links here: a copy, as below
                    self.store._link_backup(self.task_id, iteration, self.state_file, records)
                    return
            with self.shadow_lock:
                if self.shadow is None:
                    return
                _seq, data, _size, summary = self._snapshot_data()
        self.store._write_backup(self.task_id, summary.get("iteration") or 0, data)

    def _snapshot_data(self) -> tuple[int, list[bytes], int, dict[str, Any]]:
        """(seq, the state file's bytes in pieces, their length, the summary) of the shadow as it is now.
        Under shadow_lock. The long lists' cached items are joined a batch at a time (~100 KB pieces),
        never into one string the size of the file: a 3 MB state's text made whole, and copied four
        times on its way to the file, cost ~15 ms of CPU a snapshot on a busy machine (fresh pages
        each time), the pieces ~3 ms (issue #41)."""
        shadow = self.shadow
        assert shadow is not None
        out: list[bytes] = [b"{\n"]
        head = b"  "
        for key, value in shadow.items():
            name = head + _field_name(key)
            head = b",\n  "
            pieces = self.encoded.get(key) if isinstance(value, list) else None
            if not pieces:
                out.append(name + (b"[]" if pieces is not None else _field_value(value)))
                continue
            lead = name + b"[\n    "
            for at in range(0, len(pieces), _SNAPSHOT_BATCH):
                out.append(lead + _ITEM_SEPARATOR.join(pieces[at:at + _SNAPSHOT_BATCH]))
                lead = _ITEM_SEPARATOR
            out.append(b"\n  ]")
        out.append(b"\n}\n")
        out = _coalesced(out)  # a small state is one write, as before (each write is a kill point: SPEC §4)
        return int(shadow.get("journal_seq", 0)), out, sum(map(len, out)), journal.summary_of(shadow)

    # -- the writes ------------------------------------------------------------------------

    def drain(self) -> None:
        """Write what is pending: a snapshot when one is owed (it holds every record made so far),
        else the pending records in one append and one fdatasync."""
        self._sync_first()
        with self.shadow_lock:
            owed = self.snapshot_owed  # an owed backup waits for the next snapshot
            self.snapshot_owed = False
        if owed or self.fd is None:  # no journal file open: a rewrite (`rewrite`) that could not make it
            self._snapshot()
            return
        with self.file_lock:
            if self.closed:
                raise RuntimeError(f"the journal of {self.state_file.name} is closed")
            with self.shadow_lock:
                pending = [(n, data) for n, data in self.pending if n > self.snapshot_seq]
                self.pending, self.pending_bytes = [], 0
                summary = journal.summary_of(self.shadow) if self.shadow is not None else {}
            if pending:
                self._append(pending, summary)

    def _append(self, pending: list[tuple[int, bytes]], summary: dict[str, Any]) -> None:
        fd = self.fd
        assert fd is not None  # opened by the first snapshot
        data = b"".join(d for _n, d in pending)
        with self.task_lock:  # the write and its note are one step for kiro.executors.control
            diskfull.retry(lambda: _append_all(fd, data), self.path.name)
            st = journal.note_own_write(self.path, fd)
        os.fdatasync(fd)
        diskfull.note_low_space(fd, self.path.name, max(LOW_SPACE_BYTES, 2 * self.snapshot_bytes))
        ownwrites.note_own_write(self.path, st)  # the same write, the same stat (the sync changes neither)
        end = self.journal_bytes
        for n, line in pending:
            end += len(line)
            self.ends.append((n, end))
        self.journal_bytes += len(data)
        self.journal_last_seq = pending[-1][0]
        self.appended_iteration = summary.get("iteration") or 0
        self._summary(summary)

    def rewrite(self) -> None:
        """Somebody else (an agent) changed this loop's state file, journal or summary: write all
        three again from the shadow, the state as kiro last saved it. A snapshot holding every
        record, the journal started afresh at its path (the old one may be another file now, which
        kiro's appends would never reach) and the summary's file opened anew."""
        self._sync_first()
        _remove_folder(self.state_file)
        self._snapshot(fresh=True)

    def _snapshot(self, *, fresh: bool = False) -> None:
        """Write the shadow as the state file, then empty the journal if every record in it is in
        the snapshot. Appends go on meanwhile (a timer's snapshot of a large state does not hold the
        loop up); one snapshot at a time (`snap_lock`), so an older one never lands over a newer.
        `fresh`: the journal and summary files are made anew at their paths (`rewrite`)."""
        with self.snap_lock:
            if self.closed:
                raise RuntimeError(f"the journal of {self.state_file.name} is closed")
            self._sync_first()
            with self.shadow_lock:
                seq, data, size, summary = self._snapshot_data()
                self.pending = [(n, data) for n, data in self.pending if n > seq]  # the rest is in the snapshot
                self.pending_bytes = sum(len(data) for _n, data in self.pending)
            with self.task_lock:
                journal.note_replacing(self.state_file)
                made = self._open_before_snapshot() if self.fd is None and not fresh else None
                try:
                    atomic_write(self.state_file, data)
                except BaseException:
                    if made is not None:
                        os.close(made)
                    raise
                journal.note_own_write(self.state_file)
            with self.file_lock:
                with self.task_lock:
                    if fresh and self.journal_last_seq <= seq:  # else records after the snapshot are in it
                        self._forget_files()
                    if made is not None:  # the journal of this run starts empty: older records are in the snapshot
                        self.fd = made
                        os.ftruncate(made, 0)
                    elif self.fd is None:  # made after the snapshot: by `rewrite`, or when it could not be made before
                        self.fd = os.open(self.path, _JOURNAL_FLAGS | os.O_TRUNC, 0o644)
                        fsync_dir(self.state_file.parent)  # the journal's own name must survive a power cut
                    elif self.journal_bytes and self.journal_last_seq <= seq:
                        os.ftruncate(self.fd, 0)  # every record is in the snapshot (a later one would be lost)
                        self.journal_bytes = 0
                        self.ends.clear()
                    st = journal.note_own_write(self.path, self.fd)
                ownwrites.note_own_write(self.path, st)  # the same write, the same stat (as `_append`)
                if seq >= self.journal_last_seq:
                    self.appended_iteration = summary.get("iteration") or 0
                self.snapshot_seq = max(self.snapshot_seq, seq)
                self.snapshot_bytes = size
                self.last_snapshot = time.monotonic()
                self._summary(summary)
            if self.backup_owed:
                self.backup_owed = False
                self.store._write_backup(self.task_id, summary.get("iteration") or 0, data)

    def _open_before_snapshot(self) -> int | None:
        """The journal opened (made if missing, its bytes kept) before the first snapshot is renamed into place: the
        fsync of the folder that makes the snapshot's name durable makes the journal's so too, one fsync of `.state/`
        where there were two. Emptied once the snapshot is in place (a kill before that leaves an earlier run's
        records, which the new snapshot holds). Under the task's lock; None when it cannot be opened now (it is
        made after the snapshot, as `rewrite` makes it)."""
        try:
            fd = os.open(self.path, _JOURNAL_FLAGS, 0o644)
        except OSError:
            return None
        st = journal.note_own_write(self.path, fd)  # made while an agent may run (a rewrite's retry): kiro's own
        ownwrites.note_own_write(self.path, st)
        return fd

    def _forget_files(self) -> None:
        """Close the journal and the summary and remove them at their paths (whatever is there now),
        so that the snapshot that follows makes both anew. Under file_lock and the task's lock."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.journal_bytes = 0
        self.ends.clear()
        self.summary.close()
        for path in (self.path, self.summary.path):
            if not _remove_folder(path):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()

    def _summary(self, summary: dict[str, Any]) -> None:
        """Under file_lock (the summary's writer is not shared between threads)."""
        if summary:  # a view: when it cannot be written, status falls back to the state file
            with contextlib.suppress(OSError), self.task_lock:
                self.summary.write(summary)
                st = journal.note_own_write(self.summary.path, self.summary.fd)
                ownwrites.note_own_write(self.summary.path, st)

    # -- the timer and the end -------------------------------------------------------------

    def _interval(self) -> float:
        """How long the bare state file may lag: SNAPSHOT_SECONDS, longer for a large state (at most
        SNAPSHOT_BYTES_PER_SECOND of snapshots), so the snapshots' cost per iteration stays flat, and longer
        with many loops running in this process (their snapshots together SNAPSHOT_CPU_SHARE of a core)."""
        return max(journal.SNAPSHOT_SECONDS, self.snapshot_bytes / journal.SNAPSHOT_BYTES_PER_SECOND,
                   len(_live_journals) * snapshot_cpu() / journal.SNAPSHOT_CPU_SHARE)

    def _arm_timer(self) -> None:
        """While the journal holds what the snapshot does not, a snapshot follows within about
        `_interval()` even when no save comes (a long step): readers of the bare JSON file."""
        if self.timer is not None:
            return
        import asyncio

        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        delay = max(0.05, self._interval() - (time.monotonic() - self.last_snapshot))
        self.timer = loop.call_later(delay, self._timer_fired, loop)

    def _timer_fired(self, loop: asyncio.AbstractEventLoop) -> None:
        self.timer = None
        if not self.closed:
            writer.background(self.flush)  # not run_in_executor: its futures cost the event loop more

    def _behind(self) -> bool:
        return self.shadow is not None and (int(self.shadow.get("journal_seq", 0)) > self.snapshot_seq
                                            or self.backup_owed)

    def flush(self) -> None:
        """A snapshot now if the journal holds anything the last one does not (the timer's)."""
        with self.shadow_lock:
            if not self._behind():
                return
        began = time.thread_time()  # what it takes, for the timers' share of a core (`snapshot_cpu`)
        with contextlib.suppress(OSError, RuntimeError):  # the journal has it all; the next snapshot tries again
            self._snapshot()
            _note_snapshot_cpu(time.thread_time() - began)

    def _shared(self) -> bool:
        """The state file is also a backup's file (`StateStore._link_backup`): a run ends with a
        state file of its own, so that a later in-place write of it (a person, a tool) leaves the
        backups whole."""
        try:
            return os.stat(self.state_file).st_nlink > 1
        except OSError:
            return False

    def close(self, *, snapshot: bool = True) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        try:
            if snapshot:
                with self.shadow_lock:
                    behind = self._behind()
                if behind or self._shared():
                    self._snapshot()
        finally:
            with self.sync_lock, self.shadow_lock:
                fds, self.sync_fds = self.sync_fds, []
            for fd in fds:  # synced by the snapshot above when there was one
                with contextlib.suppress(OSError):
                    os.fdatasync(fd)
                os.close(fd)
            _live_journals.discard(self)
            with self.snap_lock, self.file_lock:
                self.closed = True
                if self.fd is not None:
                    os.close(self.fd)
                    self.fd = None
                    with contextlib.suppress(FileNotFoundError):
                        self.path.unlink()
                    ownwrites.note_own_removal(self.path)
                self.summary.close()


_JOURNAL_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
_NOT_DUMPED_WHOLE: set[str] = {*journal.BIG_LISTS, "steps"}  # LiveJournal._diff follows them piece by piece


def _remove_folder(path: Path) -> bool:
    """Remove a folder planted where one of kiro's own files goes (an agent's doing); True if there was one."""
    if os.path.isdir(path) and not os.path.islink(path):
        import shutil

        shutil.rmtree(path, ignore_errors=True)
        return True
    return False


def _extra_text(record: Any) -> str | None:
    extra = record.model_extra
    return json.dumps(extra, sort_keys=True, default=str) if extra else None


def _step_mark(record: Any) -> tuple[Any, dict[str, Any], str | None]:
    """What LiveJournal._steps_diff compares a steps{} record by: the object, its fields (immutable
    values: ints and strings), its extra keys as text."""
    return record, dict(record.__dict__), _extra_text(record)


def _step_marks(steps: dict[str, Any]) -> dict[str, tuple[Any, dict[str, Any], str | None]]:
    return {k: _step_mark(r) for k, r in steps.items()}


def _append_all(fd: int, data: bytes) -> None:
    """Append `data` whole, or not at all: a write cut short (a full disk) is taken back, so the
    retry does not leave half a record in the middle of the journal."""
    size = os.lseek(fd, 0, os.SEEK_END)  # the journal's size (O_APPEND: every write lands there)
    try:
        done = 0
        while done < len(data):
            done += os.write(fd, data[done:])
    except OSError:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, size)
        raise


def _pread_all(path: Path, size: int) -> bytes:
    """The first `size` bytes of the file at `path` (the journal's appended records)."""
    if size <= 0:
        return b""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        chunks, at = [], 0
        while at < size:
            chunk = os.pread(fd, size - at, at)
            if not chunk:
                break
            chunks.append(chunk)
            at += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _item_json(item: Any) -> bytes:
    return journal.dumps(item)


_SNAPSHOT_BATCH = 256  # items of a long list joined into one piece of a snapshot (`_snapshot_data`)
_FIELD_ENCODER = json.JSONEncoder(ensure_ascii=False)
"""What `json.dumps(value, ensure_ascii=False)` makes a new encoder for at every call: one for every snapshot's
every field (the encoder keeps nothing between calls; threads may share it)."""


def _field_value(value: Any) -> bytes:
    """A field's value as its line in a snapshot spells it: `json.dumps(value, ensure_ascii=False)`, encoded."""
    if type(value) in _SCALARS:
        return _scalar_value(value)
    return _FIELD_ENCODER.encode(value).encode("utf-8")


_SCALARS = frozenset((type(None), bool, int, float))


@functools.lru_cache(maxsize=1024, typed=True)
def _scalar_value(value: None | bool | int | float) -> bytes:
    """`_field_value` of a None, bool, int or float, kept: most of a state's fields are such values, the same few in
    every snapshot (null, false, 0, a limit), and the encoder makes its C encoder anew for each (~5 us here), where
    a string is one call of its C escaper. `typed`: 1, 1.0 and True are three values."""
    return _FIELD_ENCODER.encode(value).encode("utf-8")


@functools.lru_cache(maxsize=1024)
def _field_name(key: str) -> bytes:
    """A state field's name as it leads its line in a snapshot: the state's fields are the same few dozen each time."""
    return json.dumps(key).encode() + b": "
_ITEM_SEPARATOR = b",\n    "
_PIECE_BYTES = 1 << 17  # a snapshot's pieces are written ~this much at a time (`_coalesced`)


def _coalesced(pieces: list[bytes]) -> list[bytes]:
    """`pieces` joined into runs of about _PIECE_BYTES: the snapshot's small fields go to the file with their
    neighbours in one write, not one write each."""
    out: list[bytes] = []
    run: list[bytes] = []
    size = 0
    for piece in pieces:
        run.append(piece)
        size += len(piece)
        if size >= _PIECE_BYTES:
            out.append(b"".join(run))
            run, size = [], 0
    if run:
        out.append(b"".join(run))
    return out



def _short(exc: BaseException) -> str:
    if isinstance(exc, safeio.UnreadableFile):
        return exc.reason
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        errors = exc.errors(include_url=False)
        if errors:
            first = errors[0]
            where = ".".join(str(part) for part in first["loc"])
            more = f"; and {len(errors) - 1} more" if len(errors) > 1 else ""
            return f"{where}: {first['msg']}{more}"[:200] if where else str(first["msg"])[:200]
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
