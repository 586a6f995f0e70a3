"""Task files: parse a Kiro `tasks.md` checklist and edit its checkboxes atomically.

A person owns the task file and may edit it while a loop runs (SPEC §2). So this module is
built around two promises:

* **Parsing is forgiving and positional.** Real files (see the corpus notes) mix tabs and spaces,
  CRLF, runs of blank lines, duplicate step lines, optional markers written `[ ]*` or `[ ]\\*`,
  code blocks with checkbox-looking lines, frontmatter (read and written by kiro.store.frontmatter), and
  flat lists whose sub-steps are not indented (`- [ ] 2.1` right under `- [ ] 2.`: the numbers say it is a
  sub-step, so `2.` is its parent, as if it were indented).
  The checklist is parsed by hand so that every step knows the exact character offset of its marker.
* **Edits touch only what kiro owns.** kiro changes marker characters and, where the person wrote
  one, the `kiro_task_id` frontmatter line (kiro.store.taskmap), nothing else: every other byte (line
  endings, BOM, trailing whitespace, a missing final newline, the person's frontmatter) is written
  back as read. Each edit is a
  compare-and-swap: it is made against the bytes on disk, re-done on a fresh read when the file
  changed. A box edit overwrites the marker byte(s) in place and fdatasyncs (issue #12: a rename
  costs ~1 ms here, an in-place byte 0.03 ms); other edits write a temp file + fsync + `os.replace`.
* **Parsed once.** `load` keeps the last parse of each file and re-parses only when the bytes on
  disk changed: an unchanged (device, inode, size, mtime_ns) old enough that a later write would
  show in the mtime is trusted; otherwise the bytes are read and compared.
"""

from __future__ import annotations

import functools
import os
import re
import stat as stat_
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NamedTuple, TypeAlias, TypeVar

from kiro.errors import TaskFileError, TaskNotFound
from kiro.fs import ownwrites, safeio
from kiro.fs.atomic import Staged, atomic_write
from kiro.store import frontmatter

__all__ = [
    "MARKERS",
    "Step",
    "StepKey",
    "TaskCounts",
    "TaskFile",
    "add_steps",
    "check_finished_parents",
    "load",
    "mark_done",
    "parse",
    "set_frontmatter_key",
    "set_marker",
    "uncheck_all",
]

MARKERS: Final = " xX-~"
"""Box contents kiro understands: to do, done, done, in progress (kiro's own), queued (= to do)."""

DONE_MARKERS: Final = "xX"
KIRO_STRING_KEYS: Final = ("title", "instructions", "kiro_task_id")
"""Frontmatter keys kiro reads as text; a number or list there is a mistake worth one clear error."""

StepKey: TypeAlias = tuple[str, str, int]
KeyLike: TypeAlias = "StepKey | Step | str"

_BOM: Final = b"\xef\xbb\xbf"
_TAB: Final = 4
_EDIT_ATTEMPTS: Final = 5

# A step: bullet, whitespace, box, optional star, whitespace, some text. Text is required: GitHub
# does not render "- [ ]" alone as a task, and kiro could not do an empty step anyway.
_STEP_RE: Final = re.compile(
    r"(?P<ws>[ \t]*)(?P<bullet>[-*+])[ \t]+\[(?P<marker>[ xX~-])\](?P<star>\\?\*)?[ \t]+(?P<text>\S.*)"
)
# A checkbox that is not a list item: "[x] **T1.1** ...", "-[ ] x", "1. [ ] x" (kiro only reads
# '-', '*', '+' bullets). Used to explain a file with no steps, never to find steps.
_STRAY_RE: Final = re.compile(r"[ \t]*(?:[-*+]|[0-9]{1,9}[.)])?[ \t]*\[[ xX~-]\](?:[ \t\\*]|$)")
# Leading step number: "1.", "2.1", "10.3.2", "1.1.1:"; "1.Setup" too, but not "1.5x" or "2024-01".
_ID_RE: Final = re.compile(r"([0-9]+(?:\.[0-9]+)*)(?:[.:](?![0-9])|(?=\s)|$)")
_NUMBER_RE: Final = re.compile(r"[0-9]+(?:\.[0-9]+)*")
_FENCE_RE: Final = re.compile(r"[ \t]*(?P<fence>`{3,}|~{3,})(?P<info>.*)")
_HEADING_RE: Final = re.compile(r" {0,3}#{1,6}[ \t]+(?P<text>.*?)(?:[ \t]+#+)?[ \t]*")
_SHELL_TAGS: Final = frozenset({"sh", "bash", "shell"})
_GENERIC_HEADINGS: Final = frozenset(
    {"implementation plan", "implementation tasks", "tasks", "task list", "todo", "to do", "checklist", "plan"}
)


# -- model ---------------------------------------------------------------------------------------


@dataclass
class Step:
    """One checklist item. Positions (`line`, `box_offset`) refer to `TaskFile.text`."""

    index: int
    id: str
    text: str
    title: str
    marker: str
    optional: bool
    line: int
    indent: int
    box_offset: int
    parent: int | None = None
    children: list[int] = field(default_factory=list)
    occurrence: int = 0
    owned: list[str] = field(default_factory=list, repr=False)  # the raw lines under the step
    parallel: bool = False  # `(P)` right after its number (kiro.core.parallel); not in `title`

    @functools.cached_property
    def details(self) -> list[str]:
        """The lines indented under the step (bullets, _Requirements_, code blocks), dedented, with
        blank lines at either end dropped; child steps' lines excluded. Worked out on first use:
        most reads of a task file need only the boxes."""
        return _dedent(self.owned)

    @functools.cached_property
    def command(self) -> str | None:
        """The body of the first ```sh / ```bash / ```shell block in the details."""
        return _command(self.details)

    @property
    def done(self) -> bool:
        return self.marker in DONE_MARKERS

    @property
    def is_leaf(self) -> bool:
        return not self.children

    @property
    def key(self) -> StepKey:
        """Identity that survives a re-read: line numbers move when a person edits, ids and text rarely."""
        return (self.id, self.text, self.occurrence)


class TaskCounts(NamedTuple):
    # A NamedTuple, not a frozen dataclass: the same immutable record, made at import in ~1 M instructions
    # rather than ~4 M (Python 3.11's dataclass compiles each of its six methods from text; issue #41).
    total: int
    done: int
    optional: int
    open: int
    """Open required leaves: the steps kiro still has to do."""
    leaves: int


