"""`python -m kiro` without a cold interpreter: a fork server imports kiro once, then forks a child per
command line that runs exactly what `python -m kiro` runs, in its own process.

A cold `python -m kiro` costs 0.5-1 s of interpreter start and imports (3-7 s on a loaded machine); a
fork costs milliseconds. The child is a process of its own, as a real `kiro` is: its own pid, cwd,
environment, signal handlers, threads and module state (it starts from the server's, which ran no
kiro code: it only imported modules, and holds one thread). What it does:

- its stdin, stdout and stderr are the caller's own file descriptors, passed over a Unix socket
  (SCM_RIGHTS): pipes for `run` as `subprocess.run(capture_output=True, input=...)` gives them, a
  file for `popen`;
- it chdirs to the caller's cwd, takes the caller's environment whole, puts the cwd first on
  sys.path and runs `kiro/__main__.py` as `__main__` (`runpy`, as `-m` does), then ends as an
  interpreter ends (threads joined, atexit handlers run, output flushed, the exit code of a
  SystemExit or 1 after a traceback) but without tearing down its modules;
- the caller waits for it, signals it (its pid is the kiro process: no wrapper between), and kills
  only it on a timeout, as subprocess does.

One server per test process (per xdist worker) runs any number of children at once: each job brings
a socket of its own on which the server answers the child's pid, then its exit code (it waits for
its children through pidfds).

What a fork cannot change is what the interpreter read at its start: the `PYTHON*` and locale
variables, and the few a module reads on import (rich/typer's colour and width, TMPDIR). The server
takes the environment of its first command line; a command line whose values of those differ
(`import_key`) runs as a cold `python -m kiro`.

The server preloads every kiro module but the Temporal backend (`temporalio` keeps native threads; a
command that imports it ends through `os._exit`, kiro.cli._exit_now) and checks it still has one
thread before its first fork.

Client: `run(...)` as subprocess.run, `ForkedProcess(...)` as a subprocess.Popen.
"""

from __future__ import annotations

import atexit
import json
import locale
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
_MAX_MESSAGE = 64 * 1024  # a longer job (a megabyte-long argument or variable) goes through a file

# what a running interpreter read at its start or on importing the preloaded modules
_IMPORT_PREFIXES = ("PYTHON", "LC_", "COV_CORE_")
_IMPORT_NAMES = frozenset({
    "LANG", "LANGUAGE", "TMPDIR", "TEMP", "TMP",
    "TYPER_USE_RICH", "TERMINAL_WIDTH", "_TYPER_FORCE_DISABLE_TERMINAL", "GITHUB_ACTIONS", "FORCE_COLOR",
    "PY_COLORS", "OPENAI_LOG",
})


def import_key(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith(_IMPORT_PREFIXES) or k in _IMPORT_NAMES))


# -- the server -------------------------------------------------------------------------------------


def _preload() -> None:
    import gc
    import importlib
    import pkgutil

    import kiro

    for info in pkgutil.walk_packages(kiro.__path__, "kiro."):
        if info.name == "kiro.__main__" or info.name.startswith("kiro.temporal"):
            continue
        importlib.import_module(info.name)
    _warm()
    assert "temporalio" not in sys.modules, "a preloaded module imported temporalio"
    tasks = os.listdir("/proc/self/task")
    assert len(tasks) == 1, f"the fork server has {len(tasks)} threads after its imports"
    gc.collect()
    gc.freeze()  # the collector leaves the preloaded objects alone: a child copies fewer pages


# modules kiro imports only when a command runs (a loop start, a config read), not on import
_RUN_IMPORTS = ("yaml", "anyio._backends._asyncio", "anyio.streams.memory", "anyio.streams.stapled",
                "typer._adapters", "typer._click.decorators", "encodings.utf_8_sig", "importlib.resources.readers")


def _warm() -> None:
    """Do once here what each child would otherwise do again on its first use, none of it kiro's doing:
    build kiro's pydantic models' validators (`defer_build`: built on first use, so that a read command
    builds only the few it needs), import the modules a command imports when it runs and load Apprise's
    plugins. A forked one-step `loop start` spent ~0.9 of its 2.3 s on the first two (cProfile, load 9),
    one with a `notify:` URL ~0.8 s of CPU more on Apprise."""
    import importlib

    from pydantic import BaseModel

    for name in _RUN_IMPORTS:
        try:
            importlib.import_module(name)
        except ImportError:  # another version of a dependency: the child imports what it needs itself
            pass
    import apprise  # a config with `notify:` checks its URLs through Apprise, whose plugins load on first use

    apprise.Apprise.instantiate("json://localhost/", suppress_exceptions=True)
    todo = list(BaseModel.__subclasses__())
    while todo:
        model = todo.pop()
        todo.extend(model.__subclasses__())
        if model.__module__.startswith("kiro.") and not model.__pydantic_complete__:
            model.model_rebuild(raise_errors=False)


