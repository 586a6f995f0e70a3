"""Notifications: `on_event` commands from the config, run when a loop completes, fails, pauses or
hits a limit. The command gets the facts in environment variables; a notifier that fails or hangs is
logged (`notifier_failed`) and never stops a loop.

`send` is the other way out: a message to the `notify` URLs through Apprise (ntfy, Telegram, Slack,
Discord, e-mail, `json://` webhooks, ...; kiro.core.digest decides what is sent). It runs in a daemon
thread and is waited for at most `SEND_TIMEOUT` seconds: a service that hangs costs the loop nothing, and
the process may end while it still hangs. What goes wrong is told by the URL's place in the list, never by
the URL, which holds the service's token."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from kiro.processes.spawn import run_process, tail

NOTIFIER_TIMEOUT = 30.0
SEND_TIMEOUT = 20.0


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


def _send_now(urls: Sequence[str], title: str, body: str, warning: bool) -> list[str]:
    import logging

    import apprise

    problems: list[str] = []
    kind = apprise.NotifyType.WARNING if warning else apprise.NotifyType.INFO
    for n, url in enumerate(urls, 1):
        sender = apprise.Apprise()
        if not sender.add(url):
            problems.append(f"notify URL {n}: Apprise does not know it")
            continue
        with apprise.LogCapture(level=logging.WARNING) as said:  # type: ignore[no-untyped-call]
            ok = sender.notify(body=body, title=title, notify_type=kind)
        if not ok:
            lines = [line.split(" - ", 2)[-1] for line in said.getvalue().splitlines() if line.strip()]
            problems.append(f"notify URL {n}: {lines[-1] if lines else 'the service refused the message'}")
    return problems


async def send(urls: Sequence[str], title: str, body: str, *, warning: bool = False,
               timeout: float = SEND_TIMEOUT) -> list[str]:
    """Send one message to every URL: the problems (one line per URL that failed), [] when all took it."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[list[str]] = loop.create_future()

    def work() -> None:
        try:
            result = _send_now(urls, title, body, warning)
        except Exception as exc:  # a plugin's own bug is one more failed notifier, never the loop's end
            result = [f"notify: {type(exc).__name__}: {exc}"]
        def settle() -> None:
            if not done.done():
                done.set_result(result)

        with contextlib.suppress(RuntimeError):  # the event loop closed while the service hung
            loop.call_soon_threadsafe(settle)

    threading.Thread(target=work, name="kiro-notify", daemon=True).start()
    try:
        return await asyncio.wait_for(asyncio.shield(done), timeout)
    except TimeoutError:
        return [f"notify: no answer within {timeout:g} s"]
