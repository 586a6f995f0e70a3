"""The status index (issue #12): `.state/status_index`, what `kiro loop status` showed last time, so
that over 1,000 loops it costs a directory scan and a `stat` per loop instead of reading and
decoding 1,000 summaries.

A cache written by the fast read path (kiro.fastread) after it answered `status` (exit 0), read by the
next one. Standard library only. Nothing in it is ever the only record of anything: a missing, torn,
foreign or stale index costs the full scan, never a different answer.

What it holds (JSON, one object):
- `head`: what every row depends on beside its loop's files: the format, kiro's version and the
  size+mtime of the modules that make rows and the table (fastread, console, status, timeutil, this
  one), the state folder, and whether the global stop hook exists. Any difference: the index is
  ignored and rewritten.
- `rows`: per summary file, `[key, row, may_be_alive]`: the file's (mtime_ns, ctime_ns, size, inode,
  device) when the row was made, and the row (kiro.fastread.loop_row) as of a loop that holds no lock.
  A row is reused only when its file's key is exactly the same and, for a loop whose recorded status
  may be alive, its lock is still free. A row is written to the index only when it is a pure
  function of the file: from a valid summary, no schedule (its next run depends on the clock), not
  alive, and the file last changed more than RACY_NS before the scan began (a rewrite within the same
  clock tick as the read could keep mtime and size: such a file is read again each time, as git
  does with "racily clean" entries). ctime is in the key: setting the mtime back does not hide a
  change.
- `out`: the rendered table (and `--json` text) with the order of the files it was made from, reused
  only when every row came from the index unchanged, in the same order, with the same terminal width.
"""

from __future__ import annotations

import json
import os
import sys
import time
from functools import partial

from kiro import fastread

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

NAME = "status_index"
FORMAT = 1
RACY_NS = 1_000_000_000
CODE = ("fastread.py", "console.py", "status.py", "timeutil.py", "statusindex.py")


def _code_key() -> list[Any]:
    from kiro import __version__

    here = os.path.dirname(os.path.abspath(fastread.__file__))
    key: list[Any] = [FORMAT, __version__, sys.hexversion]
    for name in CODE:
        st = os.stat(os.path.join(here, name))
        key += [st.st_mtime_ns, st.st_size]
    return key


def _file_key(st: os.stat_result) -> list[int]:
    return [st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino, st.st_dev]


MAGIC = b"kiro-status-index 2"


