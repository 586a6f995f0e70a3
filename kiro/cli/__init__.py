"""The Typer app. Commands are thin: parse arguments, call one core function, render the result.

Errors are converted once, here: a `KiroError` becomes one line on stderr and its exit code.
Unexpected exceptions re-raise under `KIRO_RAISE_ERRORS=1` (set by every test) or `KIRO_DEBUG=1`,
so real bugs surface.
"""

import os
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

from kiro.core import heap

with heap.starting_up():  # Typer's import
    import typer
    from typer.core import TyperGroup, TyperOption

from kiro import __version__
from kiro.plugins import no_pydantic_plugins
from kiro.views import output


class HelpGroup(TyperGroup):
    """A command group whose `--help` pages show a flag as a flag. Typer 0.29 prints every option's type,
    a yes/no flag's too (`--detach <bool>`, even `--help <bool>`), as if it took a value; here a flag shows
    no type, on the group's page and on each of its commands'. An option that takes a value names it in
    its declaration (`metavar="PATH"`)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _flags_shown_bare(super().get_params(ctx))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is not None and not isinstance(command, HelpGroup):
            _flags_shown_bare(command.get_params(ctx))
        return command


def _flags_shown_bare(params: list[Any]) -> list[Any]:
    for param in params:
        if isinstance(param, TyperOption) and param.is_flag and param.metavar is None:
            param.metavar = ""  # Typer shows the metavar, when there is one, instead of the type
    return params


_app = typer.Typer(
    cls=HelpGroup,
    name="kiro",
    help="Run an AI agent through a Kiro-style tasks.md checklist, one verified step per iteration.\n\n"
         "Start a loop with `kiro loop start --task Specs/<feature>/tasks.md`; watch it with `kiro loop status`; "
         "stop it with `kiro loop stop` or by dropping a file in .hooks/; continue it with `kiro loop resume`.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=True,  # `kiro --install-completion`, `kiro --show-completion`: for the shell kiro runs in
    context_settings={"help_option_names": ["-h", "--help"]},
)

F = TypeVar("F", bound=Callable[..., Any])


def exit_code_for(exc: Exception) -> int | None:
    """A command's exception as its exit code, after saying what went wrong: a `KiroError` is one line
    on stderr and its own code; anything else is an "internal error" line and exit 1. None: re-raise it
    (KIRO_DEBUG, or an unexpected error under KIRO_RAISE_ERRORS, so that a bug fails its test)."""
    from kiro.errors import KiroError, raise_errors
    from kiro.views import console

    if output.stdout_full(exc):  # `> /dev/full`: bad input, not a bug
        assert isinstance(exc, OSError)
        return output.stdout_failed(exc)
    if isinstance(exc, KiroError):
        if os.environ.get("KIRO_DEBUG"):
            return None
        if exc.exit_code == 0:
            console.line(str(exc))
        else:
            console.error(str(exc))
        return exc.exit_code
    if raise_errors():
        return None
    console.error(f"internal error: {type(exc).__name__}: {exc} (run with KIRO_DEBUG=1 for the traceback, "
                  f"and please report it)")
    return 1


def guarded(fn: F) -> F:
    """Turn kiro's errors into one line on stderr and the error's exit code (`exit_code_for`)."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        heap.started()  # the command's body: the collector back on (`main`)
        try:
            return fn(*args, **kwargs)
        except BrokenPipeError:
            output.closed_pipe()  # `kiro loop logs --json | head -1`: for every command, here
        except (typer.Exit, typer.Abort):
            raise
        except Exception as exc:
            code = exit_code_for(exc)
            if code is None:
                raise
            raise typer.Exit(code) from None

    return wrapper  # type: ignore[return-value]


