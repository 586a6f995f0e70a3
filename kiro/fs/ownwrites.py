"""kiro's own writes do not wake its watcher (kiro.core.watch).

With a thousand loops in one process, every box kiro checks would otherwise wake every waiting loop
and the watch supervisor (a rescan of Specs/). A writer notes the file it wrote (`note_own_write`)
or removed (`note_own_removal`); a change the watcher reports is ignored while the file is still
exactly what kiro left there (same inode, mtime and size, or still absent), so a person's change
after kiro's wakes as before. kiro's temp files (`*.kiro.tmp`, renamed over their target at once)
never wake anyone. Standard library only: kiro.fs.atomic notes every write it makes.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

KEPT = 16384
TEMP_SUFFIX = ".kiro.tmp"  # kiro.fs.atomic.TEMP_SUFFIX
_ABSENT = (-1, -1, -1)
_own: dict[str, tuple[int, int, int]] = {}


def _signature(path: str) -> tuple[int, int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return _ABSENT
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _remember(path: str, sig: tuple[int, int, int]) -> None:
    _own.pop(path, None)
    _own[path] = sig
    if len(_own) > KEPT:
        with contextlib.suppress(StopIteration, KeyError, RuntimeError):
            del _own[next(iter(_own))]


def note_own_write(path: Path | str, st: os.stat_result | None = None) -> None:
    """kiro (this process) just wrote `path`; `st`: its `os.stat` taken right after, if the
    writer has one."""
    p = os.path.abspath(path)
    _remember(p, _signature(p) if st is None else (st.st_ino, st.st_mtime_ns, st.st_size))


def note_own_removal(path: Path | str) -> None:
    """kiro (this process) just removed `path`, or moved it away."""
    _remember(os.path.abspath(path), _ABSENT)


def is_own_change(path: str) -> bool:
    """True when the change the watcher saw at `path` is kiro's own and nobody's since."""
    if path.endswith(TEMP_SUFFIX):
        return True
    sig = _own.get(path)
    return sig is not None and _signature(path) == sig