def _answer(reply: socket.socket, message: dict[str, Any]) -> None:
    try:
        reply.send(json.dumps(message).encode())
    except OSError:  # the caller is gone (it was interrupted): nobody to tell
        pass


def serve(fd: int) -> None:
    """Take jobs on the socket `fd` until it closes; fork a child for each; answer each on the job's own
    socket with the child's pid, and its exit code when it ends."""
    _preload()
    jobs = socket.socket(fileno=fd)
    running: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> pid, the job's socket
    with selectors.DefaultSelector() as sel:
        sel.register(jobs, selectors.EVENT_READ)
        while True:
            for key, _ in sel.select():
                if key.fileobj is jobs:
                    msg, fds, _, _ = socket.recv_fds(jobs, _MAX_MESSAGE, 4)
                    if not msg:
                        return  # the test process ended; children still running are reparented
                    job = json.loads(msg)
                    if "file" in job:
                        with open(job["file"], "rb") as fh:
                            job = json.load(fh)
                    *std, reply_fd = fds
                    sys.stdout.flush()
                    sys.stderr.flush()
                    pid = os.fork()
                    if pid == 0:
                        _child(job, std)  # never returns
                    for passed in std:
                        os.close(passed)
                    reply = socket.socket(fileno=reply_fd)
                    pidfd = os.pidfd_open(pid)
                    running[pidfd] = (pid, reply)
                    sel.register(pidfd, selectors.EVENT_READ)
                    _answer(reply, {"pid": pid})
                else:
                    pidfd = key.fd
                    sel.unregister(pidfd)
                    pid, reply = running.pop(pidfd)
                    os.close(pidfd)
                    _, status = os.waitpid(pid, 0)
                    _answer(reply, {"code": os.waitstatus_to_exitcode(status)})
                    reply.close()


def _child(job: dict[str, Any], fds: list[int]) -> None:
    for target, passed in enumerate(fds):
        os.dup2(passed, target)
    os.closerange(3, 1 << 16)  # the server's sockets and pidfds, the other jobs': only 0-2 are open, as in
    # a process subprocess started (close_fds)
    if job.get("session"):
        os.setsid()
    os.chdir(job["cwd"])
    os.environ.clear()
    os.environ.update(job["env"])
    time.tzset()  # the local time zone is the caller's TZ, as a new interpreter reads it at its start
    sys.path[0] = job["cwd"]  # `-m` puts the working directory first
    sys.argv = ["-m", *job["args"]]  # runpy makes argv[0] kiro/__main__.py's path, as `-m` does
    import runpy

    try:
        runpy.run_module("kiro", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException as exc:  # noqa: BLE001 - what the interpreter does with an uncaught exception
        sys.excepthook(type(exc), exc, exc.__traceback__)
        code = -signal.SIGINT if isinstance(exc, KeyboardInterrupt) else 1
    _finalize(code)


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _finalize(code: int) -> None:
    """End as the interpreter ends (Py_FinalizeEx): wait for the threads, run the atexit handlers, flush
    stdout and stderr; then leave without tearing down the ~1,000 preloaded modules, which would copy
    most of the server's memory (seconds on a loaded machine) for nothing anyone sees."""
    import atexit as atexit_
    import threading as threading_

    threading_._shutdown()  # type: ignore[attr-defined]
    atexit_._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception as exc:  # noqa: BLE001 - reported as the interpreter reports it
            if stream is sys.stdout:
                sys.unraisablehook(sys.UnraisableHookArgs(  # type: ignore[call-arg]
                    (type(exc), exc, exc.__traceback__, "Exception ignored in", stream)))
                code = 120
    if code == -signal.SIGINT:  # an uncaught KeyboardInterrupt: killed by SIGINT, as Python 3.8+ ends
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


# -- the client -------------------------------------------------------------------------------------


class _Server:
    def __init__(self, env: Mapping[str, str]) -> None:
        self.key = import_key(env)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = mine
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.cli_forkserver", str(theirs.fileno())],
                                     cwd=ROOT, env=dict(env), pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=self.log)
        theirs.close()
        self.lock = threading.Lock()

    def start(self, cwd: Path | str, args: Sequence[str], env: Mapping[str, str],
              std: Sequence[int], *, session: bool = False) -> tuple[int, socket.socket]:
        """Fork a child for `python -m kiro *args` with stdin, stdout, stderr `std` (`session`: in a session
        and process group of its own, as Popen's start_new_session): its pid and the socket its exit code will
        come on."""
        job = json.dumps({"cwd": str(cwd), "args": list(args), "env": dict(env), "session": session}).encode()
        spill = None
        if len(job) > _MAX_MESSAGE // 2:
            spill = tempfile.NamedTemporaryFile(delete=False, suffix=".json")
            with spill:
                spill.write(job)
            job = json.dumps({"file": spill.name}).encode()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with self.lock:
                socket.send_fds(self.sock, [job], [*std, theirs.fileno()])
            theirs.close()
            return int(self.receive(mine, None)["pid"]), mine
        except BaseException:
            theirs.close()
            mine.close()
            raise
        finally:
            if spill is not None:
                os.unlink(spill.name)

    def receive(self, reply: socket.socket, timeout: float | None) -> dict[str, Any]:
        """The server's next message on a job's socket; TimeoutError (or BlockingIOError for 0) when
        none comes in `timeout` seconds."""
        reply.settimeout(timeout)
        data = reply.recv(_MAX_MESSAGE)
        if not data:
            self.log.seek(0)
            raise RuntimeError(f"the kiro fork server died: {self.log.read().decode(errors='replace')[-2000:]}")
        return json.loads(data)  # type: ignore[no-any-return]

    def close(self) -> None:
        self.sock.close()  # the server returns once its children are reaped... or is killed now
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


