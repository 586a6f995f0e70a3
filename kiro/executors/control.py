"""kiro's control files stay kiro's: what an external agent (the command executor) changed in
`.state/`, `.hooks/` or `config/` is found after the attempt, put back, and named (`ControlSnapshot`).
The task file is not among them; a step never writes it (SPEC §15), and a person may, while the step runs.

The task file, three ways (`StepCopy`, issue #38 item 1). Whose write is whose cannot be told from the
file once two writers have written it: no change event says which process wrote (inotify gives no pid;
fanotify's needs CAP_SYS_ADMIN), an editor's save and an agent's edit both write or rename, and timing
says nothing while the agent runs the whole time. So the two never write the same file: the agent is
told to check its box in its own copy (`.state/steps/<loop>-<step>_<hash>/<name>`, read-write in the box),
and in the box the task file itself is read-only to every step process (kiro.executors.shell.step_box),
so only a person (and kiro) writes it. After the attempt three versions are at hand: the file as the
attempt began (`base`), the agent's copy, and the task file with whatever the person did meanwhile. kiro
takes from the copy only the step's box (the engine checks it in the task file, where the person's edits
stay) and the `- [ ]` steps the agent added (a proposal in `Pending_Approval/`); anything else the agent
changed, its frontmatter above all, never reaches the task file, and the attempt fails naming it. Without
the box (`sandbox: off`) a step can write the task file; kiro then cannot tell its write from a person's:
it keeps the body (a person steers with it) and puts the frontmatter back (`TaskFiles`, for every
executor): an unboxed agent can do far worse as the person anyway.

Task files written during a step (`TaskFiles`, SPEC §15, issue #39 items 2 and 4): a task file that
appears, or whose frontmatter changes, while a step of any executor runs waits for a person's approval
(kiro.store.approval `hold_task_file`) before any loop runs it.

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

import asyncio
import contextlib
import hashlib
import itertools
import os
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Literal

from kiro.fs import safeio
from kiro.fs.diskfull import RESERVE_PREFIX
from kiro.fs.ownwrites import TEMP_SUFFIX
from kiro.fs.statcache import StatCache
from kiro.store import journal, statestore, taskmap
from kiro.store.workspace import Workspace, real_path

KEEP_BYTES = 4 * 1024 * 1024  # the most kept to restore from, over all control files
# What kiro itself (this loop, other loops, `kiro serve`, `kiro loop watch`) may write in .state/ while an
# agent runs: prompt files, process-group ledgers, message inboxes, the event index, the memory database
# (live SQLite), the history index, step-proposal markers (steps: StepCopy), the server token, the watcher's
# pid file. Not watched.
# running, running-aside: the steps' markers, and each put aside between two steps (kiro.store.approval)
STATE_KIRO_DIRS = frozenset({"prompts", "processes", "inbox", "proposals", "steps", "running", "running-aside"})
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
# a backup's name after its task id: `.<%Y%m%dT%H%M%S%f>.i<iteration>.json` (kiro.store.statestore), and its journal
# compiled when first used (re's cache): only ControlSnapshot (the command executor) asks
BACKUP_TAIL = r"\.\d{8}T\d{12}\.i\d+\.json(?:" + re.escape(journal.JOURNAL_SUFFIX) + ")?"
UNCHECKED_NAMED = 6  # of the other loops' files that changed during an attempt, named in its log
Owner = Literal["loop", "kiro"]  # this loop's file in .state/; kiro's file of another loop, or shared


@dataclass(eq=False, repr=False)
class _Entry:
    size: int
    mtime_ns: int
    data: bytes | None


@dataclass(eq=False, repr=False)
class ControlSnapshot:
    ws: Workspace
    task_id: str
    task_path: Path
    files: dict[str, _Entry] = field(default_factory=dict)
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
            mine = name.startswith(head) and re.compile(BACKUP_TAIL).fullmatch(name, len(head)) is not None
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

    def restore(self) -> list[str]:
        """Put back what the agent changed; return what it touched, one phrase each. What changed among
        the files not checked is in `unchecked` afterwards. (The task file is not among them: the agent
        edits its own copy, `StepCopy`.)"""
        live = statestore.live_journal(self.task_id)
        own = self._own_files() if live is not None else set()
        with journal.task_lock(self.task_id):  # no snapshot of this loop's state is half made meanwhile
            touched, rewrite = self._restore(own)
        if rewrite and live is not None:
            # written again from what kiro last saved, never from the bytes before the attempt: a snapshot
            # the timer made meanwhile emptied the journal, and the old bytes would lose what it held
            try:
                live.rewrite()
            except OSError as exc:
                touched.append(f"{self.ws.relative_name(self.ws.state_file(self.task_id))} could not be "
                               f"written again: {exc.strerror or exc}")
        return touched

    def _own_files(self) -> set[str]:
        """This loop's state file, journal and summary, which its open journal writes again (`rewrite`)."""
        state_file = self.ws.state_file(self.task_id)
        return {str(state_file), str(journal.journal_path(state_file)), str(journal.summary_path(state_file))}

    def _restore(self, own: set[str]) -> tuple[list[str], bool]:
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


# -- the task file: the agent's copy (three-way) and the workspace's task files ---------------------

STEP_COPIES = "steps"  # .state/steps/<loop and step>/<the task file's name>: one attempt's copy
_NEW_STEP = r"^\s*[-*]\s+\[ \]\s+(.+?)\s*$"  # compiled when first used (re's cache): StepCopy's
FRONTMATTER_READ = 64 * 1024  # of each task file, for its frontmatter
_KIRO_KEY = re.compile(rb"(?m)^kiro_task_id:.*\n")


def copy_path(ws: Workspace, task_id: str, step_id: str, task_path: Path) -> Path:
    """Where the agent of one attempt at `step_id` finds (and edits) its copy of the task file."""
    key = f"{task_id}-{step_id}"
    safe = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in key)[:60]
    return ws.state_dir / STEP_COPIES / f"{safe}_{hashlib.sha256(key.encode()).hexdigest()[:10]}" / task_path.name


@dataclass(eq=False)
class Verdict:
    """What the agent did to its copy of the task file."""

    checked: bool = False  # the step's box, `[-]` -> `[x]`
    added: list[tuple[str | None, list[str]]] = field(default_factory=list)  # (after step, `- [ ]` titles)
    touched: list[str] = field(default_factory=list)  # anything else, one phrase each: not taken


@dataclass(eq=False, repr=False)
class StepCopy:
    """The task file as one attempt's agent sees and edits it: a copy in `.state/steps/` (read-write in the
    box), while the real task file is read-only there. Three versions, never confused: the file as the
    attempt started (`base`), the agent's copy, and the real file, which only a person (and kiro) wrote
    meanwhile. After the attempt kiro takes from the copy only the step's box (the engine checks it in
    the real file) and the `- [ ]` steps the agent added (a proposal in `Pending_Approval/`); anything
    else the agent changed is named and never reaches the real file; the person's edits are never undone."""

    real: Path
    path: Path
    base: bytes

    @classmethod
    def make(cls, ws: Workspace, task_id: str, step_id: str, task_path: Path) -> StepCopy:
        path = copy_path(ws, task_id, step_id, task_path)
        base = task_path.read_bytes()
        shutil.rmtree(path.parent, ignore_errors=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base)
        return cls(task_path, path, base)

    def drop(self) -> None:
        shutil.rmtree(self.path.parent, ignore_errors=True)

    def verdict(self, step_line: int, step_box: int) -> Verdict:
        """What the agent changed in its copy, `step_line` (0-based) and `step_box` (the marker's offset)
        naming the step's box."""
        try:
            after = self.path.read_bytes()
        except OSError:
            return Verdict(touched=["its copy of the task file (deleted)"])
        if after == self.base:
            return Verdict()
        if _only_box_changed(self.base, after, step_box):
            return Verdict(checked=True)
        old, new = _text(self.base).splitlines(), _text(after).splitlines()
        close = _frontmatter_close(old)
        out = Verdict()
        lines: list[int] = []
        in_frontmatter = False
        import difflib

        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
            if tag == "equal":
                continue
            paired = min(i2 - i1, j2 - j1)  # old lines changed in place, line by line: only the box may be
            for k in range(paired):
                if i1 + k == step_line and _box_checked(old[i1 + k], new[j1 + k]):
                    out.checked = True
                else:
                    in_frontmatter = in_frontmatter or i1 + k <= close
                    lines.append(j1 + k + 1)
            if i2 - i1 > paired:  # lines the agent removed
                in_frontmatter = in_frontmatter or i1 + paired <= close
                lines.append(j1 + paired + 1)
            more = new[j1 + paired:j2]  # lines the agent added: new `- [ ]` steps are a proposal
            titles = [m.group(1) for line in more if (m := re.match(_NEW_STEP, line))]
            if more and i2 > close and len(titles) == len(more):
                out.added.append((_step_before(old, i2), titles))
            elif more:
                in_frontmatter = in_frontmatter or i2 <= close
                lines += range(j1 + paired + 1, j2 + 1)
        if lines:
            where = ", ".join(str(n) for n in lines[:8]) + (", ..." if len(lines) > 8 else "")
            what = "its frontmatter and " if in_frontmatter else ""
            out.touched.append(f"the task file: {what}lines other than the step's box (line {where} of its copy; "
                               f"not taken: the task file is as you left it)")
        return out


