"""Approval of agent-proposed steps (SPEC §11, seed 001's pending_approval).

With `approval.agent_steps: true` (the default) the agent's `add_steps` writes a proposal
`Pending_Approval/steps_<task_id>_<n>.md` instead of editing the task file:

    ---
    type: step_proposal
    task_id: nightly
    task_path: Specs/feature/tasks.md
    after: '2'            # the step it goes after; null: at the end
    created: 2026-11-22T09:00:00+00:00
    ---
    ## Reason
    > <the agent's reason, quoted line by line>

    ## Steps
    - [ ] 2.1 Add the index

A person moves it to `Approved/` (kiro inserts the `- [ ]` lines of `## Steps`, as the person left them)
or `Rejected/` (the agent is told in its next prompt, through the loop's inbox). The loop looks at
both folders before every iteration. A handled proposal gets `status: applied` / `status: reported` in
its frontmatter and stays where the person put it.

Crash safety: before inserting, kiro writes `.state/proposals/<name>.applying`; a proposal found
with that marker whose steps are all in the task file already is only marked applied, never inserted
twice.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from kiro import timeutil
from kiro.errors import UserError
from kiro.fs.atomic import atomic_write
from kiro.store import frontmatter, tasks
from kiro.store.messages import Inbox
from kiro.store.workspace import Workspace

PENDING, APPROVED, REJECTED = "Pending_Approval", "Approved", "Rejected"
_BOX = r"^\s*[-*]\s+\[[ xX-]\]\s+(.+?)\s*$"  # compiled when a decided proposal is first read (re's cache)


def _number(name: str, task_id: str) -> int | None:
    """N of a proposal's file name `steps_<task_id>_<N>.md`, None for any other name (string tests, not a
    pattern: one compiled for each loop was ~1% of a loop's CPU with 1,000 loops, issue #41)."""
    prefix = f"steps_{task_id}_"
    if not (name.startswith(prefix) and name.endswith(".md")):
        return None
    digits = name[len(prefix):-3]
    return int(digits) if digits.isdecimal() else None


def _split(text: str) -> tuple[dict[str, Any], str]:
    """A proposal's frontmatter and what follows it; frontmatter kiro cannot read (not YAML, too deep,
    an alias bomb) is as none."""
    try:
        found = frontmatter.read(text)
    except frontmatter.FrontmatterError:
        return {}, frontmatter.body(text)
    return found.data, text[found.rest:]


def _marked(text: str, fields: dict[str, Any]) -> str:
    """The proposal `text` with `fields` set in its frontmatter, the person's other bytes kept; a
    frontmatter kiro cannot read or edit is replaced by one of `fields`."""
    try:
        return frontmatter.write(fields, text)
    except frontmatter.FrontmatterError:
        return frontmatter.write(fields) + frontmatter.body(text)


def proposals(ws: Workspace, task_id: str, area: str) -> list[Path]:
    folder = ws.root / area
    if not folder.is_dir():
        return []
    found = [(n, p) for p in folder.iterdir() if (n := _number(p.name, task_id)) is not None]
    return [p for _n, p in sorted(found, key=lambda np: np[0])]


def propose(ws: Workspace, task_id: str, task_path: str, titles: list[str], after: str | None,
            reason: str) -> Path:
    """Write the next proposal of this loop into Pending_Approval/."""
    numbers = [n for area in (PENDING, APPROVED, REJECTED) if (ws.root / area).is_dir()
               for p in (ws.root / area).iterdir() if (n := _number(p.name, task_id)) is not None]
    n = max(numbers, default=0) + 1
    path = ws.root / PENDING / f"steps_{task_id}_{n}.md"
    meta = {"type": "step_proposal", "task_id": task_id, "task_path": task_path, "after": after,
            "created": timeutil.iso(), "status": "pending"}
    steps = "\n".join(f"- [ ] {' '.join(t.split())}" for t in titles)
    body = (f"# Steps proposed by loop {task_id}\n\nMove this file to `Approved/` to add the steps (edit them "
            f"first if you like) or to `Rejected/` to refuse them; write why under `## Decision` if you want the "
            f"agent to know.\n\n## Reason\n{_quoted(reason)}\n\n## Steps\n{steps}\n\n## Decision\n")
    for area in (APPROVED, REJECTED):  # the folders the proposal says to move it to (a file in the way: the
        with contextlib.suppress(OSError):  # person's, which the proposal does not need)
            (ws.root / area).mkdir(exist_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, frontmatter.write(meta) + body)
    return path


