"""Notifications: `on_event` commands from the config, run when a loop completes, fails, pauses or
hits a limit. The command gets the facts in environment variables; a notifier that fails or hangs is
logged (`notifier_failed`) and never stops a loop."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from kiro.processes.spawn import run_process, tail

NOTIFIER_TIMEOUT = 30.0


async def run_notifier(command: str, facts: Mapping[str, str], cwd: Path) -> str | None:
    """Run one notifier; None when it succeeded, else what went wrong (one line)."""
    env = dict(os.environ)
    env.update({f"KIRO_{k.upper()}": v for k, v in facts.items()})
    try:
        result = await run_process(["bash", "-c", command], cwd=cwd, env=env, timeout=NOTIFIER_TIMEOUT)
    except OSError as exc:
        return f"could not run: {exc}"
    if result.timed_out:
        return f"timed out after {NOTIFIER_TIMEOUT:g} s"
    if result.returncode != 0:
        return f"exit status {result.returncode}: {tail(result.output, 300)}"
    return None
