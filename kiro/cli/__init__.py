"""The Typer app. Commands are thin: parse arguments, call one core function, render the result.

Errors are converted once, here: a `KiroError` becomes one line on stderr and its exit code.
Unexpected exceptions re-raise under `KIRO_RAISE_ERRORS=1` (set by every test) or `KIRO_DEBUG=1`,
so real bugs surface.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import typer

from kiro import __version__

_app = typer.Typer(
    name="kiro",
    help="Run an AI agent through a Kiro-style tasks.md checklist, one verified step per iteration.\n\n"
         "Start a loop with `kiro loop start --task Specs/<feature>/tasks.md`; watch it with `kiro loop status`; "
         "stop it with `kiro loop stop` or by dropping a file in .hooks/; continue it with `kiro loop resume`.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

F = TypeVar("F", bound=Callable[..., Any])


def guarded(fn: F) -> F:
    """Turn kiro's errors into one line on stderr and the error's exit code."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from kiro.errors import KiroError, raise_errors

        try:
            result = fn(*args, **kwargs)
        except KiroError as exc:
            if os.environ.get("KIRO_DEBUG"):
                raise
            from kiro import console

            if exc.exit_code == 0:
                console.line(str(exc))
            else:
                console.error(str(exc))
            raise typer.Exit(exc.exit_code) from None
        except BrokenPipeError:
            _closed_pipe()  # `kiro loop logs --json | head -1`: for every command, here
        except typer.Exit as exc:
            if exc.exit_code == 0:
                _succeeded()
            raise
        except (typer.Abort, KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:
            if raise_errors():
                raise
            from kiro import console

            console.error(f"internal error: {type(exc).__name__}: {exc} (run with KIRO_DEBUG=1 for the traceback, "
                          f"and please report it)")
            raise typer.Exit(1) from None
        _succeeded()
        return result

    return wrapper  # type: ignore[return-value]


def _succeeded() -> None:
    """A command ended with exit 0: what it may write only then (a command that fails changes no file)."""
    if "kiro.fastread" in sys.modules:
        sys.modules["kiro.fastread"].write_config_checked()


def _version(value: bool) -> None:
    if value:
        typer.echo(f"kiro {__version__}")
        raise typer.Exit(0)


@_app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """kiro: autonomous task loops."""


def _register(only: str | None = None) -> None:
    """Add the commands; with `only` (the command line's first word, when it names one) just that one:
    `kiro loop start` need not import what `kiro serve` or `kiro init` need. Help, an unknown command or
    no command at all get every one (`main` decides)."""
    from kiro.cli import loop

    if only in (None, "loop"):
        from kiro.cli import watch

        loop.app.command("watch")(watch.watch)
        _app.add_typer(loop.app, name="loop")
    if only in (None, "init"):
        from kiro.cli import init

        _app.command("init")(init.init)
    if only in (None, "serve"):
        from kiro.cli import serve

        _app.command("serve")(serve.serve)
    if only in (None, "agents"):
        from kiro.cli import agents

        _app.command("agents")(agents.agents)
    if only in (None, "worker"):
        from kiro.cli import worker

        _app.command("worker")(worker.worker)


COMMANDS = ("loop", "init", "serve", "agents", "worker")


def __getattr__(name: str) -> Any:
    """`kiro.cli.app`: the Typer app with every command (tests drive it with CliRunner)."""
    if name == "app":
        _register_for([])
        return _app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
_registered = False


def _register_for(argv: list[str]) -> None:
    global _registered
    if _registered:
        return
    _registered = True
    _register(argv[0] if argv and argv[0] in COMMANDS else None)


def main() -> None:
    _register_for(sys.argv[1:])
    try:
        _app()
    except KeyboardInterrupt:  # pragma: no cover - interactive
        sys.exit(130)
    except BrokenPipeError:
        _closed_pipe()
    except SystemExit as exc:
        if "temporalio" in sys.modules:
            _exit_now(exc.code)
        raise


def _exit_now(code: object) -> None:
    """The temporal backend's SDK keeps native threads that may call into Python while the interpreter shuts
    down (a fatal error, exit -6, at random): a command that used it ends here, its output flushed."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code if isinstance(code, int) else (0 if code is None else 1))


def _closed_pipe() -> None:
    """The reader of our output went away (`| head -1`): it had what it wanted; end quietly.

    stdout is pointed at /dev/null so that the interpreter's final flush of what is still buffered
    does not raise (and print) a second BrokenPipeError on the way out (Python docs, "Note on SIGPIPE").
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    sys.exit(0)
