"""Read a file (or list a folder) again only when it changed: what was read from each path, kept beside the
path's stat key then, and given back while a stat of the path finds the same key (issue #41: a loop looks at
its task files, prompts and folders at every step; with many loops, reading them all again was most of their
time).

The rule, written once here, is git's "racily clean" one: a write in the same tick of the kernel's clock as the
read may leave every time of the file as it was, so a key alone cannot tell them apart. The key is the file's
identity, size and both times (dev, ino, size, mtime_ns, ctime_ns: a process can put the mtime back, never the
ctime), and what is read of a path whose last change (its ctime) is younger than RACY_NS is not kept: it is read
again at every look until it has been left alone that long.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

RACY_NS = 2_000_000_000  # a path changed this recently is read again at every look (the rule's window)

Key = tuple[int, int, int, int, int]


def stat_key(st: os.stat_result) -> Key:
    """What must be unchanged for a path's kept read to stand: its identity, size and both times."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def settled(st: os.stat_result) -> bool:
    """The path's last change is older than the rule's window: a read of it now may be kept."""
    return time.time_ns() - st.st_ctime_ns > RACY_NS


def _always(_value: object) -> bool:
    return True


class StatCache(Generic[T]):
    """What was read from each path (a file's content, a folder's listing, something parsed from them), by
    path, kept while a stat of the path gives the same key (`stat_key`) and once the path is `settled`.
    At most `most` paths are kept (then it starts again)."""

    def __init__(self, most: int) -> None:
        self.most = most
        self._kept: dict[str, tuple[Key, T]] = {}

    def read(self, path: str, st: os.stat_result, reader: Callable[[], T],
             keep: Callable[[T], bool] = _always) -> T:
        """What `reader()` gives for `path` (stat'ed as `st` just before): the value kept from an earlier call
        while the key is unchanged, else `reader()` now, kept for the next call when the path is settled and
        `keep(value)` (False: a value too big to hold, or a failed read)."""
        key = stat_key(st)
        kept = self._kept.get(path)
        if kept is not None and kept[0] == key:
            return kept[1]
        value = reader()
        if settled(st) and keep(value):
            if len(self._kept) >= self.most:
                self._kept.clear()
            self._kept[path] = (key, value)
        else:
            self._kept.pop(path, None)
        return value

    def clear(self) -> None:
        self._kept.clear()


_names: StatCache[frozenset[str] | None] = StatCache(most=1024)  # the folders' listings (`names`)


def _listdir(folder: str) -> frozenset[str] | None:
    try:
        return frozenset(os.listdir(folder))
    except OSError:
        return None


def names(folder: str) -> frozenset[str] | None:
    """The names of the entries in `folder`, listed again only when it changed (the rule above): a stat of the
    folder while nothing was added to it, removed from it or renamed in or out. Empty when there is no folder
    there; None when it cannot be listed (ask of each path what is asked)."""
    try:
        st = os.stat(folder)
    except (FileNotFoundError, NotADirectoryError):
        return frozenset()  # no folder there: nothing in it
    except (OSError, ValueError):
        return None
    return _names.read(folder, st, lambda: _listdir(folder), keep=lambda listing: listing is not None)


def first_present(folder: str, candidates: tuple[str, ...]) -> str | None:
    """The path of the first of `candidates` in `folder` that `os.path.exists` (a link counts by its target), or
    None. The same answer as asking `os.path.exists` of each, for one stat of the folder while nothing in it
    changed (`names`): a name the folder does not hold is not asked of the kernel, one it holds is, each time (a
    link whose target appears later counts then). A loop asks for its stop hooks at every safe point: two stats
    each time were ~6 a model call (issue #41)."""
    held = names(folder)
    for name in candidates:
        if held is not None and name not in held:
            continue
        path = os.path.join(folder, name)
        if os.path.exists(path):
            return path
    return None
