"""Run a child process for a step: its own process group, output captured and bounded, the whole
group ended on timeout or when the loop must stop now. It dies with kiro (the process's reaper,
`groups.register`) and its group is in the loop's ledger until it ends (see kiro.processes.groups).
Spawned without `preexec_fn` or a wrapper per step, so the interpreter may use vfork."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import IO, Any

from kiro.processes import groups
from kiro.processes.sandbox import Box, Network

OUTPUT_KEPT = 64_000  # bytes of combined stdout+stderr kept (the tail)
KILL_GRACE_SECONDS = 3.0


@dataclass(eq=False)
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


def _check_program(program: str, cwd: Path, env: Mapping[str, str]) -> str | None:
    """The errors exec would give (FileNotFoundError, PermissionError), also when setpriv (`confine`)
    would hide them behind its own exit status. Returns where a bare program name is in the child's PATH
    now (absolute), for exec to run it without searching PATH again (a failed execve in the child for each
    folder before it, and `Popen` joining every folder to the name); None for a path. Looked up at each
    spawn, not remembered: a program put in an earlier PATH folder during a run is the one that runs."""
    if "/" not in program:
        where = groups.which(program, env.get("PATH", os.defpath))
        if where is None:
            raise FileNotFoundError(2, "No such file or directory", program)
        return where if os.path.isabs(where) else None  # a relative folder: exec searches from the step's folder
    path = Path(program) if os.path.isabs(program) else cwd / program
    if not path.exists():
        raise FileNotFoundError(2, "No such file or directory", program)
    if path.is_dir() or not os.access(path, os.X_OK):
        raise PermissionError(13, "Permission denied", program)
    return None


class Process:
    """A step's child as kiro holds it: its `Popen` (spawned by vfork: no `preexec_fn`), its exit status
    (`wait`), reaped on the event loop through a pidfd (Linux 5.3+; no thread per child), and its pipes:
    asyncio streams (`stdin`, `stdout`, `stderr`) when a caller talks to it (`spawn`), the bare pipes read by
    the event loop's reader when `run_process` only collects its output (no transport or protocol per step)."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.stdin: asyncio.StreamWriter | None = None
        self.stdout: asyncio.StreamReader | None = None
        self.stderr: asyncio.StreamReader | None = None
        loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[int] = loop.create_future()
        self.on_exit: list[Callable[[], None]] = []  # called as it is reaped (not a loop turn later)
        try:
            pidfd = os.pidfd_open(popen.pid)
        except (AttributeError, OSError):  # no file descriptor left (or no pidfd): a thread waits for it
            threading.Thread(target=self._wait_thread, args=(loop,), name=f"waitpid-{popen.pid}", daemon=True).start()
            return
        try:
            loop.add_reader(pidfd, self._reap, loop, pidfd)
        except BaseException:
            os.close(pidfd)
            raise

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def _status(self) -> int:
        try:
            _, status = os.waitpid(self.pid, 0)
            return os.waitstatus_to_exitcode(status)
        except ChildProcessError:  # reaped by someone else: its status is lost
            return 255

    def _exit(self, returncode: int) -> None:
        self.popen.returncode = returncode
        if not self._exited.done():
            self._exited.set_result(returncode)
            for call in self.on_exit:
                call()

    def _reap(self, loop: asyncio.AbstractEventLoop, pidfd: int) -> None:
        loop.remove_reader(pidfd)
        try:
            returncode = self._status()
        finally:
            os.close(pidfd)
        self._exit(returncode)

    def _wait_thread(self, loop: asyncio.AbstractEventLoop) -> None:
        returncode = self._status()
        with contextlib.suppress(RuntimeError):  # the event loop closed meanwhile
            loop.call_soon_threadsafe(self._exit, returncode)

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    async def open_streams(self, limit: int) -> None:
        """Its pipes as asyncio streams, for a caller that talks to it while it runs."""
        loop = asyncio.get_running_loop()
        popen = self.popen
        if popen.stdin is not None:
            transport, protocol = await loop.connect_write_pipe(lambda: _Writing(loop), popen.stdin)
            self.stdin = asyncio.StreamWriter(transport, protocol, None, loop)
        self.stdout = await self._reader(popen.stdout, limit)
        self.stderr = await self._reader(popen.stderr, limit)

    @staticmethod
    async def _reader(pipe: IO[bytes] | None, limit: int) -> asyncio.StreamReader | None:
        if pipe is None:
            return None
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=limit, loop=loop)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop), pipe)
        return reader