@dataclass
class TaskFile:
    """A parsed task file. Build it with `parse` or `load`; the private fields serve the edits."""

    path: Path | None
    text: str
    frontmatter: dict[str, Any]
    steps: list[Step]
    newline: str = "\n"
    frontmatter_lines: dict[str, int] = field(default_factory=dict)
    """1-based file line of each top-level frontmatter key, so a bad value can be shown as file:line."""
    # The exact bytes this was parsed from (`_raw`): the compare-and-swap compares the disk against
    # them. A box edit's copy holds None and keeps (the bytes it was made from, offset -> byte) in
    # `_bytes_from`, as `_text_from` for the text.
    _bytes: bytes | None = field(default=b"", repr=False, compare=False)
    _bytes_from: tuple[bytes, dict[int, int]] | None = field(default=None, repr=False, compare=False)
    _bom: bool = field(default=False, repr=False, compare=False)
    # (opening line, closing line) of the frontmatter delimiters, 0-based.
    _fm_lines: tuple[int, int] | None = field(default=None, repr=False, compare=False)
    _heading: str | None = field(default=None, repr=False, compare=False)
    _stray: list[int] = field(default_factory=list, repr=False, compare=False)
    # Per step: last non-blank line of the step with all its descendants and their details.
    _subtree_end: list[int] = field(default_factory=list, repr=False, compare=False)
    # (id, text, occurrence) -> step index; built on first use, shared by the copies a box edit makes.
    _by_key: dict[StepKey, int] | None = field(default=None, repr=False, compare=False)
    # No open leaf before this index (a box edit that only closes boxes keeps it): current_step
    # starts there instead of at the top.
    _open_from: int = field(default=0, repr=False, compare=False)
    _done_count: int | None = field(default=None, repr=False, compare=False)
    _counts: TaskCounts | None = field(default=None, repr=False, compare=False)
    # Per step index, the byte offset of its box in `_raw` (a file that is not ASCII only; built on
    # first use, shared by the copies a box edit makes: an ASCII marker replaces an ASCII marker).
    _box_bytes: list[int] | None = field(default=None, repr=False, compare=False)
    # A box edit's copy leaves out `text` and keeps (the text it was made from, offset -> marker)
    # here; `text` is built from them on first use (`__getattr__`). A loop's reads need the boxes,
    # not the text: a 5,000-step file's text is not copied on every edit (issue #12).
    _text_from: tuple[str, dict[int, str]] | None = field(default=None, repr=False, compare=False)

    if not TYPE_CHECKING:  # (mypy would take any name for an attribute this makes)

        def __getattr__(self, name: str) -> Any:
            # Called only for an attribute the instance does not hold: `text` of a box edit's copy.
            if name == "text":
                pending = self.__dict__.get("_text_from")
                if pending is not None:
                    text = _with_markers(*pending)
                    self.__dict__["text"] = text
                    self._text_from = None
                    return text
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def _raw(self) -> bytes:
        if self._bytes is None:
            assert self._bytes_from is not None
            base, edits = self._bytes_from
            raw = bytearray(base)
            for at, byte in edits.items():
                raw[at] = byte
            self._bytes, self._bytes_from = bytes(raw), None
        return self._bytes

    def _holds(self, data: bytes | bytearray) -> bool:
        """`data == self._raw`, without building a box edit's copy's bytes: `data` is compared with
        the bytes the copy was made from, with the changed boxes put back for the moment."""
        if self._bytes is not None:
            return data == self._bytes
        assert self._bytes_from is not None
        base, edits = self._bytes_from
        if not isinstance(data, bytearray):
            data = bytearray(data)
        if len(data) != len(base) or any(data[at] != byte for at, byte in edits.items()):
            return False
        for at in edits:
            data[at] = base[at]
        try:
            return data == base
        finally:
            for at, byte in edits.items():
                data[at] = byte

    # -- queries ---------------------------------------------------------------------------------

    def is_optional(self, step: Step) -> bool:
        """Optional as kiro treats it: marked itself, or under a marked step (skipping an optional
        step skips all of it). `Step.optional` keeps what is written on the line."""
        s: Step | None = step
        while s is not None:
            if s.optional:
                return True
            s = self.steps[s.parent] if s.parent is not None else None
        return False

    def current_step(self, include_optional: bool = False) -> Step | None:
        """The first leaf in document order that is not done. `[-]` and `[~]` are open; a parent's
        own box is not looked at (people check parents early and forget them late)."""
        steps = self.steps
        first_open: int | None = None
        found: Step | None = None
        for i in range(self._open_from, len(steps)):
            s = steps[i]
            if s.children or s.done:
                continue
            if first_open is None:
                first_open = i
            if include_optional or not self.is_optional(s):
                found = s
                break
        self._open_from = len(steps) if first_open is None else first_open  # the scan so far holds
        return found

    @property
    def done_count(self) -> int:
        """How many boxes are checked (worked out once per parse; a box edit carries it over)."""
        if self._done_count is None:
            self._done_count = sum(1 for s in self.steps if s.done)
        return self._done_count

    def _key_index(self) -> dict[StepKey, int]:
        if self._by_key is None:
            by_key: dict[StepKey, int] = {}
            for s in self.steps:
                by_key.setdefault(s.key, s.index)
            self._by_key = by_key
        return self._by_key

    def is_complete(self, include_optional: bool = False) -> bool:
        return self.current_step(include_optional) is None

    def find(self, key: KeyLike) -> Step | None:
        """The step with this key (or a `Step`'s key, or the first step with this id).

        If the exact (id, text, occurrence) is gone, a step whose title is the same and unique is
        taken: a person who renumbered steps, or deleted a duplicate line, has not removed the
        step kiro is working on. A reworded step is treated as gone.
        """
        if isinstance(key, str):
            return next((s for s in self.steps if s.id == key), None)
        if isinstance(key, Step):
            key = key.key
        sid, text, occurrence = key
        at = self._key_index().get(key)
        if at is not None:
            return self.steps[at]
        title = _split_id(text)[1]
        if title:
            same = [s for s in self.steps if s.title == title]
            if len(same) == 1:
                return same[0]
        return None

    def counts(self) -> TaskCounts:
        if self._counts is None:
            leaves = [s for s in self.steps if not s.children]
            self._counts = TaskCounts(
                total=len(self.steps),
                done=self.done_count,
                optional=sum(1 for s in self.steps if s.optional),
                open=sum(1 for s in leaves if not s.done and not self.is_optional(s)),
                leaves=len(leaves),
            )
        return self._counts

    @property
    def title(self) -> str:
        """Frontmatter `title`, else a Kiro spec's feature name (`.kiro/specs/<feature>/tasks.md`: its heading
        is Kiro's, the same in every spec), else the first heading unless it is a generic one ("Implementation
        Plan", "Tasks", "Plan"), else the file's name (its folder's name for a `tasks.md`)."""
        fm_title = self.frontmatter.get("title")
        if isinstance(fm_title, str) and fm_title.strip():
            return fm_title.strip()
        if self.path is not None and self.path.name == "tasks.md" and self.path.parent.parent.name == "specs" \
                and self.path.parent.parent.parent.name == ".kiro":
            return self.path.parent.name
        if self._heading and self._heading.rstrip(":").strip().casefold() not in _GENERIC_HEADINGS:
            return self._heading
        if self.path is None:
            return self._heading or "tasks"
        if self.path.stem.casefold() == "tasks" and self.path.parent.name:
            return self.path.parent.name
        return self.path.stem

    def duplicates(self) -> list[str]:
        """Ids written on more than one step line, in document order (worth a warning: a person
        reading "step 8" cannot tell which one)."""
        seen: dict[str, int] = {}
        for s in self.steps:
            seen[s.id] = seen.get(s.id, 0) + 1
        return [sid for sid, n in seen.items() if n > 1]

    def stray_checkboxes(self) -> list[int]:
        """0-based lines with a checkbox that is not a `-`/`*`/`+` list item, outside code."""
        return list(self._stray)


