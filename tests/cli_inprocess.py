"""`kiro ARGS` run in the test's own process: what `python -m kiro ARGS` does (kiro.cli.main, its exit
code, its stdout and stderr apart), without a process of its own. A read command or a refusal costs
milliseconds here against a forked process's second on a loaded machine (tests/cli_forkserver.py).

The command sees what a process of its own would: the environment given (whole, not merged into the
test's), the working directory, `sys.argv`, stdin (the `input` text, else empty) and a stdout and
stderr that are no terminal. Typer's CliRunner provides the streams (`isolation`); click's forced
help width of 80 is lifted, as a process with no terminal has none. It starts with no redactor made
(kiro.views.console, kiro.store.redact): a process knows the secrets of its own environment and config,
not those of the command run before it. What it leaves behind is put back: the environment, the
working directory, argv, the stop signals' handlers, the warnings kiro printed once per process and the
redactors (kiro.views.console).

Not for a command that needs a process of its own (`NEEDS_A_PROCESS`): one that runs a loop, serves,
watches or follows, detaches, or is signalled or killed. `run` refuses those by their words, and fails
a command that left a thread running behind it (kiro's shared writer threads aside, once idle).

An exception kiro lets through (`KIRO_RAISE_ERRORS=1`: a bug) becomes what the interpreter makes of it:
its traceback on stderr and exit 1, as in a process, so that a test that counts tracebacks counts it.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import threading
import traceback
import types
from collections.abc import Mapping, Sequence
from pathlib import Path

from click import formatting
from typer.testing import CliRunner

# words of a command line that runs a loop, a server or a watch, detaches one, or waits for a signal
NEEDS_A_PROCESS = (("loop", "start"), ("loop", "resume"), ("loop", "watch"), ("serve",), ("worker",),
                   ("--detach",), ("--watch",), ("--follow",), ("-f",))
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE, signal.SIGCHLD)


def needs_a_process(args: Sequence[str]) -> bool:
    words = [a.split("=", 1)[0] for a in args]
    return any(all(w in words for w in need) for need in NEEDS_A_PROCESS)


def run(args: Sequence[str], *, cwd: Path | str, env: Mapping[str, str],
        input: str | None = None) -> subprocess.CompletedProcess[str]:
    """`subprocess.run([sys.executable, "-m", "kiro", *args], cwd=cwd, env=env, capture_output=True,
    text=True, input=input)`, run in this process."""
    if needs_a_process(args):
        raise AssertionError(f"`kiro {' '.join(args)}` needs a process of its own: run it with ws.kiro")
    import kiro
    import kiro.cli
    from kiro.store import redact
    from kiro.views import console

    kiro.cli.app  # noqa: B018 - every command registered, whatever the first command run here was
    cmd = [sys.executable, "-m", "kiro", *args]
    saved_env, saved_cwd, saved_argv, saved_main = dict(os.environ), os.getcwd(), sys.argv, sys.modules["__main__"]
    main_thread = threading.current_thread() is threading.main_thread()
    handlers = {sig: signal.getsignal(sig) for sig in _SIGNALS} if main_thread else {}
    threads = set(threading.enumerate())
    exit_now = kiro.cli._exit_now  # type: ignore[attr-defined]
    warned = list(console._warned)
    redactors = list(console._redactor), list(console._merged), list(redact._run_seen)
    with CliRunner().isolation(input=input) as (out, err, _):
        width, formatting.FORCED_WIDTH = formatting.FORCED_WIDTH, None
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        sys.argv = [str(Path(kiro.__file__).parent / "__main__.py"), *args]  # as `-m` makes it
        sys.modules["__main__"] = _as_main()  # click names the program from it: `python -m kiro`
        console._warned.clear()
        console._redactor.clear()  # made from this command's environment on its first line, as in a process
        console._merged[:] = [None]
        redact._run_seen.clear()
        kiro.cli._exit_now = _raise_exit  # type: ignore[attr-defined] # no os._exit in the test's process
        try:
            code = _main(kiro.cli.main)
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            stdout, stderr = out.getvalue(), err.getvalue()
        finally:
            kiro.cli._exit_now = exit_now  # type: ignore[attr-defined]
            console._warned[:] = warned
            console._redactor[:], console._merged[:], redact._run_seen[:] = redactors
            sys.argv = saved_argv
            sys.modules["__main__"] = saved_main
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)
            formatting.FORCED_WIDTH = width
            for sig, handler in handlers.items():
                if handler is not None:
                    signal.signal(sig, handler)
    _no_threads_left(threads, args)
    return subprocess.CompletedProcess(cmd, code, _text(stdout), _text(stderr))


def _main(main: object) -> int:
    try:
        main()  # type: ignore[operator]
        return 0
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught exception
        traceback.print_exc(file=sys.stderr)
        return 1


def _as_main() -> types.ModuleType:
    main = types.ModuleType("__main__")
    main.__spec__ = importlib.util.find_spec("kiro.__main__")
    main.__package__ = "kiro"
    return main


def _raise_exit(code: object) -> None:
    raise SystemExit(code)


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")


def _no_threads_left(before: set[threading.Thread], args: Sequence[str]) -> None:
    from kiro.fs import writer

    if writer._workers is not None:
        writer._workers._wait_all()  # what a process's exit waits for: the writes it queued
    left = [t.name for t in threading.enumerate() if t not in before and t.is_alive()
            and not t.name.startswith("kiro-write-")]
    assert not left, f"`kiro {' '.join(args)}` left threads running {left}: run it with ws.kiro"