class _Writing(asyncio.streams.FlowControlMixin, asyncio.Protocol):
    """The protocol of a child's stdin as a StreamWriter: `drain` waits while the pipe is full, `wait_closed`
    until the pipe is closed (as asyncio's subprocess protocol does for its stdin)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop=loop)
        self._closed: asyncio.Future[None] = loop.create_future()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if not self._closed.done():
            self._closed.set_result(None)

    def _get_close_waiter(self, stream: asyncio.StreamWriter) -> asyncio.Future[None]:
        return self._closed


def kill_group(pid: int, sig: int = signal.SIGTERM) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


@dataclass(eq=False, repr=False)
class Child:
    """A process started for a step (`spawn`): in its own process group, registered with the reaper and
    the loop's ledger until `release`."""

    proc: Process
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
                box: Box | None = None, stdin: int = subprocess.DEVNULL, stderr: int = subprocess.STDOUT,
                limit: int = 2**16) -> Child:
    """Start a step's process as `run_process` does, its pipes as asyncio streams (`Process.open_streams`,
    stdout a pipe); for a caller that talks to it while it runs (an ACP agent on stdin and stdout). The
    caller ends it (`end_process`) and then `release`s it."""
    child = await _start(argv, cwd=cwd, env=env, confine=confine, box=box, stdin=stdin, stderr=stderr)
    try:
        await child.proc.open_streams(limit)
    except BaseException:
        kill_group(child.proc.pid, signal.SIGKILL)
        child.release()
        raise
    return child


async def _start(argv: Sequence[str], *, cwd: Path, env: Mapping[str, str] | None, confine: bool, box: Box | None,
                 stdin: int, stderr: int) -> Child:
    """The one way a step's process starts: its own session and group, the reaper's mark, the ledger's
    token, the box or `confine`; stdout a pipe."""
    child_env = dict(os.environ if env is None else env)
    where = _check_program(argv[0], cwd, child_env)
    ledger = groups.current_ledger.get()
    if ledger is not None:
        child_env[groups.TOKEN_VAR] = ledger.token
    mark = groups.start_reaper()
    if mark is not None:
        child_env[mark[0]] = mark[1]
    # the box's network, connected before its command starts (kiro.processes.sandbox.Network): one the loop keeps
    link = await box.link(ledger.token if ledger is not None else None) if box is not None else None
    command = groups.wrap(list(argv), confine=confine) if box is None else \
        [*box.prefix(cwd, child_env, argv, link=link), *argv]
    try:
        # unbuffered (bufsize=0): kiro reads and writes the pipes' descriptors (`run_process`) or hands them to
        # asyncio (`open_streams`), so no buffered file object is made over them (its isatty and seek calls)
        popen = subprocess.Popen(command, executable=where if command[0] == argv[0] else None, cwd=str(cwd),
                                 env=child_env, stdin=_devnull() if stdin == subprocess.DEVNULL else stdin,
                                 stdout=subprocess.PIPE, stderr=stderr, start_new_session=True, bufsize=0)
        try:
            proc = Process(popen)
        except BaseException:  # not watched (the event loop is closing): it goes at once
            with popen:  # its pipes closed, then waited for
                kill_group(popen.pid, signal.SIGKILL)
            raise
    except BaseException:
        if link is not None:
            link.give_back()
        if box is not None:
            box.release()
        raise
    groups.register(popen.pid)
    if ledger is not None:
        ledger.add(popen.pid)
    return Child(proc, ledger, box, link)