def _frontmatter_close(lines: list[str]) -> int:
    """The 0-based index of the frontmatter's closing line; -1 without frontmatter."""
    if not lines or lines[0].rstrip() != "---":
        return -1
    for i in range(1, len(lines)):
        if lines[i].rstrip() in ("---", "..."):
            return i
    return len(lines)


def _box_checked(old: str, new: str) -> bool:
    at = old.find("[")
    return (at >= 0 and len(old) == len(new) and old[:at + 1] == new[:at + 1] and old[at + 2:] == new[at + 2:]
            and new[at + 1] in "xX")


def _step_before(lines: list[str], index: int) -> str | None:
    """The id of the last step at or above line `index` (None: above every step)."""
    from kiro.store import tasks

    try:
        parsed = tasks.parse("\n".join(lines) + "\n")
    except Exception:
        return None
    before = [s for s in parsed.steps if s.line < index]
    return before[-1].id if before else None


# The frontmatter of each task file as last read (kiro.fs.statcache: read again only when the file changed, by
# git's racily-clean rule): the look around every step of every loop (`TaskFiles`) reads again only what changed
# since, not every task file of the workspace twice a step (with a thousand loops that was most of their time:
# issue #41). A step that rewrites a frontmatter and puts the mtime back still moves the ctime: read again.
_read: StatCache[bytes | None] = StatCache(most=20_000)  # each of at most KEPT_BYTES: 80 MB at worst
KEPT_BYTES = 4096  # a longer frontmatter (or a file without its closing line) is read at every look


def _frontmatter(path: str, st: os.stat_result | None = None) -> bytes | None:
    """`_frontmatter_bytes(path)`, read again only when the file changed since it was last read."""
    try:
        st = st if st is not None else os.stat(path)
    except OSError:
        return None
    return _read.read(path, st, lambda: _frontmatter_bytes(path), keep=_small)


def _small(data: bytes | None) -> bool:
    return data is None or len(data) <= KEPT_BYTES