def _quoted(reason: str) -> str:
    """The agent's reason as a quote, every line of it (whatever breaks a line) behind `> `: no line
    of it is a heading or a box kiro reads, so the `## Steps` kiro applies is the one it wrote below,
    in plain sight. An HTML comment the reason opens ends with the quote."""
    lines = reason.strip().splitlines() or ["(none given)"]
    return "\n".join(f"> {line}" for line in lines)


def _section(body: str, name: str) -> str:
    m = re.search(rf"^## {re.escape(name)}\s*$(.*?)(?=^## |\Z)", body, re.M | re.S)
    return m.group(1).strip() if m else ""


class Decision(NamedTuple):  # (a NamedTuple, as kiro.store.tasks' TaskCounts)
    kind: str  # "approved" | "rejected"
    name: str
    fields: dict[str, Any]


def apply_decisions(ws: Workspace, task_id: str, task_path: Path,
                    redact: Callable[[str], str] | None = None) -> list[Decision]:
    """Handle every decided proposal of this loop not handled yet: insert approved steps, tell the
    agent of rejected ones (a message in its inbox, through `redact`: the loop's redactor). Returns
    what was done, for the event log."""
    out: list[Decision] = []
    marks = ws.state_dir / "proposals"
    for path in proposals(ws, task_id, APPROVED):
        written = path.read_text(encoding="utf-8")
        meta, body = _split(written)
        if meta.get("status") == "applied":
            continue
        titles = [m.group(1) for line in _section(body, "Steps").splitlines() if (m := re.match(_BOX, line))]
        after = meta.get("after")
        after = str(after) if after is not None else None
        marker = marks / f"{path.stem}.applying"
        current = {x for s in tasks.load(task_path).steps for x in (s.text, s.title, f"{s.id} {s.title}")}
        if titles and not (marker.exists() and all(t in current for t in titles)):
            marks.mkdir(parents=True, exist_ok=True)
            atomic_write(marker, timeutil.iso())
            if after is not None and tasks.load(task_path).find(after) is None:
                after = None  # the step it followed is gone: at the end
            tasks.add_steps(task_path, titles, after=after)
        atomic_write(path, _marked(written, {"status": "applied", "applied": timeutil.iso()}))
        marker.unlink(missing_ok=True)
        out.append(Decision("approved", path.name, {"proposal": path.name, "steps": titles}))
    for path in proposals(ws, task_id, REJECTED):
        written = path.read_text(encoding="utf-8")
        meta, body = _split(written)
        if meta.get("status") == "reported":
            continue
        titles = [m.group(1) for line in _section(body, "Steps").splitlines() if (m := re.match(_BOX, line))]
        why = _section(body, "Decision")
        text = (f"Your step proposal {path.name} was rejected; the steps were not added: "
                + "; ".join(titles) + "." + (f"\nThe person's reason: {why}" if why else ""))
        Inbox(ws, task_id).queue(redact(text) if redact is not None else text, via="approval",
                                 msg_id=f"rejected-{path.stem}")
        atomic_write(path, _marked(written, {"status": "reported"}))
        out.append(Decision("rejected", path.name, {"proposal": path.name, "steps": titles}))
    return out


# -- task files written while a step ran (SPEC §15) ------------------------------------------------

TASK_FILE_NOTE = "task_file"
_HELD_PREFIX = "task_file_"


def _note_name(rel: str) -> str:
    import hashlib

    slug = "".join(c if c.isascii() and c.isalnum() else "_" for c in rel).strip("_")[:60] or "task"
    return f"{_HELD_PREFIX}{slug}_{hashlib.sha256(rel.encode()).hexdigest()[:8]}.md"


