"""What the person should know that did not stop the loop: a warning, an `on_event` command that failed.

Every kind here is made on first use: `kiro.store.events` imports this module when one of its names
is asked for (`ev.X`, `from kiro.store.events import X`) or every kind is read (the log's reader). Many parts
emit them, but only when something goes wrong: a run of shell steps that all pass makes neither (issue #41)."""

from typing import Literal

from kiro.store.events import Event


class LoopWarning(Event):
    """Something the person should know that did not stop the loop."""

    event: Literal["warning"] = "warning"
    message: str


class NotifierFailed(Event):
    """An `on_event` command failed (its command is not recorded: it may hold a secret)."""

    event: Literal["notifier_failed"] = "notifier_failed"
    kind: str
    error: str
    command: str | None = None  # logs before redaction landed; no longer written (it may hold a token)
