"""The state journal (issue #12): what a running loop's state costs per iteration stays flat,
however many steps it has done and however large its task file is.

A live loop's state is kept in three files beside each other in `.state/`:

    autonomous_loop_<id>.json      the snapshot: SPEC §4's state file, a complete LoopState as JSON,
                                   with `journal_seq`, the last journal record it includes
    autonomous_loop_<id>.journal   append-only JSON lines, one per save since that snapshot:
                                   {"seq": N, "set": {field: value}, "put": {dict: {key: value
                                    or null to remove}}, "add": {list: [items]},
                                    "keep": {list: length}}; each append is fdatasync'd before
                                   the save returns (0.06 ms here, against ~1 ms for a rename)
    autonomous_loop_<id>.summary   what `kiro loop status` shows, rewritten in place on every save
                                   (no fsync: it is a view; the journal is the record)

The state of a loop is the snapshot with the journal records after its `journal_seq` applied in
order (`replay`). Every kiro reader goes through `read_state_dict` (StateStore does), so it always
sees the last save. The snapshot itself is rewritten (temp file, fsync, rename, fsync the folder)
when the status changes, at the loop's first and last save, when the journal has grown as large
as the snapshot, and otherwise by a timer SNAPSHOT_SECONDS (longer for a large state, see
SNAPSHOT_BYTES_PER_SECOND, and with many loops in one process, SNAPSHOT_CPU_SHARE) after a save it
does not hold yet, on a worker thread while the loop goes on: a reader of the bare JSON file is never
more than about that far behind, and never sees a torn file.
A kill can tear only the journal's last line; replay stops at the first line that is not a
whole record, which was never acknowledged.

The summary file (`read_summary`; `kiro loop status` reads it instead of each loop's whole state):

    line 1: "kiro-summary 1 <crc32 of the JSON, 8 hex digits> <length of the JSON in bytes>"
    line 2: the JSON object (SUMMARY_FIELDS of the state, `current_step` as {step_id, description,
            status}, `metrics`, `usage`), then spaces up to the file's previous length

A reader that finds a CRC mismatch (it read during a write) reads again; after a few tries, or
with no summary file, it reads the state file instead. This module imports the standard library
and pydantic_core's JSON encoder (`dumps`), which writes the journal's records and the summary.

The bare `.json` of a running loop (or of one killed mid-run) may lack its last saves;
`read_state_dict(state_file)` gives the state as kiro sees it, and `read_summary(state_file)` what
`kiro loop status` shows (written on every save by the journal and by whole-file saves; kiro.views.loops
reads it).
"""

from __future__ import annotations

import functools
import json
import os
import threading
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pydantic_core import to_json

from kiro import jsonl

JOURNAL_SUFFIX = ".journal"
SUMMARY_SUFFIX = ".summary"
SUMMARY_MAGIC = b"kiro-summary 1 "
SNAPSHOT_SECONDS = 1.0
"""How stale the bare JSON state file may get while a loop runs (kiro's own readers replay the
journal and are never stale)."""
SNAPSHOT_BYTES_PER_SECOND = 1024 * 1024
"""...longer for a large state: at most this many bytes of snapshot a second (a 3 MB state, 10,000
completed steps: one every 3 s), so that what snapshots cost per iteration does not grow with history."""
SNAPSHOT_CPU_SHARE = 0.025
"""...and longer with many loops in one process: the timer's snapshots of all the process's running
loops together take at most this share of one core (a fortieth), by what one took lately (its thread's
CPU: a temp file, an fsync, a rename and an fsync of the folder; 1.0-1.3 ms here for a small state while
1,000 loops run). So with N loops a bare JSON file is at most ~N x 40 snapshots' CPU behind: 1,000 loops
here ~40-50 s, less where a snapshot costs less; kiro's own readers never are. At 100 a second (the count
this replaced, session 36) they were one a model call with 1,000 loops, a third of the writer threads' CPU."""
JOURNAL_MIN_BYTES = 256 * 1024
"""The journal is folded into a new snapshot once it is larger than the snapshot and this."""
BIG_LISTS = ("completed_steps", "failed_steps", "history")
"""Lists the journal appends to rather than rewrites."""
SUMMARY_FIELDS = (
    "task_id", "task_path", "title", "status", "stop_reason", "stop_message", "started_at", "updated_at", "finished_at",
    "iteration", "max_iterations", "consecutive_failures", "failure_threshold", "total_failures",
    "total_successes", "steps_done", "steps_total", "executor", "pid", "host", "workspace", "report_path",
    "sleep_until", "sleep_note", "timeout_reached", "runs", "metrics", "usage", "journal_seq",
    "billing",  # the credential the loop's agent bills (the dashboard shows it)
    "last_run_at", "next_run_at", "schedule",  # a scheduled task's runs and next run (SPEC §11, kiro.core.schedule)
    "timeout_seconds",  # the run-time limit `status` suggests doubling (`resume --timeout`), as Dashboard.md does
)
READ_LIMIT = 64 * 1024 * 1024