# -- parsing -------------------------------------------------------------------------------------


def _columns(ws: str) -> int:
    """Width of leading whitespace, tabs to the next multiple of 4 (as CommonMark does)."""
    if "\t" not in ws:
        return len(ws)
    col = 0
    for ch in ws:
        col = col + _TAB - col % _TAB if ch == "\t" else col + 1
    return col


def _split_id(text: str) -> tuple[str, str]:
    """(id, title). Without a leading number the id is the whole text, so it stays unique enough
    to find the step again and readable in logs. A `(P)` right after the number (cc-sdd's mark of a
    step that may run beside its neighbours: `Step.parallel`) is not part of the title kiro shows and
    commits."""
    m = _ID_RE.match(text)
    if m is None:
        return text, text
    title = text[m.end():].strip()
    return m.group(1), (title[len(PARALLEL_MARK):].lstrip() or title) if _marked(title) else title


PARALLEL_MARK: Final = "(P)"


def _marked(title: str) -> bool:
    return title.startswith(PARALLEL_MARK)


def _flat_child(sid: str, earlier: Step, col: int) -> bool:
    """A step written at the same indentation as an earlier step whose number its own continues (`2.1`
    under `2.`): a flat Kiro layout, where the numbering is the hierarchy the indentation does not show."""
    return (earlier.indent == col and sid.startswith(earlier.id + ".")
            and _NUMBER_RE.fullmatch(sid) is not None and _NUMBER_RE.fullmatch(earlier.id) is not None)


def _where(path: Path | None) -> str:
    return str(path) if path is not None else "<task text>"


def _parse_frontmatter(text: str, path: Path | None) -> frontmatter.Frontmatter:
    """The frontmatter (kiro.store.frontmatter), and the keys kiro reads as text checked. Errors name file:line."""
    try:
        found = frontmatter.read(text)
    except frontmatter.FrontmatterError as e:
        raise TaskFileError(f"{_where(path)}:{e.line}: {e.problem}") from None
    for key in KIRO_STRING_KEYS:
        value = found.data.get(key)
        if value is not None and not isinstance(value, str):
            raise TaskFileError(
                f"{_where(path)}:{found.lines.get(key, 2)}: frontmatter key {key!r} must be text, "
                f"not a {type(value).__name__}; put the value in quotes"
            )
    return found


def _dedent(lines: list[str]) -> list[str]:
    """Common-indent removal that counts tabs as 4 columns; blank lines become ''; the blank lines
    at either end go."""
    lo, hi = 0, len(lines)
    while lo < hi and not lines[lo].strip():
        lo += 1
    while hi > lo and not lines[hi - 1].strip():
        hi -= 1
    if lo == hi:
        return []
    out: list[str] = []
    for line in lines[lo:hi]:
        body = line.lstrip(" \t")
        if not body:
            out.append("")
        elif line[0] == "\t" or "\t" in line[: len(line) - len(body)]:
            out.append(" " * _columns(line[: len(line) - len(body)]) + body)
        else:
            out.append(line)
    cut = min(len(x) - len(x.lstrip(" ")) for x in out if x)
    return [x[cut:] for x in out] if cut else out


def _command(details: list[str]) -> str | None:
    """Body of the first fenced block tagged sh/bash/shell. Other blocks are skipped whole, so a
    ```sh line shown inside a ```markdown example is not taken for the step's command."""
    joined = "\n".join(details)
    if "```" not in joined and "~~~" not in joined:
        return None
    i = 0
    while i < len(details):
        m = _FENCE_RE.fullmatch(details[i])
        i += 1
        if m is None:
            continue
        fence = m["fence"]
        info = m["info"].strip()
        if fence[0] == "`" and "`" in info:
            continue
        tag = info.split()[0].strip("{}").lstrip(".").lower() if info else ""
        indent = len(details[i - 1]) - len(details[i - 1].lstrip(" "))
        body: list[str] = []
        while i < len(details) and not _closes(details[i], fence):
            line = details[i]
            strip = min(indent, len(line) - len(line.lstrip(" ")))
            body.append(line[strip:])
            i += 1
        i += 1
        if tag in _SHELL_TAGS:
            script = "\n".join(body).strip("\n")
            return script if script.strip() else None
    return None


def _closes(line: str, fence: str) -> bool:
    stripped = line.strip()
    return len(stripped) >= len(fence) and stripped == fence[0] * len(stripped)


def parse(text: str, path: Path | None = None) -> TaskFile:
    """Parse task-file text. A file without steps parses (with `steps == []`); only broken
    frontmatter raises `TaskFileError`. A leading BOM is dropped from `text` and kept for writing."""
    bom = text.startswith("\ufeff")
    if bom:
        text = text[1:]
    return _parse(text, path, bom, (_BOM if bom else b"") + text.encode("utf-8"))


