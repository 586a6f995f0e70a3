"""The workspace: its folders, where each file lives, and how a path a person typed is resolved.

Layout (SPEC §1):

    config/autonomous_loop.yaml   Specs/   Done/   Needs_Action/   Logs/   .state/   .hooks/   Dashboard.md
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from kiro.errors import KiroError, TaskNotFound, UserError
from kiro.fs import safeio
from kiro.fs.statcache import StatCache
from kiro.fs.walk import WALK_MAX_DEPTH

CONFIG_RELPATH = Path("config") / "autonomous_loop.yaml"
FOLDERS = ("Specs", "Done", "Needs_Action", "Logs", ".state", ".hooks")
NOT_TASKS = frozenset({"requirements.md", "design.md", "readme.md"})
TASK_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


# A process-wide view of the folders walked for *.md files (Specs/, Done/, Needs_Action/): each folder's entries
# as last listed, listed again only when the folder changed (kiro.fs.statcache, git's racily-clean rule), so that
# a look around every step of every loop (kiro.executors.control.TaskFiles) lists again only the folders that
# changed since: a stat per folder, no listing, no sort, no Path built (with a thousand loops the walk was most of
# their time: issue #41). A file planted with the folder's mtime put back still moves its ctime: listed again.
Kind = str  # an entry's kind: "dir" (a folder, not a link: walked), "file" (a regular file), "link", "other"
Listing = tuple[tuple[str, Kind], ...]  # (path, kind): no Path built per entry (a thousand loops' folders: #41)
_listed: StatCache[Listing | None] = StatCache(most=50_000)


def _listing(folder: str) -> Listing | None:
    """The entries of `folder` a walk for *.md files needs, sorted by name: its folders that are not links and
    its *.md files (path, kind); None when it cannot be listed (gone)."""
    try:
        st = os.stat(folder)
    except OSError:
        return None
    return _listed.read(folder, st, lambda: _list(folder), keep=lambda listing: listing is not None)


def _list(folder: str) -> Listing | None:
    found: list[tuple[str, str, Kind]] = []  # (name, path, kind), sorted by name
    try:
        with os.scandir(folder) as it:
            for entry in it:
                try:  # as kiro.fs.walk: a link to a folder is no file and is not walked
                    if entry.is_dir():
                        if not entry.is_symlink():
                            found.append((entry.name, entry.path, "dir"))
                        continue
                except OSError:
                    pass
                if entry.name.endswith(".md"):
                    try:
                        kind = "file" if entry.is_file(follow_symlinks=False) else \
                            "link" if entry.is_symlink() else "other"
                    except OSError:
                        kind = "other"
                    found.append((entry.name, entry.path, kind))
    except OSError:
        return None
    found.sort()
    return tuple((path, kind) for _name, path, kind in found)


def _markdown(folder: Path) -> list[tuple[str, Kind]]:
    """Every `*.md` under `folder` (path, kind), in the order of their sorted paths, not through symlinked
    folders, at most WALK_MAX_DEPTH levels deep, from the folders' kept listings (`_listing`)."""
    out: list[tuple[str, Kind]] = []
    stack: list[tuple[str, Kind, int]] = [(os.fspath(folder), "dir", 0)]
    while stack:
        name, kind, depth = stack.pop()
        if kind != "dir":
            out.append((name, kind))
            continue
        listing = _listing(name) if depth <= WALK_MAX_DEPTH else None
        if listing is not None:  # files and folders by name: depth first, each path after the one it sorts after
            below = depth + 1
            stack.extend([(n, k, below) for n, k in reversed(listing)])
    return out


def markdown_files(folder: Path) -> list[Path]:
    """Every `*.md` under `folder`, sorted, not through symlinked folders (as `Path.rglob`). A folder
    that goes away meanwhile (a loop moving its task to Done/, in this process or another) is passed
    over, where `rglob` raised FileNotFoundError and ended `kiro loop watch`. Without recursion and at most
    WALK_MAX_DEPTH levels deep: os.walk ended a start with RecursionError on a 1,500-deep tree. Listed again
    only where a folder changed (`_listing`)."""
    return [Path(name) for name in markdown_names(folder)]


def markdown_names(folder: Path) -> list[str]:
    """`markdown_files(folder)` as strings: no Path built per file (the look around every step: issue #41)."""
    return [name for name, _kind in _markdown(folder)]


