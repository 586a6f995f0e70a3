"""`kiro worker`'s process: connect, serve one task queue, stop on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio.worker import Worker

from kiro.errors import UserError
from kiro.fs import locks
from kiro.store.config import Config
from kiro.store.workspace import Workspace
from kiro.temporal import client as tc

# Heartbeats reach the server at least every second: a cancellation (`kiro loop stop --force`) arrives with the
# answer to one, so this bounds how long a force stop takes to reach a running step.
_BEATS: dict[str, Any] = {"max_heartbeat_throttle_interval": timedelta(seconds=1),
                          "default_heartbeat_throttle_interval": timedelta(seconds=1)}


def main(ws: Workspace, cfg: Config, *, role: str, clone: Path | None, remote: str | None, name: str,
         max_concurrent: int) -> None:
    asyncio.run(_serve(ws, cfg, role=role, clone=clone, remote=remote, name=name, max_concurrent=max_concurrent))


async def _serve(ws: Workspace, cfg: Config, *, role: str, clone: Path | None, remote: str | None, name: str,
                 max_concurrent: int) -> None:
    from kiro.temporal.workflow import KiroLoop, KiroStep

    lock: locks.Flock | None = None
    n = tc.names(ws, cfg)
    if role == "workspace":
        path = tc.worker_lock(ws)
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = locks.Flock(path)  # held for the life of the process
        try:
            lock.acquire()
        except locks.Timeout:
            holder = locks.holder_pid(path)
            who = f"pid {holder}, which holds" if holder else "it holds"
            raise UserError(f"a workspace worker already runs for {ws.root} ({who} {ws.relative(path)}); one per "
                            f"workspace") from None
        except OSError as exc:
            raise UserError(f"cannot take the workspace worker's lock {ws.relative_name(path)}: "
                            f"{exc.strerror}") from None
    client = await tc.connect(cfg)
    stop = asyncio.Event()
    segments = None
    if role == "workspace":
        from kiro.temporal.segment import Segments

        segments = Segments(client)
        worker = Worker(client, task_queue=n.ws_queue, workflows=[KiroLoop, KiroStep],
                        activities=[segments.run_segment], max_concurrent_activities=10_000,
                        graceful_shutdown_timeout=timedelta(seconds=30), **_BEATS)
    else:
        from kiro.temporal.attempt import Attempts, Clone

        assert clone is not None
        attempts = Attempts(await asyncio.to_thread(Clone.prepare, clone, remote, name))
        worker = Worker(client, task_queue=n.step_queue, activities=[attempts.run_attempt],
                        max_concurrent_activities=max_concurrent, graceful_shutdown_timeout=timedelta(seconds=2),
                        **_BEATS)
    aloop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        aloop.add_signal_handler(sig, stop.set)
    queue = n.ws_queue if role == "workspace" else n.step_queue
    sys.stdout.write(f"kiro worker {name} ({role}) ready: {tc.backend_of(cfg).address} queue {queue}, "
                     f"pid {os.getpid()}\n")
    sys.stdout.flush()
    running = asyncio.create_task(worker.run())
    await asyncio.wait({running, asyncio.create_task(stop.wait())}, return_when=asyncio.FIRST_COMPLETED)
    if segments is not None:
        segments.stop_all("stopped: the workspace worker got SIGTERM")
    if not running.done():
        await worker.shutdown()
    await running
    if lock is not None:
        lock.release()
