"""Run a child process for a step: its own process group, output captured and bounded, the whole
group ended on timeout or when the loop must stop now. It dies with kiro (the process's reaper,
`groups.register`) and its group is in the loop's ledger until it ends (see kiro.processes.groups).
Spawned without `preexec_fn` or a wrapper per step, so the interpreter may use vfork."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVarTuple

from kiro.processes import groups
from kiro.processes.sandbox import Box, Network

_Ts = TypeVarTuple("_Ts")

OUTPUT_KEPT = 64_000  # bytes of combined stdout+stderr kept (the tail)
KILL_GRACE_SECONDS = 3.0


@dataclass
class ProcessResult:
    returncode: int | None
    output: str
    duration: float
    timed_out: bool = False
    cancelled: bool = False
    stderr: str = ""  # only with separate_stderr=True; else stderr is in `output`
    idle_timed_out: bool = False  # ended because it printed nothing for `idle_timeout` seconds
    aborted: bool = False  # ended because `on_stdout` said so (an agent CLI reported a fatal error)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.cancelled


_found: dict[tuple[str, str], str] = {}  # (program, PATH) -> where `which` last found it


def _check_program(program: str, cwd: Path, env: Mapping[str, str]) -> None:
    """The errors exec would give (FileNotFoundError, PermissionError), also when setpriv (`confine`)
    would hide them behind its own exit status."""
    if "/" not in program:
        search = env.get("PATH", os.defpath)
        where = _found.get((program, search))
        if where is not None and os.access(where, os.X_OK) and not os.path.isdir(where):
            return  # still there: exec finds it, or one before it in PATH (every step runs `bash`; #12)
        where = groups.which(program, search)
        if where is None:
            raise FileNotFoundError(2, "No such file or directory", program)
        if len(_found) > 64:
            _found.clear()
        _found[(program, search)] = where
        return
    path = Path(program) if os.path.isabs(program) else cwd / program
    if not path.exists():
        raise FileNotFoundError(2, "No such file or directory", program)
    if path.is_dir() or not os.access(path, os.X_OK):
        raise PermissionError(13, "Permission denied", program)


class _PidfdWatcher(asyncio.AbstractChildWatcher):
    """Waits for a child through a pidfd on the event loop that spawned it (Python 3.12's
    PidfdChildWatcher; 3.11's is bound to one loop, so this one, ~20 lines, is kiro's own). A child
    whose pidfd cannot be opened (no file descriptor left) is waited for by a thread, as before."""

    def __init__(self) -> None:
        self._threads = asyncio.ThreadedChildWatcher()

    def add_child_handler(self, pid: int, callback: Callable[[int, int, *_Ts], object],
                          *args: *_Ts) -> None:
        loop = asyncio.get_running_loop()
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            self._threads.add_child_handler(pid, callback, *args)
            return
        try:
            loop.add_reader(pidfd, self._reap, loop, pid, pidfd, callback, args)
        except BaseException:
            os.close(pidfd)
            raise

    @staticmethod
    def _reap(loop: asyncio.AbstractEventLoop, pid: int, pidfd: int, callback: Callable[..., object],
              args: tuple[Any, ...]) -> None:
        loop.remove_reader(pidfd)
        try:
            _, status = os.waitpid(pid, 0)
            returncode = os.waitstatus_to_exitcode(status)
        except ChildProcessError:  # reaped by someone else: its status is lost
            returncode = 255
        finally:
            os.close(pidfd)
        callback(pid, returncode, *args)

    def remove_child_handler(self, pid: int) -> bool:
        return True  # the reader goes when the child ends

    def attach_loop(self, loop: asyncio.AbstractEventLoop | None) -> None:
        pass

    def close(self) -> None:
        pass

    def is_active(self) -> bool:
        return True

    def __enter__(self) -> _PidfdWatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


_watcher_chosen = False


def wait_by_pidfd() -> None:
    """On Python 3.11, asyncio waits for each child on a thread started for it (ThreadedChildWatcher);
    with a pidfd (Linux 5.3+) the event loop waits for it instead, as Python 3.12 does by default: a
    thread less per step process (bench/step_spawn.py). Called before a spawn; acts once per process."""
    global _watcher_chosen
    if _watcher_chosen or sys.version_info >= (3, 12):
        return
    _watcher_chosen = True
    if type(asyncio.get_event_loop_policy()) is not asyncio.DefaultEventLoopPolicy:
        return  # another event loop (uvloop) waits for children its own way
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):  # not Linux, a kernel before 5.3, or a seccomp filter that refuses it
        return
    asyncio.set_child_watcher(_PidfdWatcher())


def kill_group(pid: int, sig: int = signal.SIGTERM) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


@dataclass
class Child:
    """A process started for a step (`spawn`): in its own process group, registered with the reaper and
    the loop's ledger until `release`."""

    proc: asyncio.subprocess.Process
    ledger: groups.Ledger | None
    box: Box | None = None
    link: Network | None = None  # the network namespace its box joined (kiro.processes.sandbox.Network)

    def release(self) -> None:
        """End what is left of its group (a step that exits may leave a background server behind), take
        it off the reaper's list and the ledger, and let its box remove the control folders it made for
        the step (if still empty)."""
        kill_group(self.proc.pid, signal.SIGKILL)
        if self.link is not None:
            self.link.give_back()
        if self.box is not None:
            self.box.release()
        groups.unregister(self.proc.pid)
        if self.ledger is not None:
            self.ledger.discard(self.proc.pid)