def _frontmatter_bytes(path: str) -> bytes | None:
    """The frontmatter block of the file at `path` (first line `---` to its closing line), b"" without
    one; None when it cannot be read or is no regular file (a FIFO named `*.md` in Done/ is not waited on:
    opening it to read would block the loop until something writes into it)."""
    try:
        fd = safeio.open_regular(path)
    except (OSError, safeio.UnreadableFile):
        return None
    try:
        head = os.pread(fd, FRONTMATTER_READ, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    text = head.removeprefix(b"\xef\xbb\xbf")
    if not text.startswith(b"---"):
        return b""
    end = re.search(rb"\n(?:---|\.\.\.)[ \t]*\r?(?:\n|$)", text)
    block = text[: end.end()] if end else text
    return _KIRO_KEY.sub(b"", block)  # kiro's own key (kiro.core.runner keeps a person's `kiro_task_id` current)


FileSeen = tuple[str, str, "os.stat_result | None", "bytes | None"]  # path found, real path, stat, frontmatter
_serials = itertools.count()


@dataclass(frozen=True, eq=False)
class Look:
    """The workspace's task files at one instant, as a step's look before or after it needs them (`TaskFiles`):
    each file's path, real path, stat and frontmatter (`files`), and, when `moved`, the frontmatter of each file
    in Done/ and Needs_Action/ by inode (`moved_in`). `boxed`: only the files whose real path lies outside
    Specs/ (read-only to a boxed step). One look serves every loop of the process that asks in the same
    instant (`shared_look`)."""

    files: tuple[FileSeen, ...]
    moved_in: dict[tuple[int, int], bytes | None] | None
    serial: int = field(default_factory=lambda: next(_serials), init=False, compare=False)  # names it (`TaskFiles`)

    @classmethod
    def now(cls, ws: Workspace, *, boxed: bool) -> Look:
        from kiro.store.workspace import markdown_names, task_names

        specs = real_path(os.fspath(ws.specs)) + os.sep if boxed else ""  # unboxed, every file is looked at
        files: list[FileSeen] = []
        for path, real in task_names(ws, in_specs=not boxed):
            if boxed and real.startswith(specs):
                continue
            try:
                st: os.stat_result | None = os.stat(real)
            except OSError:
                st = None
            files.append((path, real, st, _frontmatter(real, st) if st is not None else None))
        moved_in: dict[tuple[int, int], bytes | None] | None = None
        if not boxed or files:  # boxed with no file outside Specs/: no file a step could write (see `take`)
            moved_in = {}
            for folder in (ws.done, ws.needs_action):
                for found in markdown_names(folder):
                    with contextlib.suppress(OSError):
                        st = os.stat(found)
                        moved_in[(st.st_dev, st.st_ino)] = _frontmatter(found, st)
        return cls(tuple(files), moved_in)

    def own(self, path: Path) -> tuple[str, bytes | None]:
        """(its real path, its frontmatter) of the task file at `path`, as this look found it: a file the look
        did not find (boxed: the files in Specs/ are not read) has the real path it has now and no frontmatter."""
        found = self._by_path.get(os.fspath(path))
        return (found[1], found[3]) if found is not None else (real_path(os.fspath(path)), None)

    @cached_property
    def _by_path(self) -> dict[str, FileSeen]:
        """`files` by path, made once a look: one look serves every loop of the process (`shared_look`), and
        each asks it for its own file."""
        by_path: dict[str, FileSeen] = {}
        for seen in self.files:
            by_path.setdefault(seen[0], seen)
        return by_path

    @cached_property
    def frontmatters(self) -> dict[str, bytes | None]:
        """Each file's frontmatter by its real path, made once a look: every loop that took this look before its
        step compares with it (`TaskFiles.take`), read-only."""
        return {real: seen for _path, real, _st, seen in self.files}

    @cached_property
    def changed(self) -> dict[int, tuple[FileSeen, ...]]:
        """By the `serial` of a look before: the files of this look that differ from it (`TaskFiles.check`),
        found once for every loop that took the same look before its step and this one after."""
        return {}


# The looks asked for and not taken yet, by (workspace, boxed): every loop of this process whose step ended (or
# is about to begin) in one turn of the event loop waits for the same look, taken once at the next turn, after
# all of them asked (issue #41: a look per loop per step cost each step a walk of every loop's task file, with
# a thousand loops most of their time). A look taken after a step ended sees all its writes, one taken before a
# step began none of them: sharing it takes nothing from SPEC §15.
_asked: dict[tuple[str, bool], asyncio.Future[Look]] = {}


async def shared_look(ws: Workspace, *, boxed: bool) -> Look:
    """A look at the workspace's task files (`Look.now`) taken after this call, shared with every other caller
    of the same turn of the event loop."""
    loop = asyncio.get_running_loop()
    key = (os.fspath(ws.root), boxed)
    asked = _asked.get(key)
    if asked is None or asked.get_loop() is not loop:
        asked = _asked[key] = loop.create_future()
        loop.call_soon(_take_look, key, asked, ws, boxed)
    return await asyncio.shield(asked)


def _take_look(key: tuple[str, bool], asked: asyncio.Future[Look], ws: Workspace, boxed: bool) -> None:
    if _asked.get(key) is asked:
        del _asked[key]
    try:
        look = Look.now(ws, boxed=boxed)
    except BaseException as exc:  # every waiter gets it, as each got it from its own look before
        asked.set_exception(exc)
        if not isinstance(exc, Exception):
            raise
        return
    asked.set_result(look)


@dataclass(eq=False, repr=False)
class TaskFiles:
    """The workspace's task files (`Specs/`, `.kiro/specs/*/tasks.md`, and `Done/`, `Needs_Action/` for files
    moved back) as a step starts, for every executor: after the step (and after verify), a task file that
    appeared, or whose frontmatter changed, is held for a person's approval (`approval.hold_task_file`: no
    loop runs it until then), and the loop's own file gets its frontmatter back when the step ran unboxed
    (boxed, the file is read-only to the step: what changed there is a person's).

    A file at a new path is not new when its inode was known with the same frontmatter outside `Specs/`
    and `.kiro/specs/` (a person or kiro moved it back from `Done/` or `Needs_Action/`, which a boxed step
    cannot write)."""

    ws: Workspace
    own: Path
    by_path: dict[str, bytes | None] = field(default_factory=dict)
    moved_in: dict[tuple[int, int], bytes | None] = field(default_factory=dict)
    boxed: bool = False
    since: int | None = None  # the `serial` of the look `by_path` and `moved_in` come from (`take`): read-only

    @classmethod
    def take(cls, ws: Workspace, own: Path, *, boxed: bool = False, look: Look | None = None) -> TaskFiles:
        """The look before a step (`look`, taken before it began; else one now). `boxed`: the step runs in the
        box, where Specs/ is read-only: only the task files whose real path lies elsewhere (`.kiro/specs/`, a
        link in Specs/ to a file in the project) are read, and the files in Done/ and Needs_Action/ only when
        there is one (a file a person moves from there during the step into a `.kiro/specs/` that had no task
        file is held, as a new one)."""
        look = look if look is not None else Look.now(ws, boxed=boxed)
        return cls(ws, own, look.frontmatters, look.moved_in or {}, boxed=boxed, since=look.serial)

    def check(self, *, boxed: bool, task_id: str, step_id: str, look: Look | None = None) -> list[str]:
        """After a step process ran: hold what it planted or changed, put back the loop's own frontmatter
        (unboxed); returns what was done, one line each, for a warning. `look`: one taken after the step
        ended, boxed as `boxed or self.boxed` (else one now). Once: the next step takes a fresh look (`take`),
        since what a person writes between two steps is theirs."""
        from kiro.store import approval

        said: list[str] = []
        boxed = self.looks_boxed(boxed)
        look = look if look is not None else Look.now(self.ws, boxed=boxed)
        own, now = look.own(self.own)  # the look's own read of it: the file is not opened again for this
        before = self.by_path.get(own)
        if not boxed and before is not None:
            if now is not None and now != before:
                with contextlib.suppress(OSError):
                    raw = Path(own).read_bytes()
                    bom = b"\xef\xbb\xbf" if raw.startswith(b"\xef\xbb\xbf") else b""
                    _write_back(Path(own), bom + before + raw[len(bom) + len(now):], None)
                    said.append(f"{self.ws.relative(self.own)}: its frontmatter changed while step {step_id} ran "
                                f"unboxed; kiro put it back (a step never sets a task's settings)")
        for found, real, _st, _now in self._changed(look):  # boxed: none in Specs/ (read-only: a change is a person's)
            if real == own:
                continue
            path = Path(found)
            try:  # read again: a look shared with other loops was taken before their checks (their own files put back)
                st = os.stat(real)
            except OSError:
                continue
            if self._unchanged(real, st, _frontmatter(real, st)):
                continue
            if approval.held_by(self.ws, path) is not None:
                continue
            why = "created" if real not in self.by_path else "changed (its frontmatter)"
            note = approval.hold_task_file(self.ws, path, task_id=task_id, step_id=step_id, why=why)
            said.append(f"{self.ws.relative(path)} was {why} while step {step_id} ran: no loop runs it until a "
                        f"person approves it ({self.ws.relative(note)})")
        return said

    def _changed(self, look: Look) -> tuple[FileSeen, ...]:
        """The files of `look` (taken after the step) that the look before it did not find as they are, each
        compared once for all the loops that took the same two looks (issue #41: with a thousand loops, every
        loop compared every task file of the workspace, a thousand times a turn)."""
        found = look.changed.get(self.since) if self.since is not None else None
        if found is None:
            found = tuple(seen for seen in look.files
                          if seen[2] is not None and not self._unchanged(seen[1], seen[2], seen[3]))
            if self.since is not None:
                look.changed[self.since] = found
        return found

    def _unchanged(self, real: str, st: os.stat_result, now: bytes | None) -> bool:
        """The file at `real` (stat'ed as `st`, its frontmatter `now`) is as the look before the step found it, or
        was moved back from Done/ or Needs_Action/ as it was there."""
        if real in self.by_path:
            return self.by_path[real] == now
        return self.moved_in.get((st.st_dev, st.st_ino), b"\0") == now  # moved back from Done/ or Needs_Action/

    def looks_boxed(self, boxed: bool) -> bool:
        """Whether the look after the step is a boxed one: the step ran boxed, or the look before it was taken
        boxed (Specs/ was not read: the step's box is the one it began in)."""
        return boxed or self.boxed