def hold_task_file(ws: Workspace, path: Path, *, task_id: str, step_id: str, why: str) -> Path:
    """Write `Pending_Approval/task_file_<name>.md`: the task file at `path` was created, or its frontmatter
    changed, while step `step_id` of loop `task_id` ran, so no loop runs it until a person approves it
    (moves the note to `Approved/`). The note names the file by its path and its inode: a step that renames
    the file does not shed the hold."""
    rel = ws.relative(path)
    note = ws.root / PENDING / _note_name(rel)
    try:
        st = os.stat(path)
        ident: list[int] | None = [st.st_dev, st.st_ino]
    except OSError:
        ident = None
    meta = {"type": TASK_FILE_NOTE, "path": rel, "file_id": ident, "task_id": task_id, "step_id": step_id,
            "created": timeutil.iso(), "status": "pending"}
    body = (f"# Task file waiting for your approval: {rel}\n\n"
            f"`{rel}` was {why} while step {step_id} of loop {task_id} ran. A step must never start work, nor "
            f"set the box, allow-lists, budgets or review of a task (its frontmatter), so kiro runs no loop on "
            f"this file (`kiro loop watch`, `start`, `resume`, `kiro serve`) until you approve it. If you wrote it "
            f"yourself while the step ran, approve it all the same.\n\n"
            f"- **approve**: read the task file (its frontmatter above all), then move this note to `Approved/`.\n"
            f"- **refuse**: move this note to `Rejected/` (kiro never runs the file), or delete the task file.\n")
    for area in (APPROVED, REJECTED):
        with contextlib.suppress(OSError):
            (ws.root / area).mkdir(exist_ok=True)
    note.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(note, frontmatter.write(meta) + body)
    return note


def _held_notes(ws: Workspace) -> list[tuple[Path, dict[str, Any]]]:
    found: list[tuple[Path, dict[str, Any]]] = []
    for area in (PENDING, REJECTED):
        folder = ws.root / area
        try:
            names = sorted(n for n in os.listdir(folder) if n.startswith(_HELD_PREFIX) and n.endswith(".md"))
        except OSError:
            continue
        for name in names:
            try:
                meta, _ = _split((folder / name).read_text(encoding="utf-8", errors="replace"))
            except OSError:
                continue
            if meta.get("type") == TASK_FILE_NOTE:
                found.append((folder / name, meta))
    return found


def held_by(ws: Workspace, path: Path) -> Path | None:
    """The note in `Pending_Approval/` (or `Rejected/`) that holds the task file at `path`, if any: one that
    names its path, or its inode (the file renamed since)."""
    rel = ws.relative(path)
    try:
        st = os.stat(path)
        ident = [st.st_dev, st.st_ino]
    except OSError:
        ident = None
    for note, meta in _held_notes(ws):
        if meta.get("path") == rel or (ident is not None and meta.get("file_id") == ident):
            return note
    return None


RUNNING = "running"  # .state/running/<task_id>: a step of that loop runs (its mtime: since when)
ASIDE = "running-aside"  # .state/running-aside/<task_id>: its marker between two steps (`step_ended`)
_LINES = {True: b"boxed\n", False: b"unboxed\n"}  # a marker's line (told apart by their lengths alone)


def step_began(ws: Workspace, task_id: str, *, boxed: bool) -> None:
    """Mark that a step of loop `task_id` runs from now, in the box or not (an older mark, left by a kill,
    keeps its time). The marker the last step put aside (`step_ended`) is taken back and its time set, when it
    says what this step would write: no file made and removed at every step (on ext4 a new file's inode is found
    by a scan over those deleted lately, ~0.3 ms of a step's CPU with many loops: issue #41)."""
    folder = f"{ws.state_dir}{os.sep}{RUNNING}{os.sep}"  # strings, not Paths: one step of every loop (#41)
    marker = folder + task_id
    with contextlib.suppress(OSError):
        try:
            os.rename(f"{ws.state_dir}{os.sep}{ASIDE}{os.sep}{task_id}", marker)
        except FileNotFoundError:  # none put aside (the first step, or a kill's marker left where it was)
            pass
        else:
            try:
                st: os.stat_result | None = os.stat(marker, follow_symlinks=False)
            except OSError:
                st = None
            if st is not None and stat.S_ISREG(st.st_mode) and st.st_size == len(_LINES[boxed]):
                os.utime(marker, follow_symlinks=False)  # its time: when this step began
                return
            with contextlib.suppress(OSError):  # saying otherwise (the other box setting), or not kiro's: anew
                os.unlink(marker)
        try:
            _make_marker(marker, boxed)
        except FileNotFoundError:  # the folder, made once (not asked for at every step)
            os.makedirs(folder, exist_ok=True)
            _make_marker(marker, boxed)