def _is_task_name(name: str) -> bool:
    """A file name a task file may have: `*.md`, not hidden, not a spec's requirements, design or readme."""
    return name.endswith(".md") and name.lower() not in NOT_TASKS and not name.startswith(".")


def kiro_specs(root: Path) -> list[Path]:
    """The Kiro specs' task files of the project at `root`: `.kiro/specs/*/tasks.md`, run in place."""
    from kiro.store import kirospec  # the Kiro specs' reader, imported where they are read (not by `status`)

    return [kirospec.specs_folder(root) / name / "tasks.md" for name in kirospec.spec_names(root)]


def real_path(path: str) -> str:
    """`os.path.realpath(path)`, asked of the kernel when `path` names a file or folder (Linux's `/proc/self/fd`): a
    few system calls where realpath lstat's and joins each component in Python (~80 K instructions for a 5-deep
    path; the look around a step asks for Specs/ twice and for the loop's own task file once: issue #41). Anything
    else (nothing there, a dangling link or a loop of links, no O_PATH or no `/proc`, a file deleted or out of this
    process's root) is realpath's."""
    if not _O_PATH:
        return os.path.realpath(path)
    try:
        fd = os.open(path, _O_PATH)
    except (OSError, ValueError):
        return os.path.realpath(path)
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        real = ""
    finally:
        os.close(fd)
    if not real.startswith(os.sep) or real.endswith(" (deleted)"):
        return os.path.realpath(path)
    return real


# an O_PATH open: it follows links as realpath does, needs no read permission, reads nothing, does not block on a
# FIFO and is no open a watcher hears; without O_PATH (no system kiro runs on) an open could do any of these, so
# real_path is realpath there
_O_PATH = getattr(os, "O_PATH", 0)
if _O_PATH:
    _O_PATH |= os.O_CLOEXEC


def task_files(ws: Workspace, *, in_specs: bool = True) -> Iterator[tuple[Path, str]]:
    """The task files a watch looks after (SPEC §3, §13), on either backend: every `*.md` in Specs/ (any
    depth) and each Kiro spec's `.kiro/specs/*/tasks.md`, as (the path found, its real path), each real file
    once: a symlinked folder (`ln -s .kiro/specs Specs`, a spec folder linked to another) is one file once.
    `in_specs` False: not the files that are Specs/'s own (the look around a boxed step, where Specs/ is
    read-only: kiro.executors.control.TaskFiles), only those elsewhere (a link's target, a Kiro spec)."""
    for name, real in task_names(ws, in_specs=in_specs):
        yield Path(name), real


def task_names(ws: Workspace, *, in_specs: bool = True) -> Iterator[tuple[str, str]]:
    """`task_files(ws)` with the path found as a string: no Path built per file (the look around every step of
    every loop, kiro.executors.control.Look, makes one only for a file it holds: issue #41)."""
    seen: set[str] = set()
    # the walk never goes through a symlinked folder: below Specs/ (itself maybe a link) only a file that is a
    # link needs its real path asked for, component by component (a look at every step of every loop: issue #41)
    folder = ws.specs
    specs = os.fspath(folder) + os.sep
    specs_real = real_path(specs[:-1]) + os.sep
    found = _markdown(folder)
    if os.path.isdir(f"{os.fspath(ws.root)}{os.sep}.kiro{os.sep}specs"):  # most workspaces have none: no Path built
        found += [(os.fspath(p), "spec") for p in kiro_specs(ws.root)]
    for name, kind in found:  # moved by their loops meanwhile
        if kind == "file" and name.startswith(specs):
            if not in_specs or not _is_task_name(os.path.basename(name)):
                continue
            real = specs_real + name[len(specs):]
        elif not _is_task_name(os.path.basename(name)):
            continue
        elif os.path.isfile(name):
            real = real_path(name)
        else:
            continue
        if real not in seen:
            seen.add(real)
            yield name, real


def is_task_id(value: object) -> bool:
    """A task id names files, so it must be a plain name: no folder, no way out of the workspace."""
    return isinstance(value, str) and TASK_ID_RE.fullmatch(value) is not None and ".." not in value


def check_task_id(task_id: str) -> str:
    """`task_id`, or UserError when it is not a plain name (`is_task_id`)."""
    if not is_task_id(task_id):
        raise UserError(
            f"invalid task id {_clip(task_id)}: use letters, digits, '_', '-' and '.' (at most 128 characters)"
        )
    return task_id