def _exit_now(code: object) -> None:
    """The temporal backend's SDK keeps native threads that may call into Python while the interpreter shuts
    down (a fatal error, exit -6, at random): a command that used it ends here, its output flushed."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code if isinstance(code, int) else (0 if code is None else 1))


def _version(value: bool) -> None:
    if value:
        typer.echo(f"kiro {__version__}")
        raise typer.Exit(0)


@_app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """kiro: autonomous task loops."""


def _register(only: str | None = None, sub: str | None = None) -> None:
    """Add the commands; with `only` (the command line's first word, when it names one) just that one:
    `kiro loop start` need not import what `kiro serve` or `kiro init` need. Help, an unknown command or
    no command at all get every one (`main` decides). With `sub` (the second word of `kiro loop ...`), the
    loop group has only the command it names, when it names one: Typer reads the parameters of every command
    of a group it runs, ~35 M instructions for the loop group's fourteen (issue #41)."""
    from kiro.cli import loop

    if only in (None, "loop"):
        named = {typer.main.get_command_name(info.name or info.callback.__name__): info
                 for info in loop.app.registered_commands if info.callback is not None}
        if sub in named or sub == "watch":
            loop.app.registered_commands = [named[sub]] if sub in named else []
        if sub not in named:
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
    if only in (None, "config"):
        from kiro.cli import config

        _app.add_typer(config.app, name="config")
    if only in (None, "worker"):
        from kiro.cli import worker

        _app.command("worker")(worker.worker)


COMMANDS = ("loop", "init", "serve", "agents", "config", "worker")


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
    only = argv[0] if argv and argv[0] in COMMANDS else None
    _register(only, argv[1] if only == "loop" and len(argv) > 1 else None)


def usage_error(exc: typer.TyperException) -> int:
    """A complaint of the command line's parser (an unknown option, a bad value, a missing argument) as
    one line through the redactor, exit 1: Typer's own box echoed what was typed, a secret too. Besides
    what every line is cleaned of, the line is cut of the credentials the command line shows: values
    of `--token X`-like options and words in a credential format, also as an option (`--sk-...`), and
    the token `kiro serve` generated for the workspace."""
    from kiro.errors import UserError
    from kiro.store.redact import Redactor, command_secrets, looks_like_token
    from kiro.store.statestore import serve_token
    from kiro.store.workspace import Workspace
    from kiro.views import console

    message = " ".join(exc.format_message().split()).rstrip(".")
    if len(message) > 300:
        message = message[:299] + "…"
    ctx = getattr(exc, "ctx", None)
    hint = f"; `{ctx.command_path} -h` shows the usage" if ctx is not None else ""
    words = [part for arg in sys.argv[1:] for part in arg.lstrip("-").split("=")]
    typed = Redactor([*command_secrets(" ".join(sys.argv[1:])), *filter(looks_like_token, words)])
    try:  # and the serve token of the workspace found without the (unparsed) --workspace
        typed |= serve_token(Workspace.find(None))
    except UserError:
        pass
    console.error(typed.text(message + hint))
    return 1


def main() -> None:
    """`kiro` (the script) and `python -m kiro`."""
    heap.left_alone_at_exit()  # no cyclic collection as the interpreter ends, either
    with heap.starting_up():  # no cyclic collection until the command's body (`guarded`) or the end
        _main()


def _main() -> None:
    _register_for(sys.argv[1:])
    no_pydantic_plugins()  # before Typer builds its options' validators: no plugin loader, no importlib.metadata
    try:
        # not standalone: the parser's errors come here (`usage_error`), and `typer.Exit(n)` is returned
        code = _app(standalone_mode=False)
        sys.exit(code if isinstance(code, int) else 0)
    except typer.TyperException as exc:  # the parser's (Typer's own click): the base of its errors
        if type(exc).__name__ == "NoArgsIsHelpError":  # `kiro`, `kiro loop`: the help, printed already
            sys.exit(exc.exit_code)
        sys.exit(usage_error(exc))
    except typer.Abort:  # pragma: no cover - interactive (Ctrl-D at a prompt)
        sys.exit(1)
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