def _parse(text: str, path: Path | None, bom: bool, raw: bytes) -> TaskFile:
    lines = text.split("\n")  # not splitlines(): it also splits on \x0c, \u2028 ..., and offsets must hold
    crlf = text.count("\r\n")
    newline = "\r\n" if crlf and crlf * 2 >= text.count("\n") else "\n"
    head = _parse_frontmatter(text, path)
    fm_lines = (0, head.close) if head.close is not None else None

    steps: list[Step] = []
    owned: list[list[str]] = []  # per step: the non-step lines that belong to it ("\r" stripped)
    last: list[int] = []  # per step: its last non-blank line (for inserting after it)
    # Two stacks of open steps, innermost last. `nest` is the step hierarchy and only steps move
    # it (the parent is the nearest earlier step indented less, whatever prose lies between, so
    # a note or comment at column 0 does not orphan the next child; or, in a flat layout, the
    # earlier step at the same indentation whose number this one continues: `2.1` under `2.`).
    # `stack` decides who owns a non-step line: a line indented no deeper than a step ends that
    # step's details.
    nest: list[int] = []
    stack: list[int] = []
    stray: list[int] = []
    heading: str | None = None
    seen: dict[tuple[str, str], int] = {}
    fence: str | None = None  # the opening fence while inside a fenced block
    in_comment = False
    owner: int | None = None  # owner of the lines of the current fenced block / HTML comment

    start = fm_lines[1] + 1 if fm_lines else 0
    offset = sum(len(lines[i]) + 1 for i in range(start))
    for i in range(start, len(lines)):
        line_start = offset
        line = lines[i]
        offset += len(line) + 1
        if line[-1:] == "\r":
            line = line[:-1]

        body = line.lstrip(" \t")
        ws = line[: len(line) - len(body)]
        col = _columns(ws) if "\t" in ws else len(ws)

        if fence is not None or in_comment:
            # A block opened under a step ends with the step, as in CommonMark: a line indented no
            # deeper than the step's bullet closes an unclosed fence, so a forgotten ``` does not
            # swallow the steps below into this step's command.
            if owner is not None and body and col <= steps[owner].indent:
                fence, in_comment = None, False
            else:
                # Inside a block, lines belong to whoever owned its opening line.
                if owner is not None:
                    owned[owner].append(line)
                    if body:
                        last[owner] = i
                if fence is not None:
                    if _closes(line, fence):
                        fence = None
                elif "-->" in line:
                    in_comment = False
                continue

        if not body:
            if stack:
                owned[stack[-1]].append("")
            continue

        m = _STEP_RE.fullmatch(line) if body[0] in "-*+" else None  # cheap pre-check: most lines are prose
        if m is not None:
            text_ = m["text"].strip()
            sid, title = _split_id(text_)
            while nest and steps[nest[-1]].indent >= col and not _flat_child(sid, steps[nest[-1]], col):
                nest.pop()
            parent = nest[-1] if nest else None
            occurrence = seen.get((sid, text_), 0)
            seen[(sid, text_)] = occurrence + 1
            index = len(steps)
            steps.append(Step(
                index=index, id=sid, text=text_, title=title, marker=m["marker"],
                optional=m["star"] is not None, line=i, indent=col,
                parallel=sid != text_ and _marked(text_[len(sid):].lstrip(".: \t")),
                box_offset=line_start + m.start("marker"), parent=parent, occurrence=occurrence,
            ))
            owned.append([])
            last.append(i)
            if parent is not None:
                steps[parent].children.append(index)
            nest.append(index)
            stack = nest.copy()
            continue

        while stack and steps[stack[-1]].indent >= col:
            stack.pop()
        owner = stack[-1] if stack else None
        if owner is not None:
            owned[owner].append(line)
            last[owner] = i
        first = body[0]
        if first in "`~":
            fm = _FENCE_RE.fullmatch(line)
            if fm is not None and not (fm["fence"][0] == "`" and "`" in fm["info"]):
                fence = fm["fence"]
                continue
        elif first == "<" and body.startswith("<!--"):
            in_comment = "-->" not in body[4:]
            continue
        elif first == "#" and heading is None:
            hm = _HEADING_RE.fullmatch(line)
            if hm is not None and hm["text"]:
                heading = hm["text"]
        if "[" in line and _STRAY_RE.match(line):
            stray.append(i)

    for s in steps:
        s.owned = owned[s.index]
    for s in reversed(steps):  # children come after parents, so ends propagate upwards in one pass
        if s.parent is not None and last[s.index] > last[s.parent]:
            last[s.parent] = last[s.index]

    return TaskFile(
        path=path, text=text, frontmatter=head.data, steps=steps, newline=newline,
        frontmatter_lines=head.lines,
        _bytes=raw, _bom=bom, _fm_lines=fm_lines, _heading=heading, _stray=stray, _subtree_end=last,
    )


def _decode(raw: bytes, path: Path | None) -> tuple[str, bool]:
    bom = raw.startswith(_BOM)
    body = raw[len(_BOM):] if bom else raw
    nul = body.find(b"\0")
    if nul >= 0:  # not text; and a NUL cannot reach a command line
        at = nul + (len(_BOM) if bom else 0)
        line = raw.count(b"\n", 0, at) + 1
        raise TaskFileError(f"{_where(path)}:{line}: a NUL byte at byte offset {at}: not a text file; "
                            "save it as UTF-8 text")
    try:
        return body.decode("utf-8"), bom
    except UnicodeDecodeError as e:
        at = e.start + (len(_BOM) if bom else 0)
        line = raw.count(b"\n", 0, at) + 1
        raise TaskFileError(
            f"{_where(path)}:{line}: not UTF-8 text (byte 0x{raw[at]:02x} at byte offset {at}); "
            "save the file as UTF-8"
        ) from None


def _parse_bytes(raw: bytes, path: Path | None) -> TaskFile:
    text, bom = _decode(raw, path)
    return _parse(text, path, bom, raw)


def _read(path: Path) -> bytes:
    try:
        return safeio.read_bytes(path, limit=safeio.TASK_MAX_BYTES)
    except FileNotFoundError:
        raise TaskNotFound(f"{path}: no such task file") from None
    except safeio.UnreadableFile as e:
        raise TaskFileError(f"{path}: {e.reason}; a task file is a markdown checklist (`- [ ] 1. ...`)") from None


def _no_steps_message(tf: TaskFile, path: Path) -> str:
    msg = f"{path}: no steps found; a step is a list item with a checkbox, like '- [ ] 1. Set up the project'"
    stray = tf.stray_checkboxes()
    if stray:
        first = stray[0]
        shown = tf.text.split("\n")[first].strip()
        words = shown.split()
        if len(words) > 2 or len(shown) > 40:
            shown = " ".join(words[:2])[:40] + " ..."
        msg += (
            f"; found {len(stray)} checkbox{'es' if len(stray) != 1 else ''} that "
            f"{'are' if len(stray) != 1 else 'is'} not list items "
            f"(line {first + 1}: {shown!r}); write them as '- [ ] ...'"
        )
    return msg


def load(path: Path) -> TaskFile:
    """Read and parse a task file; a file kiro cannot work with raises with a one-line reason
    that starts with the path (and the line, where there is one). A file whose bytes did not
    change since the last `load` (or kiro's own edit) is not parsed again: the same `TaskFile`
    comes back (treat it as read-only)."""
    path = _as_path(path)
    tf = _cached_load(path)
    if not tf.steps:
        raise TaskFileError(_no_steps_message(tf, path))
    return tf


# -- the parse cache -----------------------------------------------------------------------------

_CACHE_KEPT: Final = 2048  # files; one per loop is plenty (1,000 loops in one process, issue #12)
_RACY_NS: Final = 100_000_000
"""An mtime this close to the moment of a read may be shared by a later write (ext4 stamps with
the kernel's coarse clock): such a file's bytes are compared again on the next load."""


