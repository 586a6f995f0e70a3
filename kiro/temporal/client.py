"""The CLI's side of the temporal backend: names (workspace id, queues, workflow ids), connecting, starting
and resuming `KiroLoop` workflows, `stop --force`, following a loop in the foreground, and starting the
workspace worker when none runs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.service import RPCError, RPCStatusCode

from kiro import jsonl
from kiro.errors import RunError, UserError
from kiro.store.config import Config, TemporalBackend
from kiro.store.workspace import Workspace
from kiro.temporal import codec


@dataclass(frozen=True)
class Names:
    workspace_id: str
    ws_queue: str  # the workspace worker's queue: KiroLoop/KiroStep workflow tasks, run_segment
    step_queue: str  # every `kiro worker` (step role): run_attempt

    def workflow_id(self, task_id: str) -> str:
        return f"kiro.{self.workspace_id}.{task_id}"


def backend_of(cfg: Config) -> TemporalBackend:
    assert isinstance(cfg.backend, TemporalBackend)
    return cfg.backend


def workspace_id(ws: Workspace) -> str:
    """A random id kept in `.state/workspace_id`: several workspaces can share one Temporal server."""
    path = ws.state_dir / "workspace_id"
    with contextlib.suppress(FileNotFoundError):
        text = path.read_text().strip()
        if text:
            return text
    path.parent.mkdir(parents=True, exist_ok=True)
    new = uuid.uuid4().hex[:12]
    tmp = path.with_name(f".workspace_id.{os.getpid()}")
    tmp.write_text(new + "\n")
    try:
        os.link(tmp, path)  # first writer wins
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return path.read_text().strip()


def names(ws: Workspace, cfg: Config) -> Names:
    b = backend_of(cfg)
    wid = workspace_id(ws)
    return Names(wid, f"{b.task_queue}.ws.{wid}", b.task_queue)


async def connect(cfg: Config) -> Client:
    """A client of the configured server whose payloads are sealed with the person's key
    (kiro.temporal.codec): the workers take its data converter, so every process reads and writes them."""
    b = backend_of(cfg)
    converter = codec.data_converter()
    try:
        return await asyncio.wait_for(Client.connect(b.address, namespace=b.namespace, data_converter=converter), 15)
    except (RPCError, RuntimeError, OSError, TimeoutError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise RunError(f"backend.address {b.address}: cannot reach the Temporal server ({first}); start it (e.g. "
                       f"`temporal server start-dev --db-filename temporal.db`) or correct backend.address in "
                       f"config/autonomous_loop.yaml") from None


def base_commit(ws: Workspace, cfg: Config) -> str:
    """The commit the loop's branch starts from: the project's HEAD, which must be on the remote."""
    from kiro.git import gitcli

    project = (ws.root / cfg.project_dir).resolve()
    git = gitcli.Git(project)
    head = git.run("rev-parse", "--verify", "-q", "HEAD", check=False).stdout.strip()
    if not head:
        raise UserError(f"backend: temporal needs the project ({cfg.project_dir}) in a git repository with a commit "
                        f"that its workers can fetch (docs/scale-out.md §7)")
    return head


def loop_input(ws: Workspace, cfg: Config, task_id: str, *, resumed: bool) -> dict[str, Any]:
    n = names(ws, cfg)
    b = backend_of(cfg)
    return {"task_id": task_id, "workspace": str(ws.root), "ws_queue": n.ws_queue, "step_queue": n.step_queue,
            "workflow_id": n.workflow_id(task_id), "base_commit": base_commit(ws, cfg), "resumed": resumed,
            "heartbeat_seconds": b.heartbeat_seconds, "segment_heartbeat_timeout": max(30.0, 6 * b.heartbeat_seconds)}


async def open_handle(client: Client, wid: str) -> WorkflowHandle[Any, Any] | None:
    """The loop's workflow if it is open (running or waiting for `resume`), else None."""
    handle = client.get_workflow_handle(wid)
    try:
        desc = await handle.describe()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    return handle if desc.status == WorkflowExecutionStatus.RUNNING else None


async def start(client: Client, inp: dict[str, Any]) -> WorkflowHandle[Any, Any]:
    return await client.start_workflow(
        "KiroLoop", inp, id=inp["workflow_id"], task_queue=inp["ws_queue"],
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE, id_conflict_policy=WorkflowIDConflictPolicy.FAIL)


async def outcomes(handle: WorkflowHandle[Any, Any]) -> list[dict[str, Any]]:
    status: dict[str, Any] = await handle.query("status")
    return list(status["outcomes"])


async def wait_outcome(handle: WorkflowHandle[Any, Any], after: int, on_tick: Any = None) -> dict[str, Any]:
    """The outcome of the loop's segment number `after + 1`: poll the workflow's `status` query (a server
    restart in between is waited out)."""
    while True:
        if on_tick is not None:
            on_tick()
        try:
            got = await outcomes(handle)
        except RPCError:
            got = []
        if len(got) > after:
            return got[after]
        await asyncio.sleep(0.2)


# -- the workspace worker ------------------------------------------------------------------------


def worker_lock(ws: Workspace) -> Path:
    return ws.state_dir / "temporal_worker.lock"


def workspace_worker_running(ws: Workspace) -> bool:
    """A workspace worker holds `.state/temporal_worker.lock` (asked of the kernel; the lock is not taken)."""
    from kiro.fs import locks

    return locks.is_held(worker_lock(ws))


def ensure_workspace_worker(ws: Workspace) -> None:
    """`kiro loop start|resume` on this backend: the workspace worker runs loops' engines here; start one in the
    background (Logs/temporal_worker.out) when none holds `.state/temporal_worker.lock`."""
    if workspace_worker_running(ws):
        return
    from kiro.core.backends import start_in_background

    out_path = ws.root / "Logs" / "temporal_worker.out"
    code = start_in_background(["worker", "--role", "workspace", "-w", str(ws.root)], out=out_path, cwd=ws.root,
                               ready=lambda _pid: workspace_worker_running(ws))  # (another start may win the race)
    if code is not None:
        raise RunError(f"the workspace worker exited at once (exit {code}); see {ws.relative(out_path)}")


# -- following a loop in the foreground ------------------------------------------------------------


class LogFollower:
    """Prints the loop's new events (Logs/<id>.jsonl) with the console's renderer, as a local loop does.
    Made before the workflow is started or signalled, so that none of the run's events is written
    before it looks; it goes on from the end of the last complete line, so that a line half-written
    at that moment is printed whole once it is finished."""

    def __init__(self, ws: Workspace, task_id: str, printer: Any) -> None:
        self.path = ws.event_log(task_id)
        self.printer = printer
        self.offset = _after_last_line(self.path)
        self.buf = b""

    def poll(self) -> None:
        if self.printer is None or not self.path.exists():
            return
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        self.offset += len(data)
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        for record in jsonl.records(lines):
            self.printer(record)


def _after_last_line(path: Path) -> int:
    """The offset just after the file's last newline (0 when it has none or is missing)."""
    try:
        with open(path, "rb") as fh:
            end = fh.seek(0, os.SEEK_END)
            pos = end
            while pos > 0:
                step = min(pos, 64 * 1024)
                fh.seek(pos - step)
                found = fh.read(step).rfind(b"\n")
                if found >= 0:
                    return pos - step + found + 1
                pos -= step
    except OSError:
        pass
    return 0