def _clip(text: str, width: int = 60) -> str:
    """`text` quoted for an error line, cut to `width` characters (a 5,000-character argument is named, not
    printed)."""
    return repr(text) if len(text) <= width else f"{text[:width]!r}... ({len(text)} characters)"


NOT_A_FOLDER = "is not a folder"


def _not_a_dir(path: Path) -> str | None:
    """Why `path` is no folder to work in, or None when it is one."""
    try:
        return None if path.is_dir() else NOT_A_FOLDER
    except OSError as exc:  # a name longer than the file system allows (ENAMETOOLONG), ...
        return f"cannot be a folder ({exc.strerror or exc})"


def _real(path: Path) -> Path:
    """`path.resolve()` that never raises: a symlink loop stays as it is (Path.resolve raises
    RuntimeError on one in Python 3.11). Asked of the kernel (`real_path`)."""
    return Path(real_path(os.fspath(path)))


def _utf8(path: Path) -> Path:
    """A task file's path must be text: kiro writes it in the state, events and reports (JSON, UTF-8). A
    name of bytes that are not UTF-8 (made on another system, or by a script) is one clear line."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(path).decode("utf-8", "backslashreplace")  # the bad bytes as \xff
        raise UserError(f"task file '{shown}': its path is not valid UTF-8; rename the file or its folder") from None
    return path


def current_folder() -> Path | None:
    """The current directory, or None when it no longer exists (deleted under a shell that is still in it)."""
    try:
        return Path.cwd()
    except FileNotFoundError:
        return None


def _not_a_folder(path: Path) -> str | None:
    """Why `path` cannot serve as a folder, or None when it is one or is absent."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be examined ({exc.strerror})"
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "is a symlink to something missing"
    except OSError as exc:
        return "is a symlink loop" if exc.errno == errno.ELOOP else f"cannot be examined ({exc.strerror})"
    if stat.S_ISDIR(mode):
        return None
    from kiro.fs.safeio import file_kind

    return "is a file" if stat.S_ISREG(mode) else f"is {file_kind(mode)}"


