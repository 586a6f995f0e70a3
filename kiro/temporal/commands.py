"""`kiro loop start|resume|stop --force` on the temporal backend: the same checks and files as locally
(`kiro.core.runner.prepare_start` / `prepare_resume` run here, in the CLI), then a workflow is started or
signalled; in the foreground the CLI prints the loop's events and exits with its exit code."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from kiro.core.engine import LoopRun
from kiro.store.workspace import Workspace
from kiro.temporal import client as tc
from kiro.views import console


def preflight(ws: Workspace, config_file: Any) -> None:
    """Before `prepare_start` writes anything: the server answers and the project has a commit to branch from."""
    from kiro.store.settings import settings_for

    cfg = settings_for(ws, config_file=config_file).config
    tc.base_commit(ws, cfg)

    async def check() -> None:
        await tc.connect(cfg)

    asyncio.run(check())


def start_runs(runs: list[LoopRun], *, detach: bool, quiet: bool, verbose: bool) -> int:
    """Loops prepared by `prepare_start` (state file written, lock held): hand each to a new workflow."""
    for r in runs:
        for w in r.warnings:
            console.warning(w)
    return asyncio.run(_start(runs, detach=detach, quiet=quiet, verbose=verbose))


async def _start(runs: list[LoopRun], *, detach: bool, quiet: bool, verbose: bool) -> int:
    inputs = []
    try:
        cfg = runs[0].config
        client = await tc.connect(cfg)
        for r in runs:
            inputs.append(tc.loop_input(r.ws, r.config, r.state.task_id, resumed=False))
    finally:
        for r in runs:
            if r.release:
                r.release()  # the workspace worker takes the loop's lock when it runs it
    tc.ensure_workspace_worker(runs[0].ws)
    followers = None if detach else _followers(runs[0].ws, [r.state.task_id for r in runs], quiet=quiet,
                                                verbose=verbose)
    handles = [await tc.start(client, inp) for inp in inputs]
    if followers is None:
        for r in runs:
            console.line(r.state.task_id)
        return 0
    return await _follow([(r.state.task_id, h, 0) for r, h in zip(runs, handles, strict=True)], followers)


def resume_run(run: LoopRun, *, detach: bool, quiet: bool, verbose: bool) -> int:
    """A loop prepared by `prepare_resume` (hook removed, options applied, state saved): signal its open
    workflow to continue, or start a new workflow from the state file when none is open."""
    for w in run.warnings:
        console.warning(w)
    return asyncio.run(_resume(run, detach=detach, quiet=quiet, verbose=verbose))


async def _resume(run: LoopRun, *, detach: bool, quiet: bool, verbose: bool) -> int:
    tid = run.state.task_id
    try:
        client = await tc.connect(run.config)
        inp = tc.loop_input(run.ws, run.config, tid, resumed=True)
    finally:
        if run.release:
            run.release()
    tc.ensure_workspace_worker(run.ws)
    followers = None if detach else _followers(run.ws, [tid], quiet=quiet, verbose=verbose)
    handle = await tc.open_handle(client, inp["workflow_id"])
    if handle is None:
        handle, after = await tc.start(client, inp), 0
    else:
        after = len(await tc.outcomes(handle))
        await handle.signal("resume")
    if followers is None:
        console.line(tid)
        return 0
    return await _follow([(tid, handle, after)], followers)


def _followers(ws: Workspace, tids: list[str], *, quiet: bool, verbose: bool) -> list[tc.LogFollower]:
    """Made before the workflows start (or are signalled): they print every event of the run."""
    printer = None if quiet else console.EventPrinter(with_task=len(tids) > 1, verbose=verbose)
    return [tc.LogFollower(ws, tid, printer) for tid in tids]


async def _follow(loops: list[tuple[str, Any, int]], followers: list[tc.LogFollower]) -> int:
    """Print each loop's events until its run ends; Ctrl-C / SIGTERM stop the loops (`stop --force`), as a
    local foreground loop stops on them."""
    from kiro.core.runner import combined_exit_code

    aloop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        aloop.add_signal_handler(sig, stopping.set)

    async def one(i: int) -> dict[str, Any]:
        tid, handle, after = loops[i]
        task = asyncio.create_task(tc.wait_outcome(handle, after, followers[i].poll))
        stop_wait = asyncio.create_task(stopping.wait())
        await asyncio.wait({task, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            await handle.signal("force_stop")
        stop_wait.cancel()
        outcome = await task
        followers[i].poll()
        return outcome

    results = await asyncio.gather(*(one(i) for i in range(len(loops))))

    class _O:
        def __init__(self, code: int) -> None:
            self.exit_code = code

    for (tid, _h, _a), o in zip(loops, results, strict=True):
        msg = f"{tid}: {o['status']} ({o['reason']}) - {o['message']}"
        if o.get("report"):
            msg += f"; see {o['report']}"
        if o["exit_code"] == 1:
            console.error(msg)
        else:
            console.line(msg, style="bold")
    return combined_exit_code([_O(int(o["exit_code"])) for o in results])  # type: ignore[misc]


def force_stop(ws: Workspace, cfg: Any, task_id: str) -> None:
    """`kiro loop stop --force`: signal the workflow; its segment stops the step on its worker now."""
    asyncio.run(_force_stop(ws, cfg, task_id))


async def _force_stop(ws: Workspace, cfg: Any, task_id: str) -> None:
    client = await tc.connect(cfg)
    handle = await tc.open_handle(client, tc.names(ws, cfg).workflow_id(task_id))
    if handle is None:
        console.warning(f"loop {task_id}: no open workflow; nothing to stop")
        return
    await handle.signal("force_stop")