@cache
def _devnull() -> int:
    """/dev/null, opened once a process for the stdin of every child that reads none: `Popen` opens and closes it
    at each spawn (`subprocess.DEVNULL`). Close-on-exec: a child has it as its stdin only."""
    return os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)


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

    def wake(self) -> None:
        """`watch` looks again now (what it waits for may be done), not a loop turn later."""
        if self._ended is not None and not self._ended.done():
            self._ended.set_result(None)

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
        not ended here: its caller ends it its own way (an ACP session is cancelled first). One future wakes
        it, set by whichever comes first (no `asyncio.wait`: its sets, callbacks and coroutines a step)."""
        if self.why is not None:
            return self.why
        loop = asyncio.get_running_loop()
        self._ended = wake = loop.create_future()

        def rouse(_: object = None) -> None:
            if not wake.done():
                wake.set_result(None)

        watchers: list[asyncio.Future[Any]] = []
        if self.cancel is not None:
            watchers.append(asyncio.ensure_future(self.cancel.wait()))
        if self.stop is not None:
            watchers.append(asyncio.ensure_future(self.stop()))
        idle = asyncio.ensure_future(self._silence()) if self.idle_timeout is not None else None
        timer = loop.call_later(self.timeout, rouse) if self.timeout is not None else None
        for future in (*work, *watchers, *([idle] if idle is not None else [])):
            future.add_done_callback(rouse)
        try:
            await wake
        finally:
            if timer is not None:
                timer.cancel()
            for future in work:
                future.remove_done_callback(rouse)
            for future in (*watchers, *([idle] if idle is not None else [])):
                future.cancel()
        if any(w.done() for w in work):
            return None
        if self.why is not None:  # an `end` first: it says most of what happened
            return self.why
        for future in watchers:
            if future.done():
                future.result()  # a `stop` that failed is kiro's bug: raised, not taken for a stop
                return "cancelled"
        if idle is not None and idle.done():
            return "idle"
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
    child = await _start(argv, cwd=cwd, env=env, confine=confine, box=box,
                         stdin=subprocess.PIPE if stdin_data is not None else subprocess.DEVNULL,
                         stderr=subprocess.PIPE if separate_stderr else subprocess.STDOUT)
    proc = child.proc
    popen = proc.popen
    loop = asyncio.get_running_loop()
    chunks = bytearray()
    err_chunks = bytearray()
    dog = Watchdog(timeout=timeout, cancel=cancel, idle_timeout=idle_timeout)
    # done when every pipe has reached its end, stdin_data is written and the child has exited
    work: asyncio.Future[None] = loop.create_future()
    pending = 0

    def one_done(error: BaseException | None = None) -> None:
        nonlocal pending
        pending -= 1
        if work.done():
            return
        if error is not None:
            work.set_exception(error)
        elif not pending:
            work.set_result(None)
        if work.done():
            dog.wake()

    def pump(fd: int, into: bytearray) -> None:
        def readable() -> None:
            try:
                data = os.read(fd, 65536)
                if not data:
                    loop.remove_reader(fd)
                    one_done()
                    return
                dog.heard()
                if on_stdout is not None and into is chunks and on_stdout(data):
                    dog.end("aborted")
            except (BlockingIOError, InterruptedError):
                return
            except Exception as exc:  # kiro's bug (in `on_stdout`): raised by `run_process`
                loop.remove_reader(fd)
                one_done(exc)
                return
            into.extend(data)
            if len(into) > output_limit * 2:
                del into[: len(into) - output_limit]

        os.set_blocking(fd, False)
        loop.add_reader(fd, readable)

    def feed(fd: int, data: memoryview) -> None:
        def writable() -> None:
            nonlocal data
            try:
                while data:
                    data = data[os.write(fd, data):]
            except (BlockingIOError, InterruptedError):
                loop.add_writer(fd, writable)  # a pipe full: on when it has room again
                return
            except (BrokenPipeError, ConnectionResetError):  # it did not read it all
                pass
            loop.remove_writer(fd)
            assert popen.stdin is not None
            popen.stdin.close()
            one_done()

        os.set_blocking(fd, False)
        writable()

    pipes = [(popen.stdout, chunks), (popen.stderr, err_chunks)]
    pending = sum(pipe is not None for pipe, _ in pipes) + (popen.stdin is not None) + 1
    proc.on_exit.append(one_done)
    ended: str | None = None
    try:
        for pipe, into in pipes:
            if pipe is not None:
                pump(pipe.fileno(), into)
        if popen.stdin is not None and stdin_data is not None:
            feed(popen.stdin.fileno(), memoryview(stdin_data))
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
        for pipe in (popen.stdin, popen.stdout, popen.stderr):
            if pipe is not None and not pipe.closed:
                loop.remove_reader(pipe.fileno())
                loop.remove_writer(pipe.fileno())
                pipe.close()
    child.release()
    if ended is None and work.exception() is not None:
        raise work.exception()  # type: ignore[misc]
    text = bytes(chunks[-output_limit:]).decode("utf-8", errors="replace")
    err = bytes(err_chunks[-output_limit:]).decode("utf-8", errors="replace")
    return ProcessResult(proc.returncode, text, time.monotonic() - started, timed_out=ended == "timed_out",
                         cancelled=ended == "cancelled", stderr=err, idle_timed_out=ended == "idle",
                         aborted=ended == "aborted")


async def end_process(proc: Process) -> None:
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