class Workspace:
    """A workspace folder and its state directory; immutable, compared and hashed by value. (A plain
    class, not a frozen dataclass: the read path imports this module, and dataclasses costs ~10 ms.)"""

    __slots__ = ("root", "state_directory", "state_dir", "specs", "done", "needs_action")
    root: Path
    state_directory: str
    state_dir: Path
    """The state folder (`root / state_directory`), made once: a loop's start asks for it ~17 times."""
    specs: Path
    done: Path
    needs_action: Path
    """The folders of task files, made once: the look around every step asks for each (issue #41)."""

    def __init__(self, root: Path, state_directory: str = ".state") -> None:
        object.__setattr__(self, "root", root)
        object.__setattr__(self, "state_directory", state_directory)
        object.__setattr__(self, "state_dir", root / state_directory)
        object.__setattr__(self, "specs", root / "Specs")
        object.__setattr__(self, "done", root / "Done")
        object.__setattr__(self, "needs_action", root / "Needs_Action")

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r}")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Workspace)
        return (self.root, self.state_directory) == (other.root, other.state_directory)

    def __hash__(self) -> int:
        return hash((self.root, self.state_directory))

    def __repr__(self) -> str:
        return f"Workspace(root={self.root!r}, state_directory={self.state_directory!r})"

    # -- discovery -------------------------------------------------------------------------

    @classmethod
    def find(cls, explicit: Path | str | None = None, *, cwd: Path | None = None) -> Workspace:
        """`--workspace`, else `$KIRO_WORKSPACE`, else the nearest ancestor with a config or
        `.state/`, else the current directory."""
        if explicit:
            root = Path(explicit).expanduser()
            why = _not_a_dir(root)
            if why:
                fix = f"; create it with `kiro init {root}`" if why == NOT_A_FOLDER else ""
                raise UserError(f"workspace {_clip(str(root), 200)} {why}{fix}")
            return cls(root.resolve())
        env = os.environ.get("KIRO_WORKSPACE")
        if env:
            root = Path(env).expanduser()
            why = _not_a_dir(root)
            if why:
                raise UserError(f"KIRO_WORKSPACE={_clip(env, 200)} {why}")
            return cls(root.resolve())
        here = cwd or current_folder()
        if here is None:
            raise UserError("the current folder no longer exists (deleted?); cd into a workspace, or name one "
                            "with --workspace")
        here = here.resolve()
        for candidate in (here, *here.parents):
            if (candidate / CONFIG_RELPATH).is_file() or (candidate / ".state").is_dir():
                return cls(candidate)
        return cls(here)

    def check_is_workspace(self) -> None:
        """For a command that makes no sense where no loop can have run (`stop --all`, `watch --detach`): a
        folder without config/autonomous_loop.yaml or .state/ is one line, not a workspace made in passing."""
        if (self.root / CONFIG_RELPATH).is_file() or (self.root / ".state").is_dir():
            return
        import shlex

        raise UserError(f"{self.root} is not a kiro workspace (it has no config/autonomous_loop.yaml or .state/); "
                        f"make it one with `kiro init {shlex.quote(str(self.root))}`, or name another with "
                        f"--workspace")

    def with_state_directory(self, state_directory: str) -> Workspace:
        return Workspace(self.root, state_directory)

    # -- folders ---------------------------------------------------------------------------

    @property
    def logs(self) -> Path:
        return self.root / "Logs"

    @property
    def hooks(self) -> Path:
        return self.root / ".hooks"

    @property
    def config_file(self) -> Path:
        return self.root / CONFIG_RELPATH

    @property
    def dashboard(self) -> Path:
        return self.root / "Dashboard.md"

    # -- files -----------------------------------------------------------------------------

    def state_file(self, task_id: str) -> Path:
        return self.state_dir / f"autonomous_loop_{task_id}.json"

    def archived_state_file(self, task_id: str) -> Path:
        return self.state_dir / "archive" / f"autonomous_loop_{task_id}.json"

    def backups_dir(self) -> Path:
        return self.state_dir / "backups"

    def lock_file(self, task_id: str) -> Path:
        return self.state_dir / f"autonomous_loop_{task_id}.lock"

    def transcript_file(self, task_id: str) -> Path:
        return self.state_dir / "transcripts" / f"{task_id}.jsonl"

    def memory_db(self) -> Path:
        return self.state_dir / "memory.db"

    def hook_file(self, task_id: str) -> Path:
        return self.hooks / f"stop_autonomous_loop_{task_id}.md"

    @property
    def global_hook_file(self) -> Path:
        return self.hooks / "stop_autonomous_loop.md"

    def event_log(self, task_id: str) -> Path:
        return self.logs / f"{task_id}.jsonl"

    def completion_report(self, task_id: str) -> Path:
        return self.logs / "completion_reports" / f"{task_id}.md"

    def progress_report(self, task_id: str, iteration: int) -> Path:
        return self.logs / "progress_reports" / f"{task_id}_{iteration:04d}.md"

    def intervention_request(self, task_id: str) -> Path:
        return self.needs_action / f"intervention_{task_id}.md"

    def escalation(self, task_id: str) -> Path:
        return self.needs_action / f"escalation_{task_id}.md"

    def review_note(self, task_id: str) -> Path:
        return self.needs_action / f"review_{task_id}.md"

    def review_changes_note(self, task_id: str) -> Path:
        """The note of the review helper (kiro.core.review) when its reviewers did not approve a step."""
        return self.needs_action / f"review_changes_{task_id}.md"

    def human_request(self, task_id: str) -> Path:
        return self.needs_action / f"request_{task_id}.md"

    def detached_output(self, task_id: str) -> Path:
        return self.logs / f"{task_id}.out"

    # -- paths -----------------------------------------------------------------------------

    def relative(self, path: Path) -> str:
        """A workspace-relative POSIX path when `path` is inside the workspace, else the absolute path."""
        try:
            return _real(path).relative_to(self.root).as_posix()
        except ValueError:
            return str(path)

    def absolute(self, stored: str) -> Path:
        """The inverse of `relative`."""
        p = Path(stored)
        return p if p.is_absolute() else self.root / p

    def resolve_task(self, raw: str | Path) -> Path:
        """A `--task` argument as a real file. `/Specs/x.md` means workspace-relative when no such
        absolute path exists (SPEC §1); a relative path is tried against the current directory,
        then the workspace."""
        text = str(raw)
        candidates: list[Path] = []
        p = Path(text).expanduser()
        if p.is_absolute():
            candidates.append(p)
            candidates.append(self.root / text.lstrip("/"))
        else:
            here = current_folder()  # None: deleted, so only the workspace is left to look in
            if here is not None:
                candidates.append(here / p)
            candidates.append(self.root / p)
        try:
            for c in candidates:
                if c.is_file():
                    return _utf8(c.resolve())
            for c in candidates:
                if c.is_dir() and (c / "tasks.md").is_file():
                    return _utf8((c / "tasks.md").resolve())
        except OSError as exc:  # a name longer than the file system allows (ENAMETOOLONG), ...
            raise TaskNotFound(f"task file {_clip(text, 200)}: {exc.strerror or exc}") from None
        raise TaskNotFound(
            f"task file {text!r} not found (looked in {', '.join(repr(str(c)) for c in dict.fromkeys(candidates))})"
        )

    def area_of(self, path: Path) -> str | None:
        """Which of Specs / Done / Needs_Action a path lies in, if any."""
        try:
            rel = _real(path).relative_to(self.root)
        except ValueError:
            return None
        first = rel.parts[0] if rel.parts else ""
        return first if first in ("Specs", "Done", "Needs_Action") else None

    def counterpart(self, path: Path, area: str) -> Path:
        """The same relative path under another area: Specs/a/tasks.md -> Done/a/tasks.md."""
        rel = _real(path).relative_to(self.root)
        if rel.parts and rel.parts[0] in ("Specs", "Done", "Needs_Action"):
            rel = Path(*rel.parts[1:])
        return self.root / area / rel

    def check_folders(self) -> None:
        """Each folder kiro uses is a folder or absent (kiro creates it): not a file, a FIFO, a
        dangling symlink or a symlink loop; and the global stop hook is not a folder. Raises a
        UserError naming the first that is wrong and the fix."""
        state = self.state_dir
        folders = [self.root / name for name in FOLDERS] + [
            self.root / "config", state, state / "backups", state / "archive", state / "transcripts",
            state / "prompts", self.logs / "completion_reports", self.logs / "progress_reports",
        ]
        for folder in folders:
            problem = _not_a_folder(folder)
            if problem:
                raise UserError(f"{self.relative_name(folder)} {problem}, not a folder (in {self.root}); "
                                f"move it away and kiro creates the folder")
        self.check_hook(self.global_hook_file)

    def check_hook(self, hook: Path) -> None:
        """A stop hook is a file kiro may delete or write: a folder (or worse) in its place is an error."""
        try:
            mode = os.lstat(hook).st_mode
        except FileNotFoundError:
            return
        except OSError as exc:
            raise UserError(f"stop hook {self.relative_name(hook)} cannot be examined ({exc.strerror}); "
                            f"remove it") from None
        if stat.S_ISREG(mode) or stat.S_ISLNK(mode):
            return
        from kiro.fs.safeio import file_kind

        raise UserError(f"stop hook {self.relative_name(hook)} is {file_kind(mode)}, not a file; remove it "
                        f"(a stop hook is a plain file, e.g. `touch {self.relative_name(hook)}`)")

    def relative_name(self, path: Path) -> str:
        """`path` relative to the workspace without resolving symlinks (which may loop)."""
        try:
            return path.relative_to(self.root).as_posix()
        except ValueError:
            return str(path)

    @property
    def laid_out(self) -> bool:
        """Whether the workspace has kiro's layout (SPEC §1): `kiro init` ran (config/autonomous_loop.yaml), or
        it has a Specs/ folder, or it is no Kiro repository. A Kiro repository (`.kiro/specs/` and neither)
        runs its specs in place: kiro makes none of its layout's folders or Dashboard.md at the project's root,
        only its own `.state/` and `Logs/` (kept out of git, kiro.git.ignore); Needs_Action/ and the others
        are made when a note is first written there (kiro.fs.atomic)."""
        from kiro.store import kirospec

        return (self.config_file.is_file() or self.specs.is_dir()
                or not kirospec.specs_folder(self.root).is_dir())

    def ensure_folders(self) -> None:
        for name in FOLDERS if self.laid_out else ("Logs",):
            (self.root / name).mkdir(parents=True, exist_ok=True)
        self.state_dir.mkdir(parents=True, exist_ok=True)


