"""One crash-safe file write for all of kiro: state files, task files, reports, hooks, the agent's
file tools.

Temp file in the same folder (same filesystem, so the rename is atomic), fsync, `os.replace`, fsync
the folder: a reader sees the old file or the new one, never a torn one, also after a power cut.
Every step goes through a descriptor of the folder, so a folder swapped for a symlink midway cannot
redirect the write, and the temp file is created with O_EXCL | O_NOFOLLOW.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from kiro.fs import ownwrites

TEMP_SUFFIX = ownwrites.TEMP_SUFFIX


_temp_serial = itertools.count(int.from_bytes(os.urandom(4)))  # unique per call in this process, no syscall each


def temp_name(name: str) -> str:
    """The temp file beside `name` (hidden, unique per process and call, recognisable for cleanup).
    Created with O_EXCL: a name left by a process that had this pid before is never written into."""
    return f".{name}.{os.getpid()}-{next(_temp_serial):x}{TEMP_SUFFIX}"


def fsync_dir(folder: Path | str | int) -> None:
    """Make a folder's entries (a rename, an unlink) durable. Platforms without folder fds: no-op."""
    if isinstance(folder, int):
        with contextlib.suppress(OSError):
            os.fsync(folder)
        return
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def _fill(fd: int, raw: bytes | list[bytes], mode: int | None, keep: os.stat_result | None) -> None:
    """A new temp file's permission bits (`mode` exactly, or those of the file it replaces, `keep`,
    with its owner where allowed), then its bytes (in pieces, written one after the other)."""
    if mode is not None:
        os.fchmod(fd, mode)
    elif keep is not None:
        os.fchmod(fd, stat.S_IMODE(keep.st_mode))
        with contextlib.suppress(OSError):  # not root: the file becomes ours, as with any editor
            os.fchown(fd, keep.st_uid, keep.st_gid)
    for chunk in (raw,) if isinstance(raw, bytes) else raw:
        view = memoryview(chunk)
        while view:
            view = view[os.write(fd, view):]


def _open_temp(name: str, mode: int, folder: int) -> int:
    """Create the temp file (never through a symlink, never an existing file). A seam for tests
    that play a folder kiro may not write to (root ignores a chmod)."""
    return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=folder)


