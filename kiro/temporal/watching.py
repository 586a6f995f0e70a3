"""`kiro loop watch` on the temporal backend: the same promises as the local supervisor (SPEC §3) with
workflows instead of loops in this process. It polls the workspace: a task file in Specs/ or a Kiro spec's
`.kiro/specs/*/tasks.md` without a loop (the same files as the local watch: kiro.core.supervisor.task_files) gets a
new workflow (at most `max_parallel_loops` running at once); a loop paused by its stop hook continues (signal
`resume`) once the hook is deleted and the task is in Specs/. The loops run in the workspace worker, so
stopping the watcher stops no loop."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from kiro.core.engine import STOP_SIGNALS
from kiro.core.runner import (
    LoopIndex,
    find_loop_for_task,
    nothing_to_start,
    prepare_resume,
    prepare_start,
    task_id_hint,
)
from kiro.errors import KiroError, LockHeld
from kiro.status import Status, StopReason
from kiro.store import tasks
from kiro.store.settings import settings_for
from kiro.store.workspace import Workspace, task_files
from kiro.temporal import client as tc
from kiro.views import console

POLL_SECONDS = 0.5


def watch(ws: Workspace, *, config_file: Path | None, overrides: dict[str, Any], max_parallel: int | None,
          quiet: bool) -> int:
    return asyncio.run(_watch(ws, config_file=config_file, overrides=overrides, max_parallel=max_parallel,
                              quiet=quiet))


async def _watch(ws: Workspace, *, config_file: Path | None, overrides: dict[str, Any], max_parallel: int | None,
                 quiet: bool) -> int:
    loc = settings_for(ws, config_file=config_file)
    cfg, store = loc.config, loc.store
    limit = max_parallel or cfg.max_parallel_loops
    client = await tc.connect(cfg)
    tc.ensure_workspace_worker(ws)
    stopping = asyncio.Event()
    aloop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        aloop.add_signal_handler(sig, stopping.set)
    if not quiet:
        console.line(f"watching {ws.specs} on backend: temporal (at most {limit} loops at once); Ctrl-C to stop",
                     style="bold")
    index = LoopIndex(store)
    skipped: dict[Path, float] = {}

    def say(text: str) -> None:
        if not quiet:
            console.line(text)

    while not stopping.is_set():
        if not ws.global_hook_file.exists():
            index.refresh()
            running = sum(1 for st in index.unfinished() if store.is_locked(st.task_id))
            for path, real in task_files(ws):  # as the local watch: Specs/ and .kiro/specs/*/tasks.md
                try:
                    mtime = path.stat().st_mtime
                except OSError:
                    continue  # moved away since
                if skipped.get(path) == mtime:
                    continue
                try:
                    task = tasks.load(path)
                    existing = find_loop_for_task(store, path, task_id_hint(ws, Path(real), task), index,
                                                  refresh=False)
                    if existing is not None:
                        if (existing.status == Status.PAUSED and existing.stop_reason == StopReason.STOP_HOOK
                                and not ws.hook_file(existing.task_id).exists()
                                and not store.is_locked(existing.task_id) and running < limit):
                            run = prepare_resume(ws, existing.task_id, config_file=config_file, overrides=overrides)
                            await _continue(client, run)
                            running += 1
                            say(f"{existing.task_id}: hook deleted; continued")
                        continue
                    if nothing_to_start(task, real, cfg.include_optional):
                        continue
                    if running >= limit:
                        continue
                    run = prepare_start(ws, str(path), config_file=config_file, overrides=overrides, index=index)
                    for line in run.warnings:
                        console.warning(line)
                    await _begin(client, run)
                    running += 1
                    say(f"{run.state.task_id}: started for {ws.relative(path)}")
                except LockHeld:
                    continue
                except KiroError as exc:
                    skipped[path] = mtime
                    console.warning(f"skipped {ws.relative(path)}: {exc}")
        try:
            await asyncio.wait_for(stopping.wait(), POLL_SECONDS)
        except TimeoutError:
            pass
    return 0


async def _begin(client: Any, run: Any) -> None:
    try:
        inp = tc.loop_input(run.ws, run.config, run.state.task_id, resumed=False)
    finally:
        if run.release:
            run.release()
    await tc.start(client, inp)


async def _continue(client: Any, run: Any) -> None:
    try:
        inp = tc.loop_input(run.ws, run.config, run.state.task_id, resumed=True)
    finally:
        if run.release:
            run.release()
    handle = await tc.open_handle(client, inp["workflow_id"])
    if handle is None:
        await tc.start(client, inp)
    else:
        await handle.signal("resume")
