"""Confinement: the file tools may touch the project directory and nothing else.

A path from the model is checked on its *real* location (every symlink resolved), so neither
`..`, an absolute path, a symlinked file or folder pointing out, nor a new file created under such
a folder gets out. kiro's control folders (`.state/`, `.hooks/`, `config/`, `.git/` of the
workspace and of the project directory, and any `.git/` below) are off limits even though they
are inside: the agent must not forge its own state, hooks or config, nor plant git hooks. The
task file may be read but changed only through `add_steps`, and the workspace's task areas and
records (`Specs/`, `Done/`, `Needs_Action/`, `Logs/`, `Dashboard.md`) and the approval folders are read-only.

Checking a path and then opening it leaves a gap in which a component could be swapped for a
symlink (by a command the agent runs, say). `open_confined` closes it: it walks from the project
directory one component at a time with `O_NOFOLLOW`, so what it opens is what was checked.
Writes also refuse files with more than one hard link, which could be the same file as one
outside the project.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kiro.executors.tools.errors import ToolError
from kiro.fs.atomic import atomic_write
from kiro.fs.walk import walk

CONTROL_FOLDERS = (".state", ".hooks", "config", ".git")
# The workspace's records and task areas: readable, never written by the agent. A task file copied
# into Done/ or Needs_Action/ reads as moved there by a person, a new file in Specs/ is a new task
# for `kiro loop watch`, and Logs/ and Dashboard.md are what people trust to learn what happened. An agent
# that could write Approved/ would approve its own step proposals (SPEC §11).
READ_ONLY_AREAS = ("Specs", "Done", "Needs_Action", "Logs", "Dashboard.md", "Pending_Approval", "Approved",
                   "Rejected")


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


def _real_child(real: Path, name: str) -> Path:
    """`_real(real / name)` for a folder `real` that is real already and one plain name: one `lstat`, not one for
    every component of the path (`os.path.realpath` looks at each; a loop's `Confinement` asks for ~20 of them,
    issue #41). The same answer: a name that is no symlink, or that is not there, is itself."""
    path = real / name
    try:
        link = stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        return path
    return _real(path) if link else path


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


@dataclass(frozen=True)
class _Forbidden:
    path: Path  # real path
    label: str  # how to name it to the model
    ident: tuple[int, int] | None  # (st_dev, st_ino) when it exists: catches case-folding file systems


class Confinement:
    """Resolves the model's paths inside one project directory."""

    def __init__(self, project_dir: Path, workspace_root: Path, *, task_file: Path | None = None,
                 state_dir: Path | None = None) -> None:
        self.root = _real(project_dir)
        ws = _real(workspace_root)
        forbidden: dict[Path, _Forbidden] = {}
        candidates = [(_real_child(ws, name), name) for name in CONTROL_FOLDERS]
        candidates += [(_real_child(self.root, name), name) for name in CONTROL_FOLDERS]
        if state_dir is not None:
            candidates.append((_real(state_dir), state_dir.name))
        # loops' own worktrees (SPEC §9); a loop isolated in one works inside it. The rest of `.kiro/` is a Kiro
        # project's specs and steering, which the agent reads (kiro.store.kirospec)
        kiro_dir = _real_child(_real_child(ws, ".kiro"), "worktrees")
        if not _within(self.root, kiro_dir):
            candidates.append((kiro_dir, ".kiro/worktrees"))
        for real, label in candidates:
            if real in forbidden:
                continue
            ident: tuple[int, int] | None = None
            with contextlib.suppress(OSError):
                st = os.stat(real)
                ident = (st.st_dev, st.st_ino)
            forbidden[real] = _Forbidden(real, label, ident)
        self.forbidden = list(forbidden.values())
        self.read_only = [(_real_child(ws, name), name) for name in READ_ONLY_AREAS]
        self.task_file = _real(task_file) if task_file is not None else None

    # -- checks ----------------------------------------------------------------------------

    def resolve(self, raw: str, *, write: bool = False) -> Path:
        """The real path the model means by `raw`, or a ToolError saying why it is refused."""
        if not raw or not raw.strip():
            raise ToolError("the path is empty; give a path relative to the project directory")
        if "\x00" in raw:
            raise ToolError("the path contains a NUL character")
        if raw.startswith("~"):
            raise ToolError(f"{raw!r}: '~' is not expanded; give a path relative to the project directory")
        given = Path(raw)
        candidate = given if given.is_absolute() else self.root / given
        real = _real(candidate)
        if not _within(real, self.root):
            how = "resolves (through a symbolic link or '..') to" if not given.is_absolute() else "is"
            raise ToolError(f"{raw!r} {how} a location outside the project directory; "
                            f"only paths inside {self.root} are allowed")
        self._check_control(raw, real)
        if write and self.task_file is not None and real == self.task_file:
            raise ToolError(f"{raw!r} is the task file: it can be read, but steps are added only with "
                            f"add_steps and boxes are checked by kiro")
        if write:
            for area, name in self.read_only:
                if _within(real, area):
                    raise ToolError(f"{raw!r} is in the workspace's {name}, which the agent may read but not "
                                    f"change (add steps with add_steps, ask a person with request_human)")
        return real

    def _check_control(self, raw: str, real: Path) -> None:
        rel = real.relative_to(self.root)
        if ".git" in rel.parts:
            raise ToolError(f"{raw!r} is inside a .git/ folder, which is off limits")
        for f in self.forbidden:
            if _within(real, f.path):
                raise ToolError(f"{raw!r} is inside kiro's control folder {f.label}/, which is off limits")
        # Same folder under another spelling (a case-insensitive file system, a bind mount).
        idents = {f.ident: f for f in self.forbidden if f.ident is not None}
        if not idents:
            return
        for ancestor in (real, *real.parents):
            if not _within(ancestor, self.root) and ancestor != self.root:
                break
            try:
                st = os.stat(ancestor)
            except OSError:
                continue
            hit = idents.get((st.st_dev, st.st_ino))
            if hit is not None:
                raise ToolError(f"{raw!r} is inside kiro's control folder {hit.label}/, which is off limits")

    def _control_inode(self, dev: int, ino: int, limit: int = 20_000) -> bool:
        """Whether (dev, ino) is a file inside a control folder: a hard link in the project must not
        read kiro's state, hooks or config. Only asked for files with more than one link."""
        seen = 0
        for f in self.forbidden:
            for folder, dirs, files in walk(f.path):
                if f.label == ".git":  # git's object store is large and holds nothing a link could abuse
                    dirs[:] = [d for d in dirs if d not in ("objects", "lfs")]
                for name in files:
                    seen += 1
                    if seen > limit:
                        return True  # too many to tell: refuse rather than guess
                    with contextlib.suppress(OSError):
                        st = os.stat(os.path.join(folder, name), follow_symlinks=False)
                        if (st.st_dev, st.st_ino) == (dev, ino):
                            return True
        return False

    def is_hidden(self, real: Path) -> bool:
        """True for a path that listings and searches skip silently (control folders, .git)."""
        try:
            rel = real.relative_to(self.root)
        except ValueError:
            return True
        if ".git" in rel.parts:
            return True
        return any(_within(real, f.path) for f in self.forbidden)

    def display(self, real: Path) -> str:
        """The project-relative POSIX path the model should use to name `real`."""
        try:
            rel = real.relative_to(self.root).as_posix()
        except ValueError:
            return str(real)
        return rel or "."

    # -- opening ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def open_dir(self, real: Path, *, create: bool = False) -> Iterator[int]:
        """A directory fd for `real` (a checked path), reached from the project root without
        following any symlink. With `create`, missing folders are made on the way."""
        parts = real.relative_to(self.root).parts
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for part in parts:
                try:
                    nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise ToolError(f"folder {self.display(real)!r} does not exist") from None
                    os.mkdir(part, 0o777, dir_fd=fd)
                    nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                except OSError as exc:
                    raise ToolError(
                        f"{self.display(real)!r}: {part!r} is not a plain folder (a symbolic link or a "
                        f"file); refused ({exc.strerror})") from None
                os.close(fd)
                fd = nfd
            yield fd
        finally:
            os.close(fd)

    def read_bytes(self, real: Path, limit: int) -> tuple[bytes, int]:
        """Up to `limit` bytes of a regular file and its size, opened without following symlinks."""
        if real == self.root:
            raise ToolError(f"{self.display(real)!r} is a folder; use list_files")
        with self.open_dir(real.parent) as dfd:
            try:
                fd = os.open(real.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
            except FileNotFoundError:
                raise ToolError(f"{self.display(real)!r} does not exist") from None
            except IsADirectoryError:
                raise ToolError(f"{self.display(real)!r} is a folder; use list_files") from None
            except OSError as exc:
                raise ToolError(f"cannot open {self.display(real)!r}: {exc.strerror}") from None
            try:
                st = os.fstat(fd)
                if stat.S_ISDIR(st.st_mode):
                    raise ToolError(f"{self.display(real)!r} is a folder; use list_files")
                if not stat.S_ISREG(st.st_mode):
                    raise ToolError(f"{self.display(real)!r} is not a regular file")
                if st.st_nlink > 1 and self._control_inode(st.st_dev, st.st_ino):
                    raise ToolError(f"{self.display(real)!r} is a hard link to a file in one of kiro's control "
                                    f"folders, which are off limits")
                chunks = []
                left = limit
                while left > 0:
                    data = os.read(fd, min(left, 1 << 20))
                    if not data:
                        break
                    chunks.append(data)
                    left -= len(data)
                return b"".join(chunks), st.st_size
            finally:
                os.close(fd)

    def write_bytes(self, real: Path, data: bytes) -> bool:
        """Replace or create a regular file atomically (temp file + rename in the same folder).
        Returns True when the file was created. Refuses symlinks, special files and files with
        more than one hard link."""
        if real == self.root:
            raise ToolError(f"{self.display(real)!r} is a folder")
        with self.open_dir(real.parent, create=True) as dfd:
            created = True
            try:
                st = os.stat(real.name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                pass
            else:
                created = False
                if stat.S_ISLNK(st.st_mode):
                    raise ToolError(f"{self.display(real)!r} is a symbolic link; refused")
                if stat.S_ISDIR(st.st_mode):
                    raise ToolError(f"{self.display(real)!r} is a folder")
                if not stat.S_ISREG(st.st_mode):
                    raise ToolError(f"{self.display(real)!r} is not a regular file; refused")
                if st.st_nlink > 1:
                    raise ToolError(
                        f"{self.display(real)!r} has {st.st_nlink} hard links: it may be the same file as "
                        f"one outside the project, so kiro does not write to it")
            atomic_write(real.name, data, dir_fd=dfd, fsync=False, new_mode=0o666, keep_mode=True)
            return created
