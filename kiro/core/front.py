"""What a front end shows of a core API command while it runs (kiro.core.api, kiro.core.backends)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kiro.core.engine import Outcome
    from kiro.store.events import Listener
    from kiro.store.redact import Redactor


class Front:
    """What a front end shows of a command while it runs. This one shows nothing (`kiro serve`: the
    dashboard reads the loop's events); the CLI's prints (kiro.cli.launch.ConsoleFront)."""

    child_flags: Sequence[str] = ("--quiet",)  # the flags a loop started in the background prints with

    def warning(self, text: str) -> None:
        """Something the person should know before the loop runs (a typo'd key, a moved task file)."""

    def line(self, text: str) -> None:
        """What happened (a hook written, a loop handed to `kiro loop watch`, the credential a loop bills)."""

    def note(self, text: str) -> None:
        """Where the loop's steps run (the sandbox line)."""

    def outcome(self, outcome: Outcome) -> None:
        """How a loop run in the foreground ended."""

    def redact_with(self, redactor: Redactor) -> None:
        """What a loop knows as secret: cut from everything shown from here on."""

    def listeners(self, loops: int) -> list[Listener]:
        """Who hears the events of `loops` loops run in the foreground."""
        return []
