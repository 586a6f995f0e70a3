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
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

from kiro import ownwrites

TEMP_SUFFIX = ownwrites.TEMP_SUFFIX


_temp_serial = itertools.count(secrets.randbits(32))  # unique per call in this process, no syscall each


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


def _open_temp(name: str, mode: int, folder: int) -> int:
    """Create the temp file (never through a symlink, never an existing file). A seam for tests
    that play a folder kiro may not write to (root ignores a chmod)."""
    return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=folder)


def atomic_write(
    path: Path | str,
    data: str | bytes,
    *,
    fsync: bool = True,
    mode: int | None = None,
    new_mode: int = 0o644,
    keep_mode: bool = False,
    dir_fd: int | None = None,
    unchanged: Callable[[], bool] | None = None,
    sync_folder: bool = True,
) -> bool:
    """Replace (or create) `path` with `data`, atomically.

    - `fsync=False` skips both fsyncs (files that are rewritten often and cheap to lose: Dashboard.md,
      progress reports, hooks); the rename is still atomic.
    - `sync_folder=False` (with `fsync`): the file's bytes are synced before the rename, the folder's
      entry is not; the caller fsyncs the folder once for many files before anything depends on them
      (a batch start's new state files, kiro.runner.StartBatch).
    - `mode` sets the file's permission bits exactly; otherwise a new file gets `new_mode` (less the
      umask) and, with `keep_mode`, an existing file keeps its bits (and its owner, where allowed).
    - `dir_fd`: `path` is a name inside that open folder (the agent's confined file tools).
    - `unchanged`: asked right before the rename; when it says False nothing is written and the
      call returns False (a compare-and-swap: the task file edited by a person meanwhile).

    Returns True when the file was written. A full disk releases kiro's reserve and the write is
    tried once more (kiro.diskfull); if it still fails, DiskFull. No temp file is left either way.
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    from kiro import diskfull

    written = diskfull.retry(lambda: _atomic_write(path, raw, fsync=fsync, mode=mode, new_mode=new_mode,
                                                   keep_mode=keep_mode, dir_fd=dir_fd, unchanged=unchanged,
                                                   sync_folder=sync_folder),
                             Path(path).name)
    if written and dir_fd is None:
        ownwrites.note_own_write(path)  # kiro's own watcher need not wake for it
    return written


def _atomic_write(path: Path | str, raw: bytes, *, fsync: bool, mode: int | None, new_mode: int, keep_mode: bool,
                  dir_fd: int | None, unchanged: Callable[[], bool] | None, sync_folder: bool = True) -> bool:
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
                if mode is not None:
                    os.fchmod(fd, mode)
                elif keep is not None:
                    os.fchmod(fd, stat.S_IMODE(keep.st_mode))
                    with contextlib.suppress(OSError):  # not root: the file becomes ours, as with any editor
                        os.fchown(fd, keep.st_uid, keep.st_gid)
                view = memoryview(raw)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
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
        if fsync and sync_folder:
            fsync_dir(folder)
        return True
    finally:
        if dir_fd is None:
            os.close(folder)
