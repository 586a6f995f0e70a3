"""The Typer app. Commands are thin: parse arguments, call one core function, render the result.

Errors are converted once, here: a `KiroError` becomes one line on stderr and its exit code.
Unexpected exceptions re-raise under `KIRO_RAISE_ERRORS=1` (set by every test) or `KIRO_DEBUG=1`,
so real bugs surface.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import typer

from kiro import __version__, output
from kiro.launch import exit_code_for
from kiro.launch import exit_now as _exit_now
from kiro.launch import succeeded as _succeeded

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
        try:
            result = fn(*args, **kwargs)
        except BrokenPipeError:
            output.closed_pipe()  # `kiro loop logs --json | head -1`: for every command, here
        except typer.Exit as exc:
            if exc.exit_code == 0:
                _succeeded()
            raise
        except typer.Abort:
            raise
        except Exception as exc:
            code = exit_code_for(exc)
            if code is None:
                raise
            raise typer.Exit(code) from None
        _succeeded()
        return result

    return wrapper  # type: ignore[return-value]


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
        output.closed_pipe()
    except OSError as exc:  # `kiro --version > /dev/full`: outside any command's guard
        if not output.stdout_full(exc):
            raise
        sys.exit(output.stdout_failed(exc))
    except SystemExit as exc:
        if "temporalio" in sys.modules:
            _exit_now(exc.code)
        raise