class _Cached(NamedTuple):
    stat_key: tuple[int, int, int, int]  # (st_dev, st_ino, st_size, st_mtime_ns) before the read
    trusted: bool  # the stat key alone proves the bytes unchanged
    tf: TaskFile  # parsed from the bytes read (`tf._raw`)


_cache: OrderedDict[str, _Cached] = OrderedDict()
_cache_lock = threading.Lock()


def _stat_key(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _remember(path: Path, st: os.stat_result, read_at_ns: int, tf: TaskFile) -> None:
    entry = _Cached(_stat_key(st), st.st_mtime_ns + _RACY_NS < read_at_ns, tf)
    with _cache_lock:
        _cache[str(path)] = entry
        _cache.move_to_end(str(path))
        while len(_cache) > _CACHE_KEPT:
            _cache.popitem(last=False)


def _cached_load(path: Path) -> TaskFile:
    try:
        st = os.stat(path)
    except OSError:
        st = None
    with _cache_lock:
        hit = _cache.get(str(path))
    if st is not None and hit is not None and hit.trusted and hit.stat_key == _stat_key(st):
        return hit.tf
    read_at = time.time_ns()
    look = _look(path) if hit is not None else None  # most often the same bytes: read them into scratch
    if look is not None and hit is not None and hit.tf._holds(look):
        tf = hit.tf
    else:
        tf = _parse_bytes(bytes(look) if look is not None else _read(path), path)
    if st is not None and stat_.S_ISREG(st.st_mode):
        _remember(path, st, read_at, tf)
    return tf


def _look(path: Path) -> bytearray | None:
    """`_read_path_scratch`, or None if the file cannot be read that way: `_read` then says why, as
    any read of a task file does."""
    try:
        return _read_path_scratch(path)
    except (OSError, TaskFileError):
        return None


def forget_cache() -> None:
    """Drop every remembered parse (tests that rewrite a file within the same clock tick)."""
    with _cache_lock:
        _cache.clear()


# -- atomic, compare-and-swap edits --------------------------------------------------------------


def _last_look(path: Path, through: tuple[int, os.stat_result] | None = None) -> bytes | bytearray | None:
    """The file's bytes right before the write (a seam the tests use to play a racing editor), in
    this thread's scratch buffer (`_read_scratch`): compare them at once. `through`: the descriptor a box
    edit writes through and its stat: while `path` still names that file, the bytes are read through it (a
    stat, no open: each open of a task file wakes the change hub's thread, docs/guides/step-cost.md); None
    when `path` names another file now (an editor saved by rename) or none."""
    if through is None:
        return _read_path_scratch(path)
    fd, held = through
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return None
    if (named.st_dev, named.st_ino) != (held.st_dev, held.st_ino):
        return None
    return _read_scratch(fd, path, held)


def _write_if_unchanged(path: Path, data: bytes, was: bytes, durable: bool = True, *, shown: Path) -> bool:
    """Write `data` over `path` atomically (`kiro.fs.atomic.atomic_write`: temp file, fsync, replace,
    fsync the folder), keeping the file's permission bits (and owner, where allowed), unless the
    file no longer holds `was`: the last look right before the replace then finds other bytes, and
    nothing is written (returns False). A write that fails is a TaskFileError naming `shown` (the
    path as the caller gave it; `path` is the file behind a symlink); a full disk is DiskFull
    (kiro.fs.atomic).

    Remaining race: a save that lands between the last look and `os.replace` (microseconds) is
    overwritten by kiro's version. Closing it would need a lock every editor honours, and editors
    do not take locks on markdown files; the window is far smaller than any human edit.
    """
    if not path.exists():
        return False  # moved or deleted meanwhile: the next read says so
    try:
        return atomic_write(path, data, fsync=durable, keep_mode=True, unchanged=lambda: _last_look(path) == was)
    except FileNotFoundError:
        return False
    except OSError as e:
        raise TaskFileError(f"{shown}: cannot write the task file: {e.strerror or e}") from None


_Change: TypeAlias = Callable[[TaskFile], "str | None"]


def _edit(path: Path, change: _Change, expected: TaskFile | None = None, durable: bool = True) -> TaskFile:
    """Apply `change` (old file -> new text, or None for "nothing to do") as a compare-and-swap.

    `change` is always computed against the bytes that are on disk: `expected` is used only when
    the disk still holds exactly its bytes; otherwise the file is re-read and `change` re-run, so
    a person's edit made since kiro's read is kept and kiro's edit is re-applied on top of it.
    """
    path = _as_path(path)
    real = Path(os.path.realpath(path))  # write through a symlink; do not replace the link itself
    for attempt in range(_EDIT_ATTEMPTS):
        raw = _read(path)
        if expected is not None and raw == expected._raw:
            tf = expected
        else:
            tf = _parse_bytes(raw, path)
        new_text = change(tf)
        if new_text is None or new_text == tf.text:
            return tf
        data = (_BOM if tf._bom else b"") + new_text.encode("utf-8")
        if _write_if_unchanged(real, data, raw, durable, shown=path):
            return _parse_bytes(data, path)
        time.sleep(0.01 * (attempt + 1))
    raise TaskFileError(
        f"{path}: the file kept changing while kiro tried to update it; "
        f"gave up after {_EDIT_ATTEMPTS} attempts"
    )


_Marks: TypeAlias = Callable[[TaskFile], "dict[int, str] | None"]


_scratch = threading.local()


def _read_scratch(fd: int, path: Path, held: os.stat_result | None = None) -> bytearray:
    """The file's bytes, read into this thread's scratch buffer, valid until the thread's next
    read. A box edit reads the whole file twice and keeps none of it: a new buffer the size of a
    5,000-step file costs more to map than to fill (issue #12). A file whose size changes while it
    is read is read again into a buffer of its own. `held`: the descriptor's `_check_fd` from when it
    was opened (a box edit's): its size is the one first tried, no fstat; a file that has grown or
    shrunk since reads short or past it, and is read again whole (`_read_fd`, which stats it)."""
    st = held if held is not None else _check_fd(fd, path)
    buf: bytearray | None = getattr(_scratch, "buf", None)
    if buf is None or len(buf) != st.st_size:
        buf = _scratch.buf = bytearray(st.st_size)
    if os.preadv(fd, [buf], 0) != len(buf) or os.pread(fd, 1, len(buf)):
        return bytearray(_read_fd(fd, path))
    return buf


def _read_path_scratch(path: Path) -> bytearray | None:
    """`_read_scratch` of the file at `path`; None when there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    try:
        return _read_scratch(fd, path)
    finally:
        os.close(fd)


def _check_fd(fd: int, path: Path) -> os.stat_result:
    st = os.fstat(fd)
    if not stat_.S_ISREG(st.st_mode):
        raise TaskFileError(f"{path}: is {safeio.file_kind(st.st_mode)}, not a file")
    if st.st_size > safeio.TASK_MAX_BYTES:
        raise TaskFileError(f"{path}: is over the {safeio.TASK_MAX_BYTES // safeio.MIB} MiB kiro reads")
    return st


def _read_fd(fd: int, path: Path) -> bytes:
    st = _check_fd(fd, path)
    chunks: list[bytes] = []
    at = 0
    while True:
        want = max(st.st_size - at, 0) + 65536
        chunk = os.pread(fd, want, at)
        if len(chunk) < want:  # a short read of a regular file: its end
            chunks.append(chunk)
            return b"".join(chunks)
        chunks.append(chunk)
        at += len(chunk)


def _box_byte(tf: TaskFile, i: int) -> int:
    """Where step `i`'s box lies in the file's bytes."""
    table = tf._box_bytes
    if table is None:
        table = tf._box_bytes = _box_byte_table(tf)
    return table[i]


def _box_byte_table(tf: TaskFile) -> list[int]:
    """Each step's box offset in bytes, in one pass over the text (a character is a byte in an
    ASCII file; otherwise the text between one box and the next is measured in UTF-8)."""
    head = len(_BOM) if tf._bom else 0
    text = tf.text
    if len(tf._raw) - head == len(text):
        return [head + s.box_offset for s in tf.steps]
    table: list[int] = []
    at_char, at_byte = 0, head
    for s in tf.steps:  # in document order: box offsets only grow
        at_byte += len(text[at_char:s.box_offset].encode("utf-8"))
        at_char = s.box_offset
        table.append(at_byte)
    return table


_T = TypeVar("_T")


def _as_path(path: Path | str) -> Path:
    return path if isinstance(path, Path) else Path(path)


def _clone(obj: _T) -> _T:
    """A shallow copy of a dataclass instance (what `copy.copy` makes, without its protocol)."""
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__)
    return new


_TEXT_EDITS_KEPT: Final = 256
"""Box edits a copy's text may wait for (`TaskFile._text_from`) before it is built anyway."""
_BYTE_EDITS_KEPT: Final = 32
"""The same for its bytes, fewer: each compare-and-swap walks the edits (`TaskFile._holds`)."""