# -- a start that is refused creates nothing --------------------------------------------------------

START_GUARD = ".start.lock"  # in the state folder: held while a loop is created (kiro.core.runner)


@contextlib.contextmanager
def nothing_made_if_refused(root: Path, state_dir: Callable[[], Path]) -> Iterator[None]:
    """A start refused (a KiroError) leaves the workspace as it found it: kiro's folders (SPEC §1) that were
    not there before are taken away again, with the start guard's lock file. Only what is empty goes, and
    the lock file only when no other process holds it: a start running beside this one loses nothing.
    `state_dir()`: the state folder the config names, asked only when a start was refused."""
    try:
        before = set(os.listdir(root))
    except OSError:
        before = None
    try:
        yield
    except KiroError:
        if before is not None:
            _take_back(root, before, state_dir)
        raise


def _take_back(root: Path, before: set[str], state_dir: Callable[[], Path]) -> None:
    try:
        folders = [state_dir()]
    except KiroError:  # the config itself was refused: kiro's default
        folders = [root / ".state"]
    folders += [root / name for name in FOLDERS]
    for folder in dict.fromkeys(folders):
        try:
            top = folder.relative_to(root).parts[0]
        except (ValueError, IndexError):
            continue  # a state folder outside the workspace: not ours to judge
        if top in before:
            continue
        _remove_guard(folder / START_GUARD)
        for empty in (folder, *folder.relative_to(root).parents[:-1]):
            path = empty if empty is folder else root / empty
            try:
                os.rmdir(path)
            except OSError:
                break  # not empty (or gone): kept


