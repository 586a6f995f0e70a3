"""What a step's processes may do and how long they may live.

Every child kiro starts for a step (a shell step, an agent CLI, verify, run_command, a notifier)
runs in a process group of its own under a small `sh` guard started by `setpriv --pdeathsig USR2`
(util-linux), without a `preexec_fn` (unsafe in a threaded process, and it forces fork over vfork).
When kiro dies, even by `kill -9`, the kernel sends the guard SIGUSR2 and the guard SIGKILLs its
whole process group: the command and everything it started in the background (`server &`, a
fork whose parent exited). The guard passes stdin, the exit status and SIGTERM through unchanged.

What leaves the group (`setsid`) or a guard that could not act is caught at the next start: each
loop keeps a ledger of its live groups, `.state/processes/<task_id>.json`, written when a child
starts; when the loop starts or resumes it kills every process still carrying that run's random
token in its environment (`KIRO_PROCESS_GROUP`) before a step runs again, so a reused process id
is never killed.

Commands the agent chooses (`run_command`) also run without capabilities (`--bounding-set=-all
--inh-caps=-all`, as root) and with `--no-new-privs`; together with kiro making itself
non-dumpable (`make_undumpable`) that keeps `/proc/<kiro pid>/environ` and friends unreadable to
them. Without setpriv, kiro still runs steps (orphans are then killed at the next start only),
but refuses `run_command` when it runs as root, as it could not drop capabilities.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import json
import os
import secrets
import shutil
import signal
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

TOKEN_VAR = "KIRO_PROCESS_GROUP"
PR_SET_DUMPABLE = 4
CAP_SETPCAP = 8


@cache
def setpriv_path() -> str | None:
    return shutil.which("setpriv")


@cache
def _may_drop_bounding_set() -> bool:
    """Whether this process holds CAP_SETPCAP (root does), which dropping the bounding set needs."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) & (1 << CAP_SETPCAP))
    except (OSError, ValueError):
        pass
    return False


def has_capabilities() -> bool:
    """True when kiro's children would inherit privileges worth dropping (kiro runs as root)."""
    return os.geteuid() == 0 or _may_drop_bounding_set()


def confinement_available() -> bool:
    """Whether `wrap(..., confine=True)` really confines: setpriv present, or nothing to drop."""
    return setpriv_path() is not None or not has_capabilities()


# The guard: stdin kept for the command (an `&` job would get /dev/null), SIGUSR2 (kiro died) kills
# the group, SIGTERM/SIGINT/SIGHUP reach the command (same group) while the guard waits on, and
# the command's exit status becomes the guard's.
GUARD = ('exec 3<&0; trap "kill -KILL 0" USR2; trap : TERM INT HUP; "$@" <&3 3<&- & pid=$!; exec 3<&-; '
         'while :; do wait "$pid"; rc=$?; kill -0 "$pid" 2>/dev/null || break; done; exit "$rc"')


def wrap(argv: list[str], *, confine: bool = False) -> list[str]:
    """argv behind setpriv and the guard: dies with kiro, its group too; with `confine`, no
    capabilities and no new privileges."""
    tool = setpriv_path()
    if tool is None:
        return argv
    prefix = [tool, "--pdeathsig", "USR2"]
    if confine:
        if _may_drop_bounding_set():
            prefix += ["--inh-caps=-all", "--bounding-set=-all"]
        prefix.append("--no-new-privs")
    return [*prefix, "--", "/bin/sh", "-c", GUARD, "kiro-step", *argv]


def make_undumpable() -> bool:
    """PR_SET_DUMPABLE 0: without CAP_SYS_PTRACE nobody reads kiro's /proc/<pid>/environ, mem, fds.
    Children kiro execs are dumpable again (execve resets the flag)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return bool(ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


@dataclass
class Ledger:
    """The live process groups of one loop, on disk so that a later kiro can end them."""

    path: Path
    token: str = field(default_factory=lambda: secrets.token_hex(8))
    groups: dict[int, str] = field(default_factory=dict)  # pgid -> token

    def add(self, pgid: int) -> None:
        self.groups[pgid] = self.token
        self._write()

    def discard(self, pgid: int) -> None:
        if self.groups.pop(pgid, None) is not None:
            self._write()

    def _write(self) -> None:
        from kiro.fsutil import atomic_write

        data = json.dumps({"groups": [{"pgid": g, "token": t} for g, t in self.groups.items()]})
        with contextlib.suppress(OSError):  # a ledger that cannot be written must not fail the step
            if self.groups:
                atomic_write(self.path, data, fsync=False)
            else:
                self.path.unlink(missing_ok=True)

    def reap(self) -> list[int]:
        """Kill what is left of every group a previous kiro recorded; forget them. Returns the pids
        killed."""
        try:
            recorded = json.loads(self.path.read_text(encoding="utf-8")).get("groups", [])
        except (OSError, ValueError, AttributeError):
            recorded = []
        killed: list[int] = []
        for entry in recorded if isinstance(recorded, list) else []:
            try:
                pgid, token = int(entry["pgid"]), str(entry["token"])
            except (KeyError, TypeError, ValueError):
                continue
            killed += kill_leftovers(pgid, token)
        self.groups.clear()
        killed = sorted(set(killed))
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        return killed


def _members(pgid: int, token: str) -> list[int]:
    """Processes whose environment carries `token`: the group's members and any that left it
    (`setsid`). The token is random per run, so nothing else carries it."""
    needle = f"{TOKEN_VAR}={token}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        pid = int(entry.name)
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                env = fh.read()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            found.append(pid)
    return found


def kill_leftovers(pgid: int, token: str) -> list[int]:
    """SIGKILL what is left of a recorded group, and whatever of it left the group (it carries the
    run's token). `pgid` is kept for the record; the token decides."""
    pids = _members(pgid, token)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return pids


# The ledger of the loop whose task is running: set by the engine, read by `run_process`.
current_ledger: contextvars.ContextVar[Ledger | None] = contextvars.ContextVar("kiro_ledger", default=None)
