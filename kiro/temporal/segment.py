"""The workspace worker's side (docs/scale-out.md §3, §8): `run_segment` runs kiro's own engine on the
workspace host, from the loop's state file, until the loop stops; each step attempt goes to a `kiro worker`
through `RemoteExecutor` (a `KiroStep` workflow). The workspace files (state, event log, task file boxes,
reports, Dashboard.md, Done/) are written by the same engine and listeners as a local run's: the workspace
worker is their only writer."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.client import Client, WorkflowFailureError
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from kiro.core import features
from kiro.core.engine import Loop
from kiro.core.guardrails import SharedLimits
from kiro.core.listeners import standard as standard_listeners
from kiro.core.runner import AlreadyFinished, prepare_resume
from kiro.errors import ExecutorError, KiroError, LockHeld
from kiro.executors.base import Executor, StepContext, StepResult
from kiro.git import checkpoints, gitcli
from kiro.store import events as ev
from kiro.store import receipts
from kiro.store.config import Config
from kiro.store.receipts import ProtectedCheck, ReviewRound, VerifyRun
from kiro.store.state import GitInfo, LoopState
from kiro.store.tasks import Step, TaskFile
from kiro.store.workspace import Workspace
from kiro.usage import Usage


class RemoteExecutor:
    """The loop's executor as the engine sees it: its prompts and idea of "done" are the real executor's;
    `run_step` runs the attempt on a `kiro worker` and returns its result (and its pushed commit)."""

    def __init__(self, inner: Executor, client: Client, inp: dict[str, Any], config: Config) -> None:
        self.inner = inner
        self.name = inner.name
        self.checks_boxes = inner.checks_boxes
        self.reads_prompt = inner.reads_prompt
        self.client = client
        self.inp = inp
        self.config = config  # the loop's config as resolved (verify included: the worker runs it)

    def billing_line(self) -> str | None:
        return self.inner.billing_line()

    def credential(self) -> str | None:
        return self.inner.credential()

    def build_prompts(self, task: TaskFile, step: Step, state: LoopState, *, workspace: Workspace, attempt: int,
                      previous_error: str | None, verify_output: str | None, verify_command: str | None,
                      continuation: str | None, task_path: str | None = None,
                      task_file: Path | None = None) -> tuple[str, str]:
        return self.inner.build_prompts(task, step, state, workspace=workspace, attempt=attempt,
                                        previous_error=previous_error, verify_output=verify_output,
                                        verify_command=verify_command or self.config.verify,
                                        continuation=continuation, task_path=task_path, task_file=task_file)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def run_step(self, ctx: StepContext) -> StepResult:
        inp, s = self.inp, ctx.state
        run_no = 1 + sum(1 for c in s.completed_steps if c.step_id == ctx.step.id)
        verify = self.config.verify if isinstance(self.config.verify, str) and self.config.verify.strip() else None
        attempt_in = {
            "task_id": ctx.task_id, "step_id": ctx.step.id, "step_key": list(ctx.step.key),
            "title": ctx.step.title or ctx.step.text, "step_run": run_no, "iteration": ctx.iteration,
            "attempt": ctx.attempt, "task_path": s.task_path, "task_text": ctx.task_path.read_text(encoding="utf-8"),
            "prompt": ctx.prompt, "system_prompt": ctx.system_prompt, "reinjected": ctx.reinjected,
            "continuation": ctx.continuation, "previous_error": ctx.previous_error,
            "verify_output": ctx.verify_output, "verify": verify, "timeout_seconds": ctx.timeout_seconds,
            "config": self.config.model_dump(mode="json"), "state": s.model_dump(mode="json"),
            "executor": self.inner.name, "base_commit": inp["base_commit"], "step_queue": inp["step_queue"],
            "heartbeat_seconds": inp["heartbeat_seconds"], "protected": self._protected(ctx),
        }
        wid = f"{inp['workflow_id']}.step.{ctx.iteration}.{ctx.attempt}"
        handle = await _retrying(lambda: self.client.start_workflow(
            "KiroStep", attempt_in, id=wid, task_queue=inp["ws_queue"],
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING))
        result_task = asyncio.create_task(_retrying(handle.result))
        cancel_task = asyncio.create_task(ctx.cancel.wait())
        try:
            await asyncio.wait({result_task, cancel_task}, return_when=asyncio.FIRST_COMPLETED)
            if not result_task.done():  # `stop --force`, SIGTERM: the worker kills the step's processes
                with contextlib.suppress(RPCError):
                    await handle.cancel()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(result_task), 30)
                return StepResult("interrupted", error="stopped while the step ran on a worker")
            try:
                res: dict[str, Any] = result_task.result()
            except WorkflowFailureError as exc:
                return StepResult("interrupted", error=f"the step's workflow ended: {exc.cause or exc}")
        finally:
            cancel_task.cancel()
            if not result_task.done():
                result_task.cancel()
        if res.get("commit"):  # the step's commit in the workspace's project, as locally (its receipt's diff stat)
            await asyncio.to_thread(_fetch_branch, ctx.workspace, self.config, ctx.task_id)
        return self._result(ctx, res)

    def _protected(self, ctx: StepContext) -> dict[str, Any] | None:
        """What the worker checks of `protected_paths` (SPEC §14): the globs, and the paths a person approved this
        step changing (Approved/ in the workspace)."""
        globs = list(self.config.protected_paths)
        if not globs:
            return None
        return {"globs": globs, "approved": receipts.approved_paths(ctx.workspace, ctx.task_id, ctx.step.id)}

    def _changed_protected(self, ctx: StepContext, check: ProtectedCheck) -> str:
        """The worker put back what the step did to protected paths and failed it: here, where a person reads,
        the proposal to approve the change (as a local loop writes it), the event, and the attempt's reason."""
        changes = [receipts.Change(path, kind) for kind, _, path in (c.partition(" ") for c in check.changed)]
        proposal = ctx.workspace.relative(receipts.propose_change(ctx.workspace, ctx.task_id, ctx.step.id, changes))
        ctx.emit(ev.ProtectedPathsChanged(step_id=ctx.step.id, changes=check.changed, proposal=proposal))
        return receipts.changed_reason(ctx.step.id, check.changed, f"{proposal} (move it to Approved/)")

    def _result(self, ctx: StepContext, res: dict[str, Any]) -> StepResult:
        if res.get("outcome") == "error":
            raise ExecutorError(str(res.get("error")))
        for record in res.get("events", []):
            ctx.emit(ev.parse({k: v for k, v in record.items() if k not in ("ts", "task_id", "iteration")}))
        tries = int(res.get("try") or 1)
        if tries > 1 or res.get("lost"):
            ctx.emit(ev.WorkerLost(step_id=ctx.step.id, tries=int(res.get("lost") or tries),
                                   worker=str(res.get("worker") or "")))
        checkpoint = None
        commit = res.get("commit")
        if commit:
            kind = ev.CheckpointRecovered if res.get("recovered") else ev.CheckpointCreated
            ctx.emit(kind(step_id=ctx.step.id, commit=commit))
            checkpoint = checkpoints.Result(commit=commit)
        usage = res.get("usage") or {}
        verify = VerifyRun.model_validate(res["verify"]) if res.get("verify") else None
        protected = ProtectedCheck.model_validate(res["protected"]) if res.get("protected") else None
        reviews = [ReviewRound.model_validate(r) for r in res.get("reviews") or []] or None
        error = res.get("error")
        if protected is not None and not protected.ok:
            error = self._changed_protected(ctx, protected)
        return StepResult(res.get("outcome", "failed"), summary=res.get("summary") or "", error=error,
                          question=res.get("question"), usage=Usage(**usage),
                          checked_by_executor=bool(res.get("checked_by_executor")),
                          stop_reason=res.get("stop_reason"), checkpoint=checkpoint, verify=verify,
                          protected=protected, reviews=reviews)