def atomic_write(
    path: Path | str,
    data: str | bytes | list[bytes],
    *,
    fsync: bool = True,
    mode: int | None = None,
    new_mode: int = 0o644,
    keep_mode: bool = False,
    dir_fd: int | None = None,
    unchanged: Callable[[], bool] | None = None,
) -> bool:
    """Replace (or create) `path` with `data`, atomically. `data` in pieces (a list of bytes): the file is
    their concatenation, written piece by piece (a large state's snapshot, never joined into one string).

    - `fsync=False` skips both fsyncs (files that are rewritten often and cheap to lose: Dashboard.md,
      progress reports, hooks); the rename is still atomic.
    - `mode` sets the file's permission bits exactly; otherwise a new file gets `new_mode` (less the
      umask) and, with `keep_mode`, an existing file keeps its bits (and its owner, where allowed).
    - `dir_fd`: `path` is a name inside that open folder (the agent's confined file tools).
    - `unchanged`: asked right before the rename; when it says False nothing is written and the
      call returns False (a compare-and-swap: the task file edited by a person meanwhile).

    Returns True when the file was written. A full disk releases kiro's reserve and the write is
    tried once more (kiro.fs.diskfull); if it still fails, DiskFull. No temp file is left either way.
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    from kiro.fs import diskfull

    written = diskfull.retry(lambda: _atomic_write(path, raw, fsync=fsync, mode=mode, new_mode=new_mode,
                                                   keep_mode=keep_mode, dir_fd=dir_fd, unchanged=unchanged),
                             Path(path).name)
    if written and dir_fd is None:
        ownwrites.note_own_write(path)  # kiro's own watcher need not wake for it
    return written


def _atomic_write(path: Path | str, raw: bytes | list[bytes], *, fsync: bool, mode: int | None, new_mode: int,
                  keep_mode: bool, dir_fd: int | None, unchanged: Callable[[], bool] | None) -> bool:
    if dir_fd is None:
        target = Path(path)
        try:
            folder = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:  # made on first need: a mkdir per write cost more than the write (#12)
            target.parent.mkdir(parents=True, exist_ok=True)
            folder = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
        name = target.name
    else:
        folder, name = dir_fd, str(path)
    try:
        create_mode = 0o600 if mode is not None else new_mode  # an exact mode is set before any byte lands
        keep: os.stat_result | None = None
        if mode is None and keep_mode:
            with contextlib.suppress(FileNotFoundError):
                keep = os.stat(name, dir_fd=folder)
        tmp = temp_name(name)
        fd = _open_temp(tmp, create_mode, folder)
        try:
            try:
                _fill(fd, raw, mode, keep)
                if fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            if unchanged is not None and not unchanged():
                os.unlink(tmp, dir_fd=folder)
                return False
            os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=folder)
            raise
        if fsync:
            fsync_dir(folder)
        return True
    finally:
        if dir_fd is None:
            os.close(folder)


class _StagedFile(NamedTuple):
    tmp: str
    target: str
    unchanged: Callable[[], bool] | None
    changed: Callable[[], object] | None
    error: Callable[[OSError], Exception] | None


class Staged:
    """New files put in place together: each durable before its rename and every rename durable at
    the end, as `atomic_write` promises, with one flush of each file system instead of an fsync of
    every file and folder. A batch start's first writes (kiro.core.runner.StartBatch): 1,000 loops made
    3,000 fsyncs, on 32 threads that took turns at the interpreter lock (issue #12).

    `add` writes the bytes to a temp file beside the path now, unsynced. `commit` flushes the file
    systems the temp files are on (syncfs), renames each over its path in the order added (after a
    compare-and-swap, where one is given), flushes them again (the names), then runs what `then`
    queued. `discard` removes the temp files not renamed; `commit` does it too when it fails. Where
    the C library has no syncfs, each temp file is fsynced before its rename and each folder after."""

    def __init__(self) -> None:
        self._files: list[_StagedFile] = []
        self._devices: dict[int, str] = {}  # st_dev -> a folder on that file system
        self._then: list[Callable[[], object]] = []

    def __len__(self) -> int:
        return len(self._files)

    def add(self, path: Path | str, data: str | bytes, *, keep_mode: bool = False,
            unchanged: Callable[[], bool] | None = None, changed: Callable[[], object] | None = None,
            error: Callable[[OSError], Exception] | None = None) -> None:
        """Stage `data` for `path` (a new file gets mode 0o644 less the umask; `keep_mode`: an existing
        file's bits, and owner where allowed). `unchanged` is asked right before the rename: when it
        says False the temp file is dropped and `changed()` runs instead (it writes on its own).
        `error`: what an OSError writing or renaming this file is raised as (a full disk is DiskFull)."""
        from kiro.fs import diskfull

        raw = data.encode("utf-8") if isinstance(data, str) else data
        target = os.fspath(path)
        folder, name = os.path.split(target)
        tmp = os.path.join(folder, temp_name(name))

        def write() -> None:
            keep = None
            if keep_mode:
                with contextlib.suppress(FileNotFoundError):
                    keep = os.stat(target)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            try:
                _fill(fd, raw, None, keep)
                self._devices.setdefault(os.fstat(fd).st_dev, folder or ".")
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            finally:
                os.close(fd)

        try:
            diskfull.retry(write, name)
        except OSError as exc:
            if error is None:
                raise
            raise error(exc) from None
        self._files.append(_StagedFile(tmp, target, unchanged, changed, error))

    def then(self, job: Callable[[], object]) -> None:
        """Run `job` after the commit (a view written after the file it shows)."""
        self._then.append(job)

    def commit(self) -> None:
        files, self._files = self._files, []
        then, self._then = self._then, []
        done = 0  # files whose temp file is renamed or removed
        try:
            flushed = self._flush()
            folders: set[str] = set()
            for f in files:
                try:
                    if not flushed:
                        _fsync_path(f.tmp)
                    if f.unchanged is not None and not f.unchanged():
                        os.unlink(f.tmp)
                        done += 1
                        if f.changed is not None:
                            f.changed()
                        continue
                    os.replace(f.tmp, f.target)
                except OSError as exc:
                    if f.error is None:
                        raise
                    raise f.error(exc) from None
                done += 1
                ownwrites.note_own_write(f.target)
                folders.add(os.path.dirname(f.target) or ".")
            if flushed:
                self._flush()
            else:
                for folder in folders:
                    fsync_dir(folder)
        finally:
            self._files = files[done:]
            self.discard()
        for job in then:
            job()

    def discard(self) -> None:
        """Remove the temp files not put in place (and forget what `then` queued)."""
        for f in self._files:
            with contextlib.suppress(OSError):
                os.unlink(f.tmp)
        self._files.clear()
        self._then.clear()

    def _flush(self) -> bool:
        """syncfs(2) each file system a temp file is on; False where the C library has none."""
        syncfs = _syncfs()
        if syncfs is None:
            return False
        for folder in self._devices.values():
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                if syncfs(fd) != 0:
                    import ctypes

                    err = ctypes.get_errno()
                    raise OSError(err, f"could not flush the file system of {folder}: {os.strerror(err)}")
            finally:
                os.close(fd)
        return True


_SYNCFS: list[Callable[[int], int] | None] = []


def _syncfs() -> Callable[[int], int] | None:
    """The C library's syncfs (Linux), looked up once; None where there is none."""
    if not _SYNCFS:
        fn = None
        try:
            import ctypes

            fn = getattr(ctypes.CDLL(None, use_errno=True), "syncfs", None)
            if fn is not None:
                fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
        except (ImportError, OSError):  # pragma: no cover - no ctypes, or no C library to open
            fn = None
        _SYNCFS.append(fn)
    return _SYNCFS[0]


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