def dumps(value: Any) -> bytes:
    """`value` as compact JSON in UTF-8: what `json.dumps(value, ensure_ascii=False, separators=(",", ":"))`
    writes, encoded, but for how a float under 1e-4 is spelled (`0.00001` for `1e-05`: the same number).
    pydantic's encoder, not Python's: 3 to 5 times less CPU for a step's record and its summary (issue #41)."""
    return to_json(value, inf_nan_mode="constants")


def journal_path(state_file: Path) -> Path:
    return state_file.with_suffix(JOURNAL_SUFFIX)


def summary_path(state_file: Path) -> Path:
    return state_file.with_suffix(SUMMARY_SUFFIX)


# -- kiro's own writes while a step runs -----------------------------------------------------------

_OWN_KEPT = 4096
_own: OrderedDict[str, tuple[int, int] | None] = OrderedDict()
_own_lock = threading.Lock()


def note_own_write(path: Path | str, fd: int | None = None) -> os.stat_result | None:
    """Record that kiro itself just wrote `path` (or deleted it), so that the command executor's
    check of kiro's control files (kiro.executors.control) does not take a snapshot or journal write
    made while an agent runs (the timer's) for the agent's doing. Returns the file's stat (None when
    it is gone), for `ownwrites.note_own_write` to note the same write without another."""
    key = _key(path)
    st: os.stat_result | None
    try:
        st = os.fstat(fd) if fd is not None else os.stat(key)
        seen: tuple[int, int] | None = (st.st_size, st.st_mtime_ns)
    except FileNotFoundError:
        st = seen = None
    _note(key, seen)
    return st


def note_own_removal(path: Path | str) -> None:
    """`note_own_write` of a file kiro just removed (a pruned backup): no stat to ask."""
    _note(_key(path), None)


@functools.lru_cache(maxsize=_OWN_KEPT)
def _key(path: Path | str) -> str:
    """A path's key in the notes: normalized by its text alone (no file system, no working directory), so
    the same path always gives the same key (a loop's journal and summary, noted at every save)."""
    return os.path.normpath(os.fspath(path))


def _note(key: str, seen: tuple[int, int] | None) -> None:
    with _own_lock:
        _own[key] = seen
        _own.move_to_end(key)
        while len(_own) > _OWN_KEPT:
            _own.popitem(last=False)


_task_locks: dict[str, threading.Lock] = {}


def task_lock(task_id: str) -> threading.Lock:
    """Held by each write kiro makes to a loop's files in `.state/` (snapshot, append, truncation,
    summary, backup) from the write to its `note_own_write`, and by the command executor's check of
    the control files, so that the check never sees one of kiro's writes before it is noted (it
    would take it for the agent's and write the file back). The innermost lock: nothing is taken
    while it is held but the notes' own."""
    with _own_lock:
        return _task_locks.setdefault(task_id, threading.Lock())


_overwritten: set[str] = set()


def note_replacing(path: Path | str) -> None:
    """Called under the task's lock just before kiro replaces `path`, a file it wrote before (the
    timer's snapshot of the state file while an agent runs). When the file is no longer as kiro's
    last write left it, somebody else changed it meanwhile; kiro's write puts it back, and the
    command executor's check (`take_overwritten`) still names the change. Without this an agent's
    edit that the timer happened to write over went unsaid (found by a CI run under load)."""
    key = os.path.normpath(os.fspath(path))
    with _own_lock:
        if key not in _own:
            return
    try:
        st = os.stat(key)
        now: tuple[int, int] | None = (st.st_size, st.st_mtime_ns)
    except FileNotFoundError:
        now = None
    if not own_write(key, now):
        with _own_lock:
            _overwritten.add(key)


def take_overwritten(paths: Iterable[str]) -> set[str]:
    """Which of `paths` kiro wrote over after somebody else had changed them (`note_replacing`),
    since the last call that named them; forgotten once said."""
    with _own_lock:
        if not _overwritten:
            return set()
        found = {os.path.normpath(p) for p in paths} & _overwritten
        _overwritten.difference_update(found)
        return found


def own_write(path: Path | str, now: tuple[int, int] | None) -> bool:
    """True when `path` is as kiro's own last write (or deletion) of it left it."""
    key = os.path.normpath(os.fspath(path))
    with _own_lock:
        return key in _own and _own[key] == now


# -- replay --------------------------------------------------------------------------------------


