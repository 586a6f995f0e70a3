"""A recursive inotify watch read on the event loop itself (issue #12): no thread, no GIL taken
every few milliseconds while idle, no thread hop per change batch. kiro.watch uses it on Linux and
falls back to watchfiles where it cannot start (another OS, no inotify, the watch limit reached).

Changes are read in batches: the first event arms a timer (`DEBOUNCE` seconds); when it fires,
every event queued by then is read at once, new folders get their own watches (and count as a
change: what was created in them before the watch is seen by the waiter's own re-check), and
`on_change(paths)` is called with the paths that changed. A full kernel queue (IN_Q_OVERFLOW)
reports the watched roots themselves. Standard library only (ctypes).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import struct
import sys
import threading
from collections.abc import Callable
from pathlib import Path

IN_MODIFY = 0x002
IN_ATTRIB = 0x004
IN_CLOSE_WRITE = 0x008
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
MASK = (IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
        | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR)
DEBOUNCE = 0.02
WATCH_MAX_DEPTH = 4096  # deeper folders go unwatched (a path that deep is near PATH_MAX anyway)
_HEADER = struct.Struct("iIII")
_libc: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        if not sys.platform.startswith("linux"):
            raise OSError("inotify is Linux only")
        # The C library python itself is linked with: no `find_library` (it runs `ldconfig -p`, a
        # process of a few ms at every start), which stays the fallback for a static python
        libc = ctypes.CDLL(None, use_errno=True)
        if not hasattr(libc, "inotify_init1"):
            from ctypes import util  # imports shutil and its compression modules: not on every run's way

            libc = ctypes.CDLL(util.find_library("c") or "libc.so.6", use_errno=True)
        _libc = libc
    return _libc


class Inotify:
    def __init__(self, roots: list[Path], on_change: Callable[[list[str]], None]) -> None:
        lib = _lib()
        fd = lib.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_init1: {os.strerror(err)}")
        self.fd = fd
        self.roots = [os.fspath(r) for r in roots]
        self.on_change = on_change
        self.dirs: dict[int, str] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.timer: asyncio.TimerHandle | None = None
        try:
            for root in self.roots:
                self._watch_tree(root, strict=True)
        except BaseException:
            os.close(fd)
            raise

    def _add(self, path: str, strict: bool) -> None:
        wd = _lib().inotify_add_watch(self.fd, os.fsencode(path), MASK)
        if wd < 0:
            err = ctypes.get_errno()
            if strict or err == 28:  # ENOSPC: the user's watch limit; the waiters must poll instead
                raise OSError(err, f"inotify_add_watch {path}: {os.strerror(err)}")
            return  # gone or unreadable meanwhile
        self.dirs[wd] = path

    def _watch_tree(self, top: str, strict: bool = False) -> None:
        from kiro.walk import walk  # not os.walk: it recurses once per level, and a tree can be 1,500 deep

        self._add(top, strict)
        for dirpath, dirnames, _files in walk(top, max_depth=WATCH_MAX_DEPTH):
            for name in dirnames:
                self._add(os.path.join(dirpath, name), False)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        loop.add_reader(self.fd, self._readable)

    def _readable(self) -> None:
        """The first event of a batch: stop listening, read the whole batch a little later."""
        assert self.loop is not None
        self.loop.remove_reader(self.fd)
        self.timer = self.loop.call_later(DEBOUNCE, self._drain)

    def _drain(self) -> None:
        self.timer = None
        changed: list[str] = []
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            except OSError:
                changed.extend(self.roots)
                break
            changed.extend(self._parse(data))
            if len(data) < 16384:
                break
        if self.loop is not None and not self.loop.is_closed() and self.fd >= 0:
            self.loop.add_reader(self.fd, self._readable)
        if changed:
            self.on_change(changed)

    def _parse(self, data: bytes) -> list[str]:
        out: list[str] = []
        at, end = 0, len(data)
        while at + 16 <= end:
            wd, mask, _cookie, length = _HEADER.unpack_from(data, at)
            name = data[at + 16: at + 16 + length].rstrip(b"\0")
            at += 16 + length
            if mask & IN_Q_OVERFLOW:
                out.extend(self.roots)
                continue
            base = self.dirs.get(wd)
            if mask & IN_IGNORED:
                self.dirs.pop(wd, None)
                continue
            if base is None:
                continue
            path = os.path.join(base, os.fsdecode(name)) if name else base
            if mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO):
                with contextlib.suppress(OSError):
                    self._watch_tree(path)
            out.append(path)
        return out

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.fd >= 0:
            if self.loop is not None and not self.loop.is_closed():
                self.loop.remove_reader(self.fd)
            # The kernel waits out a grace period when an inotify with watches is closed (5-20 ms
            # here), which nobody needs to wait for: the close runs on a thread of its own
            threading.Thread(target=os.close, args=(self.fd,), name="kiro-inotify-close", daemon=True).start()
            self.fd = -1