def _remove_guard(path: Path) -> None:
    from kiro.fs.locks import Flock, Timeout

    if not os.path.isfile(path):
        return
    lock = Flock(path)
    try:
        lock.acquire()
    except (Timeout, OSError):
        return  # another start holds it: it stays
    try:
        lock.remove()
    finally:
        lock.release()


# -- where a task file is now ------------------------------------------------------------------

def frontmatter_task_id(path: Path) -> str | None:
    """The `kiro_task_id` a task file's frontmatter names (kiro.store.frontmatter), when it is a valid one;
    None for a file kiro cannot read."""
    from kiro.store import frontmatter  # (not at import: a read command that locates no task file needs none)

    try:
        text = safeio.read_bytes(path, limit=safeio.TASK_MAX_BYTES).decode("utf-8-sig")
        found = frontmatter.read(text).data.get("kiro_task_id")
        return check_task_id(found) if isinstance(found, str) else None
    except (OSError, UnicodeDecodeError, UserError, frontmatter.FrontmatterError):
        return None


def find_by_task_id(folder: Path, task_id: str) -> Path | None:
    """A task file under `folder` whose frontmatter says `kiro_task_id: <task_id>`."""
    if not folder.is_dir():
        return None
    for p in markdown_files(folder):
        if p.is_file() and frontmatter_task_id(p) == task_id:
            return p
    return None


def locate_task(ws: Workspace, recorded: Path, task_id: str) -> tuple[str | None, Path | None]:
    """Where a task file is now: ("here", path) when it is where the state says; else the area it
    was moved to (Done, Needs_Action, Specs) and its new path, found by the same relative path or by
    its `kiro_task_id`; (None, None) when it is nowhere."""
    if recorded.is_file():
        return "here", recorded
    inside = ws.area_of(recorded) is not None or _inside(ws, recorded)
    for area in ("Done", "Needs_Action", "Specs"):
        if inside:
            candidate = ws.counterpart(recorded, area)
            if candidate.is_file() and candidate != recorded:
                return area, candidate
        found = find_by_task_id(ws.root / area, task_id) or _moved(ws, task_id, ws.root / area)
        if found is not None:
            return area, found
    return None, None


def _moved(ws: Workspace, task_id: str, folder: Path) -> Path | None:
    """A task file kiro writes nothing into, moved under `folder` (kiro.store.taskmap)."""
    from kiro.store import taskmap  # (not at import, as frontmatter_task_id's)

    return taskmap.find_moved(ws.state_dir, task_id, lambda: markdown_files(folder)) if folder.is_dir() else None


def _inside(ws: Workspace, p: Path) -> bool:
    try:
        Path(os.path.realpath(p)).relative_to(ws.root)
        return True
    except ValueError:
        return False