class StatusIndex:
    """One status command's use of the index: `output` (the whole answer, when nothing changed), else
    `row` per loop and `text`, then `save`.

    The file: a first line MAGIC; a line of JSON {"head", "keys": {summary path: [key, may_be_alive]},
    "out": {kind: [order, start, end]}}; a line of JSON {summary path: row}; then the rendered outputs,
    as they are printed, one after the other (`start`:`end` are byte offsets into that section). A hit
    decodes only the first line of JSON and slices its text."""

    def __init__(self, state_dir: str, global_hook: bool) -> None:
        self.path = os.path.join(state_dir, NAME)
        self.started_ns = time.time_ns()
        try:
            self.head: list[Any] | None = [_code_key(), state_dir, global_hook]
        except OSError:  # kiro's sources are not where they should be: no index
            self.head = None
        self.raw = b""
        self.lines: list[bytes] = []
        self.meta: dict[str, Any] = {}
        self._old_rows: dict[str, Any] | None = None
        self.rows: dict[str, Any] = {}  # summary path -> row, for the next index
        self.keys: dict[str, Any] = {}  # summary path -> [key, may_be_alive]
        self.order: list[str] = []
        self.all_cached = True
        self.out: dict[str, str] = {}
        if self.head is None:
            return
        try:
            with open(self.path, "rb") as fh:
                self.raw = fh.read()
            self.lines = self.raw.split(b"\n", 3)
            meta = json.loads(self.lines[1]) if self.lines[0] == MAGIC else None
        except (OSError, ValueError, IndexError):
            return
        if (type(meta) is dict and meta.get("head") == self.head and type(meta.get("keys")) is dict
                and type(meta.get("out")) is dict):
            self.meta = meta

    @staticmethod
    def summary_path(state_path: str) -> str:
        return state_path[:-5] + ".summary"

    def _key_holds(self, spath: str, old: Any, lock_free: Callable[[], bool]) -> bool:
        if type(old) is not list or len(old) != 2:
            return False
        try:
            st = os.stat(spath)
        except OSError:
            return False
        return (old[0] == [st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino, st.st_dev]
                and (not old[1] or lock_free()))

    def output(self, kind: str, entries: list[tuple[str, str]], lock_free: Callable[[str], bool]) -> str | None:
        """The last answer of `kind`, when it was made from exactly these loops' files, each unchanged
        since (and each lock that mattered still free); else None."""
        if not self.meta or not entries:
            return None
        out = self.meta["out"].get(kind)
        if type(out) is not list or len(out) != 3 or type(out[0]) is not list or len(out[0]) != len(entries):
            return None
        keys = self.meta["keys"]
        for (tid, path), seen in zip(entries, out[0], strict=True):
            spath = path[:-5] + ".summary"
            if spath != seen or not self._key_holds(spath, keys.get(spath), partial(lock_free, tid)):
                return None
        return self._text(out)

    def _text(self, out: list[Any]) -> str | None:
        """A kept output: [order, start, end], bytes of the section after the rows."""
        if len(out) != 3 or type(out[1]) is not int or type(out[2]) is not int or len(self.lines) != 4:
            return None
        section = self.lines[3]
        if not 0 <= out[1] <= out[2] <= len(section):
            return None
        try:
            return section[out[1]:out[2]].decode("utf-8")
        except UnicodeDecodeError:
            return None

    def row(self, tid: str, state_path: str, make: Callable[[], tuple[dict[str, Any], bool]],
            lock_free: Callable[[], bool]) -> dict[str, Any]:
        """The row of one loop: from the index when its summary is unchanged (and its lock still free,
        if that matters), else `make()` -> (row, made from a valid summary)."""
        spath = state_path[:-5] + ".summary"
        self.order.append(spath)
        old = self.meta.get("keys", {}).get(spath) if self.meta else None
        if old is not None and self._key_holds(spath, old, lock_free):
            row = self._old_rows_map().get(spath)
            if type(row) is dict and row.get("task_id") == tid:
                self.rows[spath], self.keys[spath] = row, old
                return row
        self.all_cached = False
        try:
            st: os.stat_result | None = os.stat(spath)  # before the read: a change after it shows next time
        except OSError:
            st = None
        row, from_summary = make()
        if (st is not None and from_summary and row.get("schedule") is None and not row["alive"]
                and st.st_mtime_ns < self.started_ns - RACY_NS and st.st_ctime_ns < self.started_ns - RACY_NS):
            self.rows[spath] = row
            self.keys[spath] = [_file_key(st), bool(fastread._status_of(row["recorded_status"]).may_be_alive)]
        return row

    def _old_rows_map(self) -> dict[str, Any]:
        if self._old_rows is None:
            try:
                rows = json.loads(self.lines[2])
            except (ValueError, IndexError):
                rows = None
            self._old_rows = rows if type(rows) is dict else {}
        return self._old_rows

    def text(self, kind: str, make: Callable[[], str]) -> str:
        """The rendered output of `kind` (made now; kept for next time when every row may be reused)."""
        text = make()
        if self.order and len(self.rows) == len(self.order):
            self.out[kind] = text
        return text

    def save(self) -> None:
        """Write the index if it says something new (a cache: no fsync; a failure is ignored)."""
        if self.head is None:
            return
        texts = dict(self.out)
        if self.all_cached and self.meta and len(self.rows) == len(self.order):  # the other kinds' texts still hold
            for kind, out in self.meta["out"].items():
                if kind not in texts and type(out) is list and out and out[0] == self.order:
                    text = self._text(out)
                    if text is not None:
                        texts[kind] = text
        kinds = sorted(texts)
        section = [texts[k].encode("utf-8") for k in kinds]
        spans, at = {}, 0
        for kind, blob in zip(kinds, section, strict=True):
            spans[kind] = [self.order, at, at + len(blob)]
            at += len(blob)
        meta = {"head": self.head, "keys": self.keys, "out": spans}
        dump = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
        data = b"\n".join([MAGIC, dump(meta).encode(), dump(self.rows).encode(), b"".join(section)])
        if data == self.raw:
            return
        folder = os.path.dirname(self.path)
        tmp = os.path.join(folder, f".{NAME}.{os.getpid()}-{os.urandom(4).hex()}.kiro.tmp")  # kiro.fsutil's name
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass
