"""What a step's processes may do and how long they may live.

Every child kiro starts for a step (a shell step, an agent CLI, verify, run_command, a notifier)
runs in a process group (a session) of its own, started by plain `fork`+`exec` (vfork where the
interpreter can: no `preexec_fn`, no per-step wrapper). Kill-on-death is the job of one small
reaper per kiro process: a `sh` started once, at the first step, that reads "+ <pgid>" / "- <pgid>"
lines from a pipe only kiro holds the write end of (`register` / `unregister`). When kiro ends,
even by `kill -9`, the kernel closes that pipe; the reaper reads end-of-file and SIGKILLs every
group still registered: the command and everything it started in the background (`server &`, a
fork whose parent exited); then every process that still carries this kiro's mark (`KIRO_REAPER`,
set in each child's environment), which covers a child kiro died too early to register and one
that left its group (`setsid`). Cost per step: two short writes to a pipe, instead of a `setpriv
--pdeathsig` + `sh` guard pair per spawn (bench/step_spawn.py prints both).

What leaves the group and clears the mark, or outlives a reaper that was itself killed, is caught
at the next start: each loop keeps a ledger of its live groups, `.state/processes/<task_id>.json`, opened
when a child starts; when the loop starts or resumes it kills every process still carrying that
run's random token in its environment (`KIRO_PROCESS_GROUP`) before a step runs again, so a reused
process id is never killed.

Commands the agent chooses (`run_command`) also run without capabilities (`setpriv
--bounding-set=-all --inh-caps=-all`, as root) and with `--no-new-privs`; together with kiro making
itself non-dumpable (`make_undumpable`) that keeps `/proc/<kiro pid>/environ` and friends unreadable
to them. Without setpriv, kiro still runs steps, but refuses `run_command` when it runs as root, as
it could not drop capabilities.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import json
import os
import signal
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from kiro import jsonl

TOKEN_VAR = "KIRO_PROCESS_GROUP"
LEDGER_TRIM = 64_000  # bytes: an idle ledger past this size is emptied
PR_SET_DUMPABLE = 4
CAP_SETPCAP = 8


def which(program: str, path: str | None = None) -> str | None:
    """`shutil.which(program, path=path)` for a bare program name, without importing shutil (and the
    compression modules it loads) into every run."""
    for folder in (os.environ.get("PATH", os.defpath) if path is None else path).split(os.pathsep):
        # each step's spawn looks `bash` up (kiro.processes.spawn): a plain `folder/name` costs a quarter of
        # os.path.join's work; the one found is joined as shutil.which would
        if os.access(f"{folder or os.curdir}/{program}", os.F_OK | os.X_OK):
            found = os.path.join(folder or os.curdir, program)
            if not os.path.isdir(found):
                return found
    return None


@cache
def setpriv_path() -> str | None:
    return which("setpriv")


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


def wrap(argv: list[str], *, confine: bool = False) -> list[str]:
    """argv as run for a step. With `confine` (a command the agent chose): behind setpriv, with no
    capabilities and no new privileges. Dying with kiro is the reaper's job (`register`), not a
    wrapper's."""
    tool = setpriv_path()
    if not confine or tool is None:
        return argv
    prefix = [tool]
    if _may_drop_bounding_set():
        prefix += ["--inh-caps=-all", "--bounding-set=-all"]
    prefix.append("--no-new-privs")
    return [*prefix, "--", *argv]


# The reaper: one per kiro process. It ignores the terminal's signals (Ctrl-C reaches kiro, which
# ends its steps itself), keeps the set of live groups kiro tells it about, and at end-of-file
# (kiro gone, however it went) SIGKILLs each group left. POSIX sh (dash): no subshell per line.
REAPER = (
    "trap '' INT TERM HUP QUIT; g=' '; m=\"$1=$2\"; "
    "k() { for f in $(grep -lszxF \"$m\" /proc/[0-9]*/environ); do "
    "p=${f#/proc/}; kill -s KILL \"${p%/environ}\"; done; }; "
    "while read -r op pg; do case $op in "
    "+) g=\"$g$pg \";; "
    "-) case $g in *\" $pg \"*) g=\"${g%% $pg *} ${g#* $pg }\";; esac;; "
    "esac; done; "
    "for pg in $g; do kill -s KILL -- \"-$pg\" 2>/dev/null; done; "
    "k; sleep 0.1; k; sleep 0.4; k"
)
# The second pass (`k`): every process still carrying this kiro's mark in its environment
# (`REAPER_VAR`, set on every child). It covers a child kiro died too early to register (between its
# fork and `register`) and one that left its group (`setsid`) without clearing its environment. It is
# made three times, at once and 0.1 s and 0.5 s later: a child that kiro's death caught between its
# fork and its exec lets go of the pipe before its new environment can be read (until exec, its
# /proc/<pid>/environ is kiro's), so the first look can miss it.
REAPER_VAR = "KIRO_REAPER"