def shell_argv(command: str) -> list[str]:
    """The command line of a step's shell command (its ```sh block, the loop's `verify`): bash, stopping at
    the first command that fails (`-e`; SPEC §5: success is exit status 0)."""
    return ["bash", "-e", "-c", command]


async def spawn(argv: Sequence[str], *, cwd: Path, env: Mapping[str, str] | None = None, confine: bool = False,
                box: Box | None = None, stdin: int = asyncio.subprocess.DEVNULL,
                stderr: int = asyncio.subprocess.STDOUT, limit: int = 2**16) -> Child:
    """Start a step's process as `run_process` does (its own session and group, the reaper's mark, the
    ledger's token, the box or `confine`), stdout a pipe; for a caller that talks to it while it runs
    (an ACP agent on stdin and stdout). The caller ends it (`end_process`) and then `release`s it."""
    child_env = dict(os.environ if env is None else env)
    _check_program(argv[0], cwd, child_env)
    ledger = groups.current_ledger.get()
    if ledger is not None:
        child_env[groups.TOKEN_VAR] = ledger.token
    mark = groups.start_reaper()
    if mark is not None:
        child_env[mark[0]] = mark[1]
    wait_by_pidfd()
    # the box's network, connected before its command starts (kiro.processes.sandbox.Network): one the loop keeps
    link = await box.link(ledger.token if ledger is not None else None) if box is not None else None
    command = groups.wrap(list(argv), confine=confine) if box is None else \
        [*box.prefix(cwd, child_env, argv, link=link), *argv]
    try:
        proc = await asyncio.create_subprocess_exec(*command, cwd=str(cwd), env=child_env, stdin=stdin,
                                                    stdout=asyncio.subprocess.PIPE, stderr=stderr,
                                                    start_new_session=True, limit=limit)
    except BaseException:
        if link is not None:
            link.give_back()
        if box is not None:
            box.release()
        raise
    groups.register(proc.pid)
    if ledger is not None:
        ledger.add(proc.pid)
    return Child(proc, ledger, box, link)


