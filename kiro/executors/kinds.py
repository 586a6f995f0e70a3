"""What an executor is, by its name, for those that only read a loop's state (`status`, the
dashboard): importing an executor itself would cost them its dependencies."""

from __future__ import annotations

PROMPTLESS = frozenset({"shell"})  # executors that run each step's own command: no agent reads a prompt


def reads_messages(name: str | None) -> bool:
    """Whether a loop run by the executor called `name` can be sent messages (SPEC §11): its agent
    reads a prompt (`Executor.reads_prompt`). A message to a shell loop would wait for ever."""
    return name not in PROMPTLESS