class _Reaper:
    """The write end of the pipe to this process's reaper (started on first use, with posix_spawn:
    no Popen object to outlive, nothing to wait for while kiro runs)."""

    def __init__(self) -> None:
        self.fd: int | None = None  # None in a forked child (`forked`): it starts its own
        self.pid: int | None = None
        self.mark = ""  # the value of REAPER_VAR in this kiro's children

    def _start(self) -> int | None:
        if self.pid is not None:  # a previous reaper died: collect it
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(self.pid, os.WNOHANG)
        read_end, write_end = os.pipe()  # both close-on-exec: no step inherits the write end
        devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        mark = f"{os.getpid()}.{os.urandom(8).hex()}"
        try:
            self.pid = os.posix_spawn("/bin/sh", ["/bin/sh", "-c", REAPER, "kiro-reaper", REAPER_VAR, mark],
                                      {"PATH": "/usr/bin:/bin"},
                                      file_actions=[(os.POSIX_SPAWN_DUP2, read_end, 0),
                                                    (os.POSIX_SPAWN_DUP2, devnull, 1),
                                                    (os.POSIX_SPAWN_DUP2, devnull, 2)],
                                      setsid=True)
        except OSError:
            os.close(write_end)
            return None
        finally:
            os.close(read_end)
            os.close(devnull)
        self.fd, self.mark = write_end, mark
        return write_end

    def ready(self) -> int | None:
        return self.fd if self.fd is not None else self._start()

    def forked(self) -> None:
        """In a child forked from this kiro: its parent's reaper is not its own (it starts one at its first step),
        told by the fork itself rather than by a `getpid` at each of the three calls a step makes."""
        self.fd = self.pid = None

    def send(self, line: str) -> None:
        fd = self.ready()
        if fd is None:
            return
        try:
            os.write(fd, line.encode())
        except OSError:  # the reaper is gone (someone killed it): start another for what follows
            with contextlib.suppress(OSError):
                os.close(fd)
            self.fd = None


_reaper = _Reaper()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reaper.forked)


def start_reaper() -> tuple[str, str] | None:
    """Have the reaper running before a child is spawned; returns the (name, value) to put in the
    child's environment, which marks it as this kiro's until `register` names its group."""
    if _reaper.ready() is None:
        return None
    return REAPER_VAR, _reaper.mark


def register(pgid: int) -> None:
    """From now until `unregister`, the group `pgid` is SIGKILLed when kiro ends, however it ends."""
    _reaper.send(f"+ {pgid}\n")


def unregister(pgid: int) -> None:
    _reaper.send(f"- {pgid}\n")


def make_undumpable() -> bool:
    """PR_SET_DUMPABLE 0: without CAP_SYS_PTRACE nobody reads kiro's /proc/<pid>/environ, mem, fds.
    Children kiro execs are dumpable again (execve resets the flag)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return bool(_libc().prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


@cache
def _libc() -> ctypes.CDLL:
    """The C library's handle, opened once: a handle a call (every loop's start) made a new function class
    a call too, ~3.4 KB of cycles each left to the collector (1,000 loops started together, issue #41)."""
    return ctypes.CDLL(None, use_errno=True)


@dataclass(eq=False, repr=False)
class Ledger:
    """The live process groups of one loop, on disk so that a later kiro can end them.

    The file is appended to, a JSON line per change (`{"pgid": N, "token": T}` when a group starts,
    `{"ended": N}` when it ends), through one descriptor kept open for the run: no rename-replace,
    no create or unlink per step. It is emptied when no group is live and it has grown past
    LEDGER_TRIM bytes, and removed by `close` when the run ends. A torn last line (kiro killed
    mid-append) is skipped; the older one-object form `{"groups": [{"pgid": N, "token": T}]}` is
    still read."""

    path: Path
    token: str = field(default_factory=lambda: os.urandom(8).hex())
    groups: dict[int, str] = field(default_factory=dict)  # pgid -> token
    _fd: int | None = field(default=None, repr=False)
    _size: int = field(default=0, repr=False)

    def add(self, pgid: int) -> None:
        self.groups[pgid] = self.token
        self._append(f'{{"pgid": {pgid:d}, "token": {json.dumps(self.token)}}}\n')

    def discard(self, pgid: int) -> None:
        if self.groups.pop(pgid, None) is None:
            return
        if not self.groups and self._size > LEDGER_TRIM and self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
                self._size = 0
                return
        self._append(f'{{"ended": {pgid:d}}}\n')

    def _append(self, record: str) -> None:
        """`record`: one JSON line, written as `json.dumps` would (a line a step: formatted, not encoded)."""
        line = record.encode()
        with contextlib.suppress(OSError):  # a ledger that cannot be written must not fail the step
            if self._fd is None:
                flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
                try:
                    self._fd = os.open(self.path, flags, 0o600)
                except FileNotFoundError:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    self._fd = os.open(self.path, flags, 0o600)
                self._size = os.fstat(self._fd).st_size
            self._size += os.write(self._fd, line)

    def close(self) -> None:
        """The run ends: no file left when no group is live (a live one stays for the next start)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        if not self.groups:
            with contextlib.suppress(OSError):
                self.path.unlink(missing_ok=True)

    def recorded(self) -> list[tuple[int, str]]:
        """The groups the file says are live: (pgid, token)."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, ValueError):
            return []
        live: dict[int, str] = {}
        for entry in jsonl.records(text.splitlines()):  # a torn line is skipped
            for one in entry.get("groups", []) if isinstance(entry.get("groups"), list) else [entry]:
                try:
                    if isinstance(one, dict) and "ended" in one:
                        live.pop(int(one["ended"]), None)
                    else:
                        live[int(one["pgid"])] = str(one["token"])
                except (KeyError, TypeError, ValueError):
                    continue
        return list(live.items())

    def reap(self) -> list[int]:
        """Kill what is left of every group a previous kiro recorded; forget them. Returns the pids
        killed."""
        killed: list[int] = []
        for pgid, token in self.recorded():
            killed += kill_leftovers(pgid, token)
        self.groups.clear()
        killed = sorted(set(killed))
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
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