def _with_boxes(tf: TaskFile, marks: dict[int, str]) -> TaskFile:
    """`tf` with step `i`'s box holding `marks[i]`: a copy that shares the unchanged steps, the key
    index and, when every change closes or claims a box, the first-open-leaf position; its text
    and bytes are built when first asked for (`TaskFile._text_from`, `_bytes_from`)."""
    steps = list(tf.steps)
    byte_edits: dict[int, int] = {}
    done = tf.done_count
    open_from = tf._open_from
    counts = tf.counts()  # worked out once, carried by every copy (a prompt asks for it each iteration)
    open_leaves = counts.open
    for i, marker in marks.items():
        old = steps[i]
        byte_edits[_box_byte(tf, i)] = ord(marker)
        now_done = marker in DONE_MARKERS
        done += now_done - old.done
        if not now_done:
            open_from = min(open_from, i)
        if now_done != old.done and not old.children and not tf.is_optional(old):
            open_leaves += -1 if now_done else 1
        step = _clone(old)  # keeps what the step worked out once (details, command): the box alone changed
        step.marker = marker
        steps[i] = step
    new = _clone(tf)
    edits = {steps[i].box_offset: m for i, m in marks.items()}
    if tf._text_from is not None:
        base, pending = tf._text_from
        edits = {**pending, **edits}
    else:
        base = tf.text
    new.__dict__.pop("text", None)
    new._text_from = (base, edits)
    if tf._bytes_from is not None:
        base_bytes, pending_bytes = tf._bytes_from
        byte_edits = {**pending_bytes, **byte_edits}
    else:
        base_bytes = tf._raw
    new._bytes, new._bytes_from = None, (base_bytes, byte_edits)
    if len(edits) > _TEXT_EDITS_KEPT:  # build them now: the edits waiting cost memory, or time
        new.text  # noqa: B018
    if len(byte_edits) > _BYTE_EDITS_KEPT:
        new._raw  # noqa: B018
    new.steps = steps
    new._open_from = open_from
    new._done_count = done
    # made directly, not by dataclasses.replace (its field walk: ~19 K instructions a box edit, ~4 K so)
    new._counts = TaskCounts(counts.total, done, counts.optional, open_leaves, counts.leaves)
    return new


_reals: dict[str, tuple[int, int, Path]] = {}


def _real_path(path: Path, st: os.stat_result) -> Path:
    """`os.path.realpath(path)`, worked out again only when `path` names another file than last
    time (`st`: the file opened through it)."""
    key = str(path)
    hit = _reals.get(key)
    if hit is not None and hit[0] == st.st_dev and hit[1] == st.st_ino:
        return hit[2]
    real = Path(os.path.realpath(path))
    if len(_reals) > _CACHE_KEPT:
        _reals.clear()
    _reals[key] = (st.st_dev, st.st_ino, real)
    return real


def _open_rw(path: Path) -> int:
    """Open the task file for the in-place edit (a seam for tests that play a file kiro may not
    write: root ignores a chmod)."""
    return os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)


def _edit_boxes(path: Path, marks: _Marks, expected: TaskFile | None, durable: bool,
                keep: list[int] | None = None) -> TaskFile:
    """Set checkbox markers as a compare-and-swap, in place: read the bytes through one open file,
    work out the edit against them, overwrite just the marker bytes (`pwrite`), fdatasync. A file
    replaced meanwhile (an editor's save by rename) is edited again under its new inode; a
    change seen by the last look before the write re-runs the edit on the new bytes. The edit
    is first worked out on `expected`, unread: the last look, which must find its bytes, is then
    the only read of the file (a 5,000-step file is 200 KB: issue #12). With `durable=False` and
    `keep`, a descriptor of the file written is appended to `keep`: the caller syncs it later
    (and closes it)."""
    path = _as_path(path)
    unread = expected  # the caller's parse, not yet compared with the disk
    attempt = 0
    while attempt < _EDIT_ATTEMPTS:
        try:
            fd = _open_rw(path)  # the file behind a symlink
        except FileNotFoundError:
            raise TaskNotFound(f"{path}: no such task file") from None
        except OSError as e:
            raise TaskFileError(f"{path}: cannot write the task file: {e.strerror or e}") from None
        try:
            read_at = time.time_ns()
            held = _check_fd(fd, path)
            real = _real_path(path, held)
            wanted = marks(unread) if unread is not None else None
            if wanted:
                tf = unread
            else:  # read the file (nothing to do on `expected` may not hold on the disk)
                unread = None
                buf = _read_scratch(fd, path, held)
                if expected is not None and expected._holds(buf):
                    tf = expected
                else:
                    with _cache_lock:
                        hit = _cache.get(str(path))
                    tf = hit.tf if hit is not None and hit.tf._holds(buf) else _parse_bytes(bytes(buf), path)
                wanted = marks(tf)
                if not wanted:
                    return tf
            assert tf is not None
            new = _with_boxes(tf, wanted)
            look = _last_look(real, (fd, held))
            if look is None or not tf._holds(look):  # changed since `tf` was read: do it again on the new bytes
                if unread is None:
                    attempt += 1
                    time.sleep(0.01 * attempt)
                unread = None
                continue
            try:
                for i in wanted:  # the step's own box first, then its parents
                    os.pwrite(fd, wanted[i].encode("ascii"), _box_byte(tf, i))
                if durable:
                    os.fdatasync(fd)
            except OSError as e:  # overwriting a byte allocates nothing: not a full disk
                raise TaskFileError(f"{path}: cannot write the task file: {e.strerror or e}") from None
            try:
                st = os.stat(real)
                replaced = (st.st_dev, st.st_ino) != (held.st_dev, held.st_ino)  # `fd`'s file is `held`'s
            except FileNotFoundError:
                replaced = True
            if replaced:  # written into a file that was just swapped out: edit the new one
                attempt += 1
                unread = None
                continue
            ownwrites.note_own_write(real, st)  # kiro's own edit wakes no watcher (kiro.fs.ownwrites)
            _remember(path, st, read_at, new)
            if keep is not None and not durable:
                keep.append(os.dup(fd))
            return new
        finally:
            os.close(fd)
    raise TaskFileError(
        f"{path}: the file kept changing while kiro tried to update it; "
        f"gave up after {_EDIT_ATTEMPTS} attempts"
    )


def _require(tf: TaskFile, key: KeyLike, path: Path) -> Step:
    step = tf.find(key)
    if step is None:
        sid = key if isinstance(key, str) else key.id if isinstance(key, Step) else key[0]
        raise TaskFileError(f"{path}: step {sid!r} is no longer in the task file (edited or removed)")
    return step


def _with_markers(text: str, edits: dict[int, str]) -> str:
    """`text` with single characters replaced at the given offsets."""
    out: list[str] = []
    last = 0
    for at in sorted(edits):
        out.append(text[last:at])
        out.append(edits[at])
        last = at + 1
    out.append(text[last:])
    return "".join(out)


def set_marker(path: Path, key: KeyLike, marker: str, *, expected: TaskFile | None = None,
               durable: bool = True) -> TaskFile:
    """Write `marker` into one step's box (one byte changes). `x` and `X` count as the same state,
    so a box a person checked with `X` is left alone. `durable=False` skips the fsyncs, for marks
    that may be lost in a power cut without harm (the `[-]` kiro writes while a step runs)."""
    if len(marker) != 1 or marker not in MARKERS:
        raise ValueError(f"marker must be one of {list(MARKERS)!r}, not {marker!r}")

    def change(tf: TaskFile) -> dict[int, str] | None:
        step = _require(tf, key, _as_path(path))
        if step.marker == marker or (step.done and marker in DONE_MARKERS):
            return None
        return {step.index: marker}

    return _edit_boxes(_as_path(path), change, expected, durable)


class _DoneView(dict[int, bool]):
    """Step index -> done, read from the file's boxes unless set here: O(1) to make, so an edit
    near one step does not walk the whole file."""

    def __init__(self, tf: TaskFile) -> None:
        super().__init__()
        self.tf = tf

    def __missing__(self, i: int) -> bool:
        return self.tf.steps[i].done


def uncheck_all(path: Path, *, expected: TaskFile | None = None) -> tuple[TaskFile, list[str]]:
    """Put every checked or in-progress box back to `[ ]` in one atomic write (a scheduled task's
    next run, SPEC §11). Returns the new file and the ids unchecked."""
    ids: list[str] = []

    def change(tf: TaskFile) -> str | None:
        ids.clear()
        edits = {s.box_offset: " " for s in tf.steps if s.done or s.marker == "-"}
        ids.extend(s.id for s in tf.steps if s.done or s.marker == "-")
        return _with_markers(tf.text, edits) if edits else None

    return _edit(_as_path(path), change, expected), list(ids)


def _parents_to_check(tf: TaskFile, done: dict[int, bool], candidates: Iterable[int],
                      include_optional: bool) -> list[int]:
    """Of `candidates` (deepest first), the open parents whose children are all done, updating
    `done`. Optional children do not count unless `include_optional`; at least one child must be
    done, so a parent of nothing but skipped optional steps is not reported as done work."""
    checked: list[int] = []
    for i in candidates:
        s = tf.steps[i]
        if not s.children or done[i]:
            continue
        counted = [c for c in s.children if include_optional or done[c] or not tf.steps[c].optional]
        if counted and all(done[c] for c in counted):
            done[i] = True
            checked.append(i)
    return checked


def mark_done(path: Path, key: KeyLike, *, expected: TaskFile | None = None,
              include_optional: bool = False, sync_later: list[int] | None = None) -> tuple[TaskFile, list[str]]:
    """Check the step, then every ancestor whose children are now all done, in one write.
    Returns the new file and the ids whose boxes kiro checked (not those already checked).
    With `sync_later`, the bytes are not synced here: a descriptor of the file is appended to
    it for the caller to fdatasync (and close) before anything that depends on the box."""
    checked_ids: list[str] = []

    def change(tf: TaskFile) -> dict[int, str] | None:
        checked_ids.clear()
        step = _require(tf, key, _as_path(path))
        done = _DoneView(tf)
        changed: list[int] = []
        if not step.done:
            done[step.index] = True
            changed.append(step.index)
        ancestors: list[int] = []
        p = step.parent
        while p is not None:
            ancestors.append(p)
            p = tf.steps[p].parent
        changed += _parents_to_check(tf, done, ancestors, include_optional)
        checked_ids.extend(tf.steps[i].id for i in changed)
        if not changed:
            return None
        return dict.fromkeys(changed, "x")

    return (_edit_boxes(_as_path(path), change, expected, durable=sync_later is None, keep=sync_later),
            list(checked_ids))


def check_finished_parents(path: Path, *, include_optional: bool = False) -> tuple[TaskFile, list[str]]:
    """Check every open parent whose children are all done (a person checked the last child, or a
    file arrived that way). Returns the new file and the ids checked, in document order."""
    checked_ids: list[str] = []

    def change(tf: TaskFile) -> dict[int, str] | None:
        checked_ids.clear()
        done = _DoneView(tf)
        changed = _parents_to_check(tf, done, reversed(range(len(tf.steps))), include_optional)
        changed.sort()
        checked_ids.extend(tf.steps[i].id for i in changed)
        if not changed:
            return None
        return dict.fromkeys(changed, "x")

    return _edit_boxes(_as_path(path), change, None, durable=True), list(checked_ids)


