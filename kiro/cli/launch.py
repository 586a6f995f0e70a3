"""The terminal's side of the core API (kiro.core.api): `ConsoleFront` prints what a command shows as it
runs (warnings and the box's note on stderr, the loop's events and outcome on stdout); the commands in
kiro.cli.loop parse their options, call the API and print what it returns.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiro.core import api
from kiro.views import output

if TYPE_CHECKING:
    from kiro.core.engine import Outcome
    from kiro.store.events import Listener
    from kiro.store.redact import Redactor
    from kiro.store.statestore import StateStore
    from kiro.store.workspace import Workspace


def say_note(note: str) -> None:
    """A loop's note (the box its steps run in): on stderr, beside the warnings (stdout is the loop's
    events), with no `kiro: `: no error."""
    from kiro.views import console

    with contextlib.suppress(OSError):
        sys.stderr.write(console.clean(note) + "\n")
        sys.stderr.flush()


class ConsoleFront(api.Front):
    """Prints: `--quiet` keeps only the outcome, the warnings and the billing line; `--verbose` adds tool
    calls and reinjections to the events. A loop started in the background prints as this command would."""

    def __init__(self, *, quiet: bool = False, verbose: bool = False) -> None:
        self.quiet = quiet
        self.verbose = verbose
        self.child_flags = [*(["--quiet"] if quiet else []), *(["--verbose"] if verbose else [])]

    def warning(self, text: str) -> None:
        from kiro.views import console

        console.warning(text)

    def line(self, text: str) -> None:
        from kiro.views import console

        console.line(text)

    def note(self, text: str) -> None:
        if not self.quiet:
            say_note(text)

    def redact_with(self, redactor: Redactor) -> None:
        from kiro.views import console

        console.redact_with(redactor)

    def listeners(self, loops: int) -> list[Listener]:
        from kiro.views import console

        return [] if self.quiet else [console.EventPrinter(with_task=loops > 1, verbose=self.verbose)]

    def outcome(self, outcome: Outcome) -> None:
        """`<id>: <status> (<reason>) - <message>; see <report>`: in bold, or as an error for exit 1."""
        from kiro.views import console

        o = outcome
        msg = f"{o.task_id}: {o.status} ({o.reason}) - {o.message}"
        if o.report:
            msg += f"; see {o.report}"
        try:
            if o.exit_code == 1:
                console.error(msg)
            else:
                console.line(msg, style="bold")
        except OSError as exc:  # the reader went away, or a full disk: the exit code still says how the loop ended
            output.cannot_write(sys.stderr if o.exit_code == 1 else sys.stdout, exc)


def workspace(path: Path | None) -> Workspace:
    return api.workspace(path)


def store_of(ws: Workspace, *, lenient: bool = True) -> StateStore:
    """The state store (kiro.core.api.store_of); a broken config's warning on stderr."""
    return api.store_of(ws, ConsoleFront(), lenient=lenient)


def started(result: api.Started) -> int:
    """What `start`/`resume` print once the API returns: the task ids of loops now in the background."""
    if result.detached:
        from kiro.views import console

        for tid in result.task_ids:
            console.line(tid)
    return result.exit_code


def options(**given: Any) -> api.Options:
    return api.Options(**given)