class Watchdog:
    """What ends a step's child before it ends by itself: the one watchdog of every kind of child (an agent
    CLI or a step's command in `run_process`, an ACP agent's session in kiro.executors.acp.run_turn).

    - `cancel` set (a signal, `stop --force`) or `stop` finishing (kiro.executors.base.Guard.interruption:
      a stop hook, the task file moved): "cancelled";
    - `idle_timeout` seconds without a word from the child (`heard` says one came; while kiro itself
      holds the child up, `hold`, its silence is kiro's): "idle";
    - `end(why)`: its own output said it cannot go on (a fatal error an agent CLI printed, an ACP agent
      that left its asking mode): `why`;
    - the `timeout`: "timed_out".

    Event-driven: each is a future `watch` waits on at once, the silence a timer re-armed only when it runs
    out; nothing is polled."""

    def __init__(self, *, timeout: float | None = None, cancel: asyncio.Event | None = None,
                 idle_timeout: float | None = None, stop: Callable[[], Awaitable[object]] | None = None) -> None:
        self.timeout = timeout
        self.cancel = cancel
        self.idle_timeout = idle_timeout
        self.stop = stop
        self.last = time.monotonic()  # when the child last said something
        self.held = 0
        self.why: str | None = None  # what `end` said
        self._ended: asyncio.Future[None] | None = None  # while `watch` waits

    def heard(self) -> None:
        self.last = time.monotonic()

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """kiro, not the child, takes its time meanwhile (it decides a permission the child asked for, and a
        guardrail may make it wait): no idle timeout in it, and the silence counts from its end."""
        self.held += 1
        try:
            yield
        finally:
            self.held -= 1
            self.heard()

    def end(self, why: str) -> None:
        """End the child now, for `why` (the first reason given stays)."""
        if self.why is None:
            self.why = why
            if self._ended is not None and not self._ended.done():
                self._ended.set_result(None)

    async def _silence(self) -> None:
        assert self.idle_timeout is not None
        while self.held or (quiet := time.monotonic() - self.last) < self.idle_timeout:
            await asyncio.sleep(self.idle_timeout if self.held else self.idle_timeout - quiet)

    async def watch(self, *work: asyncio.Future[Any]) -> str | None:
        """Wait until one of `work` is done (None) or the child must end (why: see the class). The child is
        not ended here: its caller ends it its own way (an ACP session is cancelled first)."""
        if self.why is not None:
            return self.why
        self._ended = asyncio.get_running_loop().create_future()
        watchers: list[tuple[str | None, asyncio.Future[Any]]] = [(None, self._ended)]
        if self.cancel is not None:
            watchers.append(("cancelled", asyncio.ensure_future(self.cancel.wait())))
        if self.stop is not None:
            watchers.append(("cancelled", asyncio.ensure_future(self.stop())))
        if self.idle_timeout is not None:
            watchers.append(("idle", asyncio.ensure_future(self._silence())))
        try:
            done, _ = await asyncio.wait({*work, *(f for _, f in watchers)}, timeout=self.timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            for _, future in watchers:
                future.cancel()
        if any(w in done for w in work):
            return None
        for why, future in watchers:  # an `end` first: it says most of what happened
            if future in done:
                future.result()  # a `stop` that failed is kiro's bug: raised, not taken for a stop
                return why if why is not None else self.why
        return "timed_out"


async def run_process(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    stdin_data: bytes | None = None,
    timeout: float | None = None,
    cancel: asyncio.Event | None = None,
    output_limit: int = OUTPUT_KEPT,
    confine: bool = False,
    separate_stderr: bool = False,
    idle_timeout: float | None = None,
    on_stdout: Callable[[bytes], bool] | None = None,
    box: Box | None = None,
) -> ProcessResult:
    """`confine`: the command is the agent's choice: no capabilities, no new privileges. `box`: run it
    in bubblewrap (kiro.processes.sandbox), which also drops capabilities and new privileges (as
    setpriv would: `confine` needs nothing more), and dies with the group's leader. What ends it early
    (`cancel`, `timeout`, `idle_timeout`, `on_stdout` saying True: a fatal error) is a `Watchdog`."""
    started = time.monotonic()
    child = await spawn(argv, cwd=cwd, env=env, confine=confine, box=box,
                        stdin=asyncio.subprocess.PIPE if stdin_data is not None else asyncio.subprocess.DEVNULL,
                        stderr=asyncio.subprocess.PIPE if separate_stderr else asyncio.subprocess.STDOUT)
    proc = child.proc
    chunks = bytearray()
    err_chunks = bytearray()
    dog = Watchdog(timeout=timeout, cancel=cancel, idle_timeout=idle_timeout)

    async def pump(stream: asyncio.StreamReader | None, into: bytearray) -> None:
        assert stream is not None
        while True:
            data = await stream.read(65536)
            if not data:
                return
            dog.heard()
            if on_stdout is not None and into is chunks and on_stdout(data):
                dog.end("aborted")
            into.extend(data)
            if len(into) > output_limit * 2:
                del into[: len(into) - output_limit]

    async def feed() -> None:
        if stdin_data is None or proc.stdin is None:
            return
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.write(stdin_data)
            await proc.stdin.drain()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.close()

    pumps = [pump(proc.stdout, chunks)] + ([pump(proc.stderr, err_chunks)] if separate_stderr else [])
    work = asyncio.ensure_future(asyncio.gather(*pumps, feed(), proc.wait()))
    ended: str | None = None
    try:
        ended = await dog.watch(work)
        if ended is not None:
            await end_process(proc)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(work, KILL_GRACE_SECONDS)
    except asyncio.CancelledError:
        await end_process(proc)
        child.release()
        raise
    finally:
        if not work.done():
            work.cancel()
    child.release()
    text = bytes(chunks[-output_limit:]).decode("utf-8", errors="replace")
    err = bytes(err_chunks[-output_limit:]).decode("utf-8", errors="replace")
    return ProcessResult(proc.returncode, text, time.monotonic() - started, timed_out=ended == "timed_out",
                         cancelled=ended == "cancelled", stderr=err, idle_timed_out=ended == "idle",
                         aborted=ended == "aborted")


async def end_process(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM the whole group, then SIGKILL after a grace period."""
    kill_group(proc.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), KILL_GRACE_SECONDS)
    except TimeoutError:
        kill_group(proc.pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), KILL_GRACE_SECONDS)


def tail(text: str, limit: int = 2000) -> str:
    text = text.rstrip()
    return text if len(text) <= limit else "…" + text[-limit:]


def last_line(text: str) -> str:
    """The last non-empty line of some output: usually the error that matters."""
    for raw in reversed(text.splitlines()):
        if raw.strip():
            return raw.strip()[:300]
    return "(no output)"