def apply(state: dict[str, Any], record: dict[str, Any]) -> None:
    """Apply one journal record to a state dict (the JSON form of a LoopState)."""
    for key, value in record.get("set", {}).items():
        state[key] = value
    for key, entries in record.get("put", {}).items():  # a dict's entries set (a value) or removed (null)
        current = state.get(key)
        if not isinstance(current, dict):
            current = state[key] = {}
        for name, value in entries.items():
            if value is None:
                current.pop(name, None)
            else:
                current[name] = value
    for key, items in record.get("add", {}).items():
        current = state.get(key)
        if not isinstance(current, list):
            current = state[key] = []
        current.extend(items)
    for key, keep in record.get("keep", {}).items():
        current = state.get(key)
        if isinstance(current, list) and len(current) > keep:
            del current[: len(current) - keep]
    state["journal_seq"] = record["seq"]


def replay(state: dict[str, Any], journal: bytes) -> bool:
    """Apply the journal's records after the snapshot's `journal_seq` to `state`, in order. Stops at
    the first line that is not a whole record (a torn last append). Returns False when the journal
    does not follow on from the snapshot (a snapshot written since the journal was read: read both
    again)."""
    base = state.get("journal_seq", 0)
    seq = base if isinstance(base, int) else 0
    lines = journal.split(b"\n")
    for line in lines[:-1]:  # what follows the last newline is an unfinished append
        record = jsonl.record(line)
        if record is None or not isinstance(record.get("seq"), int):
            break
        if record["seq"] <= seq:
            continue  # already in the snapshot
        if record["seq"] != seq + 1:
            return False
        apply(state, record)
        seq = record["seq"]
    return True


def _read(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            total += len(chunk)
            if total > READ_LIMIT:
                raise ValueError(f"{path.name} is over {READ_LIMIT >> 20} MiB")
    finally:
        os.close(fd)


def with_journal(state_file: Path, snapshot: bytes, reread: Callable[[], bytes] | None = None) -> dict[str, Any]:
    """The state dict of `state_file` whose bytes are `snapshot`: the snapshot with its journal
    replayed. Raises ValueError when the snapshot is not a JSON object."""
    state: dict[str, Any] = {}
    for _ in range(3):
        loaded = json.loads(snapshot)
        if not isinstance(loaded, dict):
            raise ValueError("not a JSON object")
        state = loaded
        try:
            journal = _read(journal_path(state_file))
        except FileNotFoundError:
            return state
        if replay(state, journal):
            return state
        snapshot = reread() if reread is not None else _read(state_file)
    return state


def read_state_dict(state_file: Path) -> dict[str, Any]:
    """The current state of a loop as a dict: its state file with the journal replayed."""
    return with_journal(state_file, _read(state_file))


# -- the summary ----------------------------------------------------------------------------------


def summary_of(state: dict[str, Any]) -> dict[str, Any]:
    out = {k: state.get(k) for k in SUMMARY_FIELDS}
    cur = state.get("current_step")
    out["current_step"] = ({k: cur.get(k) for k in ("step_id", "description", "status")}
                           if isinstance(cur, dict) else None)
    return out


def encode_summary(summary: dict[str, Any]) -> bytes:
    body = dumps(summary)
    return SUMMARY_MAGIC + f"{zlib.crc32(body):08x} {len(body)}\n".encode() + body + b"\n"


def decode_summary(data: bytes) -> dict[str, Any] | None:
    """The summary in `data`, or None when it is torn (read during a write) or not a summary."""
    if not data.startswith(SUMMARY_MAGIC):
        return None
    head, _, rest = data.partition(b"\n")
    parts = head[len(SUMMARY_MAGIC):].split()
    try:
        crc, length = int(parts[0], 16), int(parts[1])
    except (IndexError, ValueError):
        return None
    body = rest[:length]
    if len(body) != length or zlib.crc32(body) != crc:
        return None
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def read_summary(state_file: Path, tries: int = 3) -> dict[str, Any] | None:
    """The summary beside `state_file`, or None: read the state instead (no summary, torn on every
    try, or older than the state file, which kiro writes before the summary: something else wrote
    the state since)."""
    path = summary_path(state_file)
    try:
        if os.stat(path).st_mtime_ns < os.stat(state_file).st_mtime_ns:
            return None
    except OSError:
        return None
    for _ in range(tries):
        try:
            data = _read(path)
        except (OSError, ValueError):
            return None
        found = decode_summary(data)
        if found is not None:
            return found
    return None


class SummaryWriter:
    """Rewrites one summary file in place: pwrite at 0, padded with spaces to the previous length
    (no truncate, no rename, no fsync)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None
        self.size = 0

    def write(self, summary: dict[str, Any]) -> None:
        data = encode_summary(summary)
        if self.fd is None:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
            self.size = os.fstat(self.fd).st_size
        if len(data) < self.size:
            data += b" " * (self.size - len(data))
        os.pwrite(self.fd, data, 0)
        self.size = max(self.size, len(data))

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
