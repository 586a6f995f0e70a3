"""When kiro's own output cannot be written: its reader went away (`kiro ... | head -1`), or it goes to a
full disk (`kiro loop status > out.txt` on a full file system, `> /dev/full`).

What is still to be written then, now or at exit, goes to /dev/null (`to_devnull`), so that it does not
fail again, and the interpreter's final flush does not print a second error (Python docs, "Note on
SIGPIPE")."""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any, NoReturn

_DEV_FULL = (1, 7)  # Linux's /dev/full: every write fails with ENOSPC
_FULL = {28, 27, 122}  # ENOSPC, EFBIG, EDQUOT


def to_devnull(stream: Any) -> None:
    """Point `stream`'s file descriptor at /dev/null."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, stream.fileno())
        finally:
            os.close(devnull)


def closed_pipe() -> NoReturn:
    """The reader of our output went away (`| head -1`): it had what it wanted; end quietly, exit 0."""
    to_devnull(sys.stdout)
    sys.exit(0)


def stdout_full(exc: BaseException) -> bool:
    """Whether `exc` is a write that failed because standard output goes to a full disk: bad input, said in
    one line (`stdout_failed`), not a bug. Told by the error (no space, file too large, quota) and where file
    descriptor 1 goes: /dev/full, or a file on a file system with no block left."""
    if not isinstance(exc, OSError) or exc.errno not in _FULL:
        return False
    try:
        st = os.fstat(1)
        if stat.S_ISCHR(st.st_mode):
            return (os.major(st.st_rdev), os.minor(st.st_rdev)) == _DEV_FULL
        return stat.S_ISREG(st.st_mode) and (exc.errno != 28 or os.fstatvfs(1).f_bavail == 0)
    except OSError:
        return False


def stdout_failed(exc: OSError) -> int:
    """A command that could not write its output: one line on stderr, the rest to /dev/null; exit code 1."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"kiro: cannot write to standard output: {exc.strerror or exc}\n")
        sys.stderr.flush()
    to_devnull(sys.stdout)
    return 1


def cannot_write(stream: Any, exc: OSError) -> None:
    """A loop in the foreground could not write to `stream`: it goes on without it. A failure other than a
    closed pipe is said once on the other stream, if it can be."""
    if not isinstance(exc, BrokenPipeError):
        other = sys.stderr if stream is sys.stdout else sys.stdout
        with contextlib.suppress(OSError, ValueError):
            other.write(f"kiro: warning: cannot write to standard {'output' if stream is sys.stdout else 'error'} "
                        f"({exc.strerror or exc}); going on without it\n")
            other.flush()
    to_devnull(stream)