async def _retrying(call: Any) -> Any:
    """A client call that waits out a Temporal server restart instead of failing the step."""
    delay = 0.2
    while True:
        try:
            return await call()
        except RPCError:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)


class Segments:
    """The `run_segment` activity, bound to the workspace worker's Temporal client."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.loops: dict[str, Loop] = {}

    @activity.defn(name="run_segment")
    async def run_segment(self, inp: dict[str, Any]) -> dict[str, Any]:
        beat = asyncio.create_task(_heartbeat(2.0))
        try:
            return await self._segment(inp)
        finally:
            beat.cancel()

    async def _segment(self, inp: dict[str, Any]) -> dict[str, Any]:
        ws = Workspace.find(inp["workspace"])
        tid = inp["task_id"]
        try:
            run = await asyncio.to_thread(prepare_resume, ws, tid, keep_hooks=True)
        except AlreadyFinished:
            return {"status": "completed", "reason": "already_completed", "exit_code": 0, "report": None,
                    "message": f"loop {tid} is already completed"}
        except LockHeld as exc:  # an earlier try of this segment is still winding down: Temporal tries again
            raise ApplicationError(str(exc), type="LockHeld") from None
        except KiroError as exc:
            return {"status": "stopped", "reason": "error", "exit_code": exc.exit_code, "report": None,
                    "message": str(exc)}
        run.resumed = bool(inp["resumed"])
        cfg = run.config
        # The engine here does not verify: the worker did, in its clone, where the step's changes are.
        run.config = cfg.model_copy(update={"verify": None})
        st = run.state
        if st.git is None or not st.git.checkpoints:  # what the reports and `status` say of the loop's git side
            project = (ws.root / cfg.project_dir).resolve()
            base_branch = gitcli.Git(project).run("symbolic-ref", "-q", "--short", "HEAD",
                                                       check=False).stdout.strip() or None
            st.git = GitInfo(checkpoints=True, isolation="worktree", merge="manual", toplevel=str(project),
                             branch=f"kiro/{tid}", base_branch=base_branch, base_commit=inp["base_commit"])
        assert run.executor is not None
        run.features = features.standard(git=False)  # each step's commit is made and pushed by the worker that ran it
        executor = RemoteExecutor(run.executor, self.client, inp, cfg)
        cancelled = False
        try:
            loop = Loop(run, executor, None, SharedLimits(run.config))
            loop.subscribe(*standard_listeners(loop))
            self.loops[tid] = loop
            task = asyncio.create_task(loop.run())
            while True:
                try:
                    outcome = await asyncio.shield(task)
                    break
                except asyncio.CancelledError:  # the workflow cancelled this segment: `kiro loop stop --force`
                    cancelled = True
                    loop.request_stop("signal", "stopped by `kiro loop stop --force`")
        finally:
            self.loops.pop(tid, None)
            with contextlib.suppress(Exception):
                await executor.aclose()
            if run.release:
                run.release()
        if cancelled:
            raise asyncio.CancelledError()
        if outcome.status == "completed":
            await asyncio.to_thread(_fetch_branch, ws, cfg, tid)
        return {"status": str(outcome.status), "reason": outcome.reason, "exit_code": outcome.exit_code,
                "message": outcome.message, "report": outcome.report}

    def stop_all(self, why: str) -> None:
        """SIGTERM to the workspace worker: every loop it runs stops at once, state saved (as locally)."""
        for loop in list(self.loops.values()):
            loop.request_stop("signal", why)


def _fetch_branch(ws: Workspace, cfg: Config, task_id: str) -> None:
    """The loop's work, for review in the workspace's project: branch kiro/<task_id> fetched from the remote."""
    git = gitcli.Git((ws.root / cfg.project_dir).resolve())
    git.run("fetch", "-q", "origin", f"+refs/heads/kiro/{task_id}:refs/heads/kiro/{task_id}", check=False,
            timeout=300)


async def _heartbeat(seconds: float) -> None:
    while True:
        activity.heartbeat()
        await asyncio.sleep(seconds)


__all__ = ["RemoteExecutor", "Segments"]