_server: _Server | None = None
_lock = threading.Lock()


def _server_for(env: Mapping[str, str]) -> _Server | None:
    """The fork server when it can run this environment's command line as `python -m kiro` would; None:
    run it cold (another interpreter-start environment than the server's)."""
    global _server
    with _lock:
        if _server is None:
            _server = _Server(env)
            atexit.register(close)
        return _server if _server.key == import_key(env) else None


def start(env: Mapping[str, str]) -> None:
    """Start the server for this environment's command lines ahead of the first one (its imports take
    seconds)."""
    _server_for(env)


def close() -> None:
    global _server
    with _lock:
        server, _server = _server, None
    if server is not None:
        server.close()


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _decode(data: bytes) -> str:
    # as subprocess.run(text=True) decodes: the locale's encoding, universal newlines
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


def run(args: Sequence[str], *, cwd: Path | str, env: Mapping[str, str], timeout: float | None = None,
        input: str | None = None, stdout: int | None = None) -> subprocess.CompletedProcess[str]:
    """`subprocess.run([sys.executable, "-m", "kiro", *args], cwd=cwd, env=env, capture_output=True,
    text=True, timeout=timeout, input=input)`, in a forked child. `stdout`: a file descriptor the
    child writes its stdout to instead (`stdout=fh, stderr=PIPE`; the result's stdout is then None)."""
    cmd = [sys.executable, "-m", "kiro", *args]
    server = _server_for(env)
    if server is None:
        return subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE if stdout is None else stdout,
                              stderr=subprocess.PIPE, text=True, timeout=timeout, input=input)
    out_r, out_w = os.pipe() if stdout is None else (None, None)
    err_r, err_w = os.pipe()
    in_r, in_w = os.pipe() if input is not None else (os.open(os.devnull, os.O_RDONLY), None)
    chunks: dict[int, list[bytes]] = {err_r: []} if out_r is None else {out_r: [], err_r: []}
    pid = reply = None
    done = False
    try:
        try:
            pid, reply = server.start(cwd, args, env, [in_r, stdout if out_w is None else out_w, err_w])
        finally:
            for fd in (in_r, out_w, err_w):
                if fd is not None:
                    os.close(fd)
        pending = input.encode(locale.getpreferredencoding(False)) if input is not None else b""
        code = _collect(server, reply, pid, chunks, in_w, pending, timeout)
        in_w = None  # closed by _collect
        done = True
    finally:
        if pid is not None and not done:
            _kill(pid)  # interrupted (pytest-timeout, a KeyboardInterrupt): the child does not outlive it
        for fd in (out_r, err_r, in_w):
            if fd is not None:
                os.close(fd)
        if reply is not None:
            reply.close()
    out = None if out_r is None else _decode(b"".join(chunks[out_r]))
    err = _decode(b"".join(chunks[err_r]))
    if code is None:
        raise subprocess.TimeoutExpired(cmd, timeout or 0, output=out, stderr=err)
    return subprocess.CompletedProcess(cmd, code, out, err)


