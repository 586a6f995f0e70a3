"""The temporal backend of the core API (kiro.core.api, kiro.core.backends): `kiro loop start|resume|stop
--force` make the same checks and files as locally (`kiro.core.runner.prepare_start` / `prepare_resume` run in
the calling process), then a workflow is started or signalled; in the foreground the loop's events are shown
through the caller's `Front` and its outcome returned."""

from __future__ import annotations

import asyncio
from typing import Any

from kiro.core.engine import STOP_SIGNALS, Outcome
from kiro.core.front import Front
from kiro.core.looprun import LoopRun
from kiro.status import Status
from kiro.store.statestore import StateStore
from kiro.store.workspace import Workspace
from kiro.temporal import client as tc


def preflight(ws: Workspace, config_file: Any) -> None:
    """Before `prepare_start` writes anything: the server answers and the project has a commit to branch from."""
    from kiro.store.settings import settings_for

    cfg = settings_for(ws, config_file=config_file).config
    tc.base_commit(ws, cfg)

    async def check() -> None:
        await tc.connect(cfg)

    asyncio.run(check())


class TemporalBackend:
    """`backend: temporal` (kiro.core.backends.Backend): each loop a `KiroLoop` workflow run by the
    workspace worker, which this starts when none runs; in the foreground the loop's events are printed
    from its event log until its run ends."""

    name = "temporal"
    detaches_itself = True  # a workflow needs no process of ours in the background
    unbuilt = frozenset({"--step", "--fresh", "rollback", "watch --detach"})

    def preflight(self, ws: Workspace, config: Any) -> None:
        preflight(ws, config)

    def run(self, runs: list[LoopRun], *, detach: bool, front: Front) -> list[Outcome]:
        """Loops prepared by `prepare_start`/`prepare_resume` (state written, lock held): a new workflow for
        each, or a resumed loop's open workflow signalled to continue."""
        return asyncio.run(_run(runs, detach=detach, front=front))

    def force_stop(self, store: StateStore, task_id: str, front: Front) -> None:
        """Signal the workflow; its segment stops the step on its worker now."""
        from kiro.core.backends import wait_unlocked
        from kiro.store.settings import settings_for

        if asyncio.run(_force_stop(store.ws, settings_for(store.ws).config, task_id)):
            if wait_unlocked(store, task_id, 30):
                front.line(f"loop {task_id} stopped; state saved")
        else:
            front.warning(f"loop {task_id}: no open workflow; nothing to stop")


async def _run(runs: list[LoopRun], *, detach: bool, front: Front) -> list[Outcome]:
    inputs = []
    try:
        client = await tc.connect(runs[0].config)
        for r in runs:
            inputs.append(tc.loop_input(r.ws, r.config, r.state.task_id, resumed=r.resumed))
    finally:
        for r in runs:
            if r.release:
                r.release()  # the workspace worker takes the loop's lock when it runs it
    tc.ensure_workspace_worker(runs[0].ws)
    tids = [r.state.task_id for r in runs]
    followers = None if detach else _followers(runs[0].ws, tids, front)
    loops: list[tuple[str, Any, int]] = []
    for r, inp in zip(runs, inputs, strict=True):
        handle = await tc.open_handle(client, inp["workflow_id"]) if r.resumed else None
        if handle is None:
            handle, after = await tc.start(client, inp), 0
        else:
            after = len(await tc.outcomes(handle))
            await handle.signal("resume")
        loops.append((r.state.task_id, handle, after))
    if followers is None:
        return []
    return await _follow(loops, followers)


def _followers(ws: Workspace, tids: list[str], front: Front) -> list[tc.LogFollower]:
    """Made before the workflows start (or are signalled): they show every event of the run."""
    printer = next(iter(front.listeners(len(tids))), None)
    return [tc.LogFollower(ws, tid, printer) for tid in tids]


async def _follow(loops: list[tuple[str, Any, int]], followers: list[tc.LogFollower]) -> list[Outcome]:
    """Show each loop's events until its run ends; Ctrl-C / SIGTERM / SIGHUP stop the loops (`stop --force`),
    as a local foreground loop stops on them."""
    aloop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in STOP_SIGNALS:
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
    return [Outcome(tid, Status(o["status"]), o["reason"], o["message"], int(o["exit_code"]), o.get("report"))
            for (tid, _h, _a), o in zip(loops, results, strict=True)]


async def _force_stop(ws: Workspace, cfg: Any, task_id: str) -> bool:
    client = await tc.connect(cfg)
    handle = await tc.open_handle(client, tc.names(ws, cfg).workflow_id(task_id))
    if handle is None:
        return False
    await handle.signal("force_stop")
    return True