def set_frontmatter_key(path: Path, key: str, value: str, *, expected: TaskFile | None = None) -> TaskFile:
    """Set one top-level frontmatter key (kiro uses it only for `kiro_task_id`): its line is
    replaced, or a line is added before the closing `---`, or, without frontmatter, a frontmatter
    block is added at the top. Every other line stays as written, comments and order included.
    `expected`: the file as the caller parsed it, used when the disk still holds its bytes."""
    return _edit(_as_path(path), _frontmatter_change(key, value), expected)


def stage_frontmatter_key(path: Path, key: str, value: str, *, expected: TaskFile, staged: Staged,
                          resolved: bool = False) -> None:
    """`set_frontmatter_key` for a batch start (kiro.core.runner.StartBatch): the new bytes are made now,
    from `expected`, in the caller's thread, and staged in `staged`. When the batch commits they
    replace the file if it still holds `expected`'s bytes (the last look, right before the rename);
    otherwise the edit is made again on what the file holds then (a person's edit meanwhile is kept).
    `resolved`: `path` is a real path already (no symlink to keep: the edit goes to it)."""
    path = _as_path(path)
    change = _frontmatter_change(key, value)
    new_text = change(expected)
    if new_text is None or new_text == expected.text:
        return
    data = (_BOM if expected._bom else b"") + new_text.encode("utf-8")
    real = path if resolved else Path(os.path.realpath(path))

    def error(exc: OSError) -> TaskFileError:
        return TaskFileError(f"{path}: cannot write the task file: {exc.strerror or exc}")

    staged.add(real, data, keep_mode=True, unchanged=lambda: _last_look(real) == expected._raw,
               changed=lambda: _edit(path, change), error=error)


def _frontmatter_change(key: str, value: str) -> _Change:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_\-]*", key):
        raise ValueError(f"not a simple frontmatter key: {key!r}")
    if "\n" in value or "\r" in value:
        raise ValueError(f"frontmatter value for {key!r} must be one line")

    def change(tf: TaskFile) -> str | None:
        if tf.frontmatter.get(key) == value:
            return None
        try:
            return frontmatter.write({key: value}, tf.text)
        except frontmatter.FrontmatterError as e:
            raise TaskFileError(f"{_where(tf.path)}:{e.line}: {e.problem}") from None

    return change


def add_steps(path: Path, titles: list[str], *, after: KeyLike | None = None) -> tuple[TaskFile, list[Step]]:
    """Insert unchecked steps `- [ ] <title>`: after the given step and everything under it, as
    its siblings (same indentation and bullet), or after the last top-level step of the file's
    last checklist, or at the end of a file that has none. Titles are used as given (an agent
    that wants numbers writes them)."""
    clean: list[str] = []
    for t in titles:
        if "\n" in t or "\r" in t:
            raise TaskFileError(f"{path}: a step title must be one line, got {t!r}")
        if not t.strip():
            raise TaskFileError(f"{path}: a step title must not be empty")
        clean.append(t.strip())
    inserted: list[int] = []

    def change(tf: TaskFile) -> str | None:
        inserted.clear()
        if not clean:
            return None
        text = tf.text
        lines = text.split("\n")
        anchor: Step | None
        if after is not None:
            anchor = _require(tf, after, _as_path(path))
        elif tf.steps:
            anchor = tf.steps[-1]
            while anchor.parent is not None:
                anchor = tf.steps[anchor.parent]
        else:
            anchor = None
        if anchor is not None:
            end = tf._subtree_end[anchor.index]
            m = _STEP_RE.fullmatch(lines[anchor.line].rstrip("\r"))
            assert m is not None  # the anchor was parsed from this very line
            prefix = f"{m['ws']}{m['bullet']} [ ] "
            nl = "\r\n" if lines[end].endswith("\r") else tf.newline
        else:
            end = len(lines) - 1 if lines[-1] else len(lines) - 2
            prefix = "- [ ] "
            nl = tf.newline
        new_lines = [prefix + t for t in clean]
        if end < 0:  # empty file
            new = "".join(x + nl for x in new_lines)
        elif end == len(lines) - 1:  # the last line, without a final newline: keep it that way
            new = text + nl + nl.join(new_lines)
        else:
            at = sum(len(x) + 1 for x in lines[: end + 1])
            new = text[:at] + "".join(x + nl for x in new_lines) + text[at:]
        inserted.extend(range(end + 1, end + 1 + len(new_lines)))
        check = parse(new, tf.path)
        if {s.line for s in check.steps} & set(inserted) != set(inserted):
            raise TaskFileError(
                f"{_where(tf.path)}: steps added after line {end + 1} would not parse as steps"
            )
        return new

    new_tf = _edit(_as_path(path), change)
    by_line = {s.line: s for s in new_tf.steps}
    return new_tf, [by_line[i] for i in inserted if i in by_line]


CHECKPOINT_TITLE = r"(?i)^\W*(?:final\s+)?checkpoint\b"  # compiled when first used (re's cache), as _DEPENDS
"""A Kiro plan's review step: "Checkpoint - Ensure all tests pass", "Final Checkpoint - ...", "Checkpoint — ..."."""


def is_checkpoint(title: str) -> bool:
    return re.match(CHECKPOINT_TITLE, title) is not None


_DEPENDS = r"(?i)^_?\s*Depends(?:\s+on)?\s*:\s*(?P<ids>.+?)\s*_?$"  # compiled when first used (re's cache)


def depends_on(step: Step) -> list[str]:
    """The step ids a step's `_Depends: 1.2, 3_` lines name (steps side by side, `parallel_by: depends`,
    kiro.core.parallel)."""
    ids: list[str] = []
    for line in step.details:
        m = re.match(_DEPENDS, line.strip().lstrip("-*+ ").strip())
        if m is not None:
            ids += [x.strip().rstrip(".") for x in re.split(r"[,;\s]+", m.group("ids").strip("_ ")) if x.strip()]
    return ids


def open_leaves(task: TaskFile, include_optional: bool) -> list[Step]:
    """The steps not done that have no sub-steps, in plan order (the optional ones only when asked)."""
    return [s for s in task.steps if not s.children and not s.done
            and (include_optional or not task.is_optional(s))]


def ready(task: TaskFile, by: str, include_optional: bool) -> list[Step]:
    """The open steps that may run side by side now (kiro.core.parallel), in plan order: those whose `_Depends:`
    are done, and with `marker` only the `(P)` steps from the first open step on, up to the first open step
    without the mark."""
    done = {s.id for s in task.steps if s.done}
    out: list[Step] = []
    for s in open_leaves(task, include_optional):
        if by != "depends" and not s.parallel:  # `(P)` right after its number
            break
        if all(d in done for d in depends_on(s)):
            out.append(s)
    return out