def _collect(server: _Server, reply: socket.socket, pid: int, chunks: dict[int, list[bytes]], in_w: int | None,
             pending: bytes, timeout: float | None) -> int | None:
    """Feed stdin, read stdout and stderr to their ends and the child's exit code, as communicate()
    does; on a timeout kill the child, read what it wrote and return None. Closes `in_w`."""
    deadline = None if timeout is None else time.monotonic() + timeout
    code: int | None = None
    timed_out = False
    try:
        with selectors.DefaultSelector() as sel:
            for fd in chunks:
                sel.register(fd, selectors.EVENT_READ)
            sel.register(reply, selectors.EVENT_READ)
            if in_w is not None and pending:
                os.set_blocking(in_w, False)
                sel.register(in_w, selectors.EVENT_WRITE)
            elif in_w is not None:
                os.close(in_w)
                in_w = None
            reading = set(chunks)
            while reading or code is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    timed_out = True
                    _kill(pid)
                    deadline = left = None  # now read to the end: the child is gone
                for sk, _ in sel.select(left):
                    if sk.fileobj is reply:
                        code = int(server.receive(reply, None)["code"])
                        sel.unregister(reply)
                    elif sk.fd == in_w:
                        try:
                            pending = pending[os.write(in_w, pending[:65536]):]
                        except BrokenPipeError:
                            pending = b""
                        if not pending:
                            sel.unregister(in_w)
                            os.close(in_w)
                            in_w = None
                    else:
                        data = os.read(sk.fd, 65536)
                        if data:
                            chunks[sk.fd].append(data)
                        else:
                            sel.unregister(sk.fd)
                            reading.discard(sk.fd)
    finally:
        if in_w is not None:
            os.close(in_w)
    return None if timed_out else code


class ForkedProcess:
    """What tests use of a `subprocess.Popen` of `python -m kiro *args`: pid (the kiro process),
    returncode, poll, wait, communicate, send_signal, terminate, kill. stdin is /dev/null; output goes
    to the file descriptors `stdout` and `stderr`."""

    def __init__(self, args: Sequence[str], *, cwd: Path | str, env: Mapping[str, str], stdout: int,
                 stderr: int, start_new_session: bool = False) -> None:
        self.args = [sys.executable, "-m", "kiro", *args]
        self.returncode: int | None = None
        self._server = _server_for(env)
        self._popen: subprocess.Popen[bytes] | None = None
        self._reply: socket.socket | None = None
        if self._server is None:
            self._popen = subprocess.Popen(self.args, cwd=cwd, env=env, stdout=stdout, stderr=stderr,
                                           start_new_session=start_new_session)
            self.pid = self._popen.pid
            return
        stdin = os.open(os.devnull, os.O_RDONLY)
        try:
            self.pid, self._reply = self._server.start(cwd, args, env, [stdin, stdout, stderr],
                                                       session=start_new_session)
        finally:
            os.close(stdin)
        self._wait_lock = threading.Lock()

    def poll(self) -> int | None:
        return self._reap(0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._reap(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return code

    def communicate(self, input: str | None = None, timeout: float | None = None) -> tuple[None, None]:
        self.wait(timeout)
        return None, None

    def _reap(self, timeout: float | None) -> int | None:
        if self._popen is not None:
            try:
                self.returncode = self._popen.wait(timeout) if timeout != 0 else self._popen.poll()
            except subprocess.TimeoutExpired:
                return None
            return self.returncode
        assert self._server is not None and self._reply is not None
        with self._wait_lock:
            if self.returncode is None:
                try:
                    message = self._server.receive(self._reply, timeout)
                except (TimeoutError, BlockingIOError):
                    return None
                self.returncode = int(message["code"])
                self._reply.close()
            return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __del__(self) -> None:
        if self._reply is not None:
            self._reply.close()  # no ResourceWarning for a process nobody waited for

    def __enter__(self) -> ForkedProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.wait()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