def _make_marker(marker: str, boxed: bool) -> None:
    """The marker, made only when there is none (O_EXCL: an older one keeps its time), with two system calls
    and no file object (one per step: issue #41)."""
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    except FileExistsError:
        return
    try:
        os.write(fd, _LINES[boxed])
    finally:
        os.close(fd)


def step_ended(ws: Workspace, task_id: str) -> None:
    """The step of loop `task_id` has ended: its marker is put aside in `.state/running-aside/`, which no starter
    reads (`steps_running_since` reads `.state/running/` only, as every kiro before did), for the next step to
    take back."""
    marker = f"{ws.state_dir}{os.sep}{RUNNING}{os.sep}{task_id}"
    aside = f"{ws.state_dir}{os.sep}{ASIDE}"
    with contextlib.suppress(OSError):
        try:
            os.rename(marker, f"{aside}{os.sep}{task_id}")
        except FileNotFoundError:  # the folder, made once (or the marker gone: nothing to put aside)
            if not os.path.isdir(aside):
                os.makedirs(aside, exist_ok=True)
                os.rename(marker, f"{aside}{os.sep}{task_id}")


def steps_running_since(ws: Workspace, *, unboxed_only: bool = False) -> tuple[str, int] | None:
    """(a loop, when its step began) of the step that began first among those running (or left marked by
    a kill; `unboxed_only`: of those that run without the box), None when no step runs."""
    found: list[tuple[int, str]] = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(ws.state_dir / RUNNING):
            with contextlib.suppress(OSError):
                began = entry.stat(follow_symlinks=False).st_mtime_ns
                if not unboxed_only or not Path(entry.path).read_text().startswith("boxed"):
                    found.append((began, entry.name))
    if not found:
        return None
    began, task_id = min(found)
    return task_id, began


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _approved_since_written(ws: Workspace, path: Path) -> bool:
    """Whether a person approved the task file at `path` (its note moved to `Approved/`, which sets the
    note's status change time) after it was last written."""
    rel = ws.relative(path)
    try:
        st = os.stat(path)
        names = os.listdir(ws.root / APPROVED)
    except OSError:
        return False
    for name in names:
        if not (name.startswith(_HELD_PREFIX) and name.endswith(".md")):
            continue
        note = ws.root / APPROVED / name
        try:
            meta, _ = _split(note.read_text(encoding="utf-8", errors="replace"))
            moved = os.stat(note).st_ctime_ns
        except OSError:
            continue
        if meta.get("type") == TASK_FILE_NOTE and (meta.get("path") == rel or
                                                   meta.get("file_id") == [st.st_dev, st.st_ino]):
            if moved >= st.st_ctime_ns:
                return True
    return False


def check_task_file(ws: Workspace, path: Path, *, starting: bool = True) -> None:
    """UserError when the task file at `path` waits for a person's approval (`held_by`). `starting` (a new
    loop: `start`, `watch`, `serve`): a file written while a step of any loop runs, where that step could
    write it (`.kiro/specs/`, which may not exist when the box is made; `Specs/` only without the box), is
    held now (a note in `Pending_Approval/`), as the step's end would hold it (its status change time, which
    no process can set back, is after the step began)."""
    note = held_by(ws, path)
    if note is None and starting and _approved_since_written(ws, path):
        return
    if note is None and starting:
        # Specs/ is read-only in the box: a file there is a person's unless an unboxed step runs
        in_specs = _within(os.path.realpath(path), os.path.realpath(ws.specs))
        running = steps_running_since(ws, unboxed_only=in_specs)
        with contextlib.suppress(OSError):
            if running is not None and os.stat(path).st_ctime_ns >= running[1]:
                note = hold_task_file(ws, path, task_id=running[0], step_id="(the running one)",
                                      why="written")
    if note is None:
        return
    if note.parent.name == REJECTED:
        raise UserError(f"{ws.relative(path)} was written while a step ran and a person refused it "
                        f"({ws.relative(note)}); kiro does not run it")
    raise UserError(f"{ws.relative(path)} was written while a step ran and waits for a person's approval: read it, "
                    f"then move {ws.relative(note)} to {APPROVED}/ (kiro runs no loop on it until then)")
