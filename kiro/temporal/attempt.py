"""`run_attempt`: one step attempt on a `kiro worker` (docs/scale-out.md §4, §7).

The worker has its own clone of the project. Each loop works on branch `kiro/<task_id>` in a worktree of
that clone; the step's changes travel as one commit pushed to the remote. The commit carries the trailer
`Kiro-Step-Run: <n>` (the n-th completion of that step in the loop): it is the done-marker. An attempt
whose marker is already on the branch (its worker pushed, then died before Temporal heard of it) returns
`recovered` without running anything, so a completed step never runs again, whichever worker retries it.

The executor is kiro's own (`kiro.executors.create`), run with a `StepContext` built from what the engine
on the workspace host sent: the same prompts, the same task text, the same config.

The step's evidence is gathered here, where its work is (SPEC §14): `verify` runs in the clone
(kiro.executors.verify, the engine's own function: its test counts with `verify_report`), and the protected paths
are hashed before the step and checked after it, a change put back and the attempt failed. Both travel back
with the result as typed records, for the step's receipt on the workspace host (kiro.core.evidence).

With `review:` the step is reviewed here too, before anything is committed (`_Reviewer`, with kiro.core.review's
prompt, executor and reading of the answer): a CHANGES runs the step's agent again in this clone with the reasons in
its prompt, up to `max_rounds`; a step its reviewer did not approve is not pushed, and its rounds tell the workspace
host to pause the loop (kiro.core.review's Review(remote=True)). Only approved work reaches the branch.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from kiro import executors
from kiro.core import review
from kiro.errors import ConfigError, ExecutorError, UserError
from kiro.executors.base import StepContext, StepResult
from kiro.executors.verify import run_verify, verify_failed
from kiro.git import checkpoints, gitcli
from kiro.store import events as ev
from kiro.store import receipts, tasks
from kiro.store.config import Config
from kiro.store.receipts import ProtectedCheck, ReviewRound, VerifyRun
from kiro.store.redact import Redactor
from kiro.store.state import LoopState, clip
from kiro.store.workspace import Workspace
from kiro.usage import Usage


@dataclass
class Clone:
    """A worker's own clone of the project, and its per-loop worktrees under `.kiro/worktrees/`.

    `lock`: held by what changes the clone's shared repository (fetch, worktree add and prune, push and
    the remote-tracking ref it moves), so that the attempts running side by side on this worker never
    meet on its refs. A fetch that lost such a meeting once made an attempt start from the loop's base
    commit, not its branch: its push was refused and the step ran again."""

    path: Path
    name: str
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def git(self, cwd: Path | None = None) -> gitcli.Git:
        return gitcli.Git(cwd or self.path)

    @classmethod
    def prepare(cls, path: Path, remote: str | None, name: str) -> Clone:
        path = path.expanduser().resolve()
        if not (path / ".git").exists():
            if not remote:
                raise UserError(f"--clone {path}: no git clone there; pass --remote URL to clone the project into it")
            path.parent.mkdir(parents=True, exist_ok=True)
            gitcli.Git(path.parent).run("clone", "-q", remote, str(path), timeout=600)
        elif remote:
            gitcli.Git(path).run("remote", "set-url", "origin", remote)
        exclude = path / ".git" / "info" / "exclude"
        exclude.parent.mkdir(parents=True, exist_ok=True)
        text = exclude.read_text() if exclude.exists() else ""
        if ".kiro/" not in text.split():
            exclude.write_text(text + ("" if text.endswith("\n") or not text else "\n") + ".kiro/\n")
        return cls(path, name)


class Attempts:
    """The activity of a step worker, bound to its clone."""

    def __init__(self, clone: Clone) -> None:
        self.clone = clone
        self._locks: dict[str, asyncio.Lock] = {}

    @activity.defn(name="run_attempt")
    async def run_attempt(self, inp: dict[str, Any]) -> dict[str, Any]:
        lock = self._locks.setdefault(inp["task_id"], asyncio.Lock())
        async with lock:  # a retried attempt of this loop may still be winding down here
            return await self._run(inp)

    async def _run(self, inp: dict[str, Any]) -> dict[str, Any]:
        info = activity.info()
        hb = float(inp["heartbeat_seconds"])
        beat = asyncio.create_task(_heartbeat(hb))
        try:
            tree, start = await asyncio.to_thread(self._checkout, inp)
            cfg = Config.model_validate(inp["config"])
            redact = Redactor.for_run(cfg)
            found = await asyncio.to_thread(_find_done, self.clone.git(tree), inp, start, redact)
            if found:
                return self._result(inp, "completed", summary="(recovered: a worker pushed this step, then died "
                                    "before reporting it)", commit=found, recovered=True)
            ctx, executor = self._context(inp, cfg, tree, redact)
            guard = _protected(inp, ctx, tree)
            manifest = await asyncio.to_thread(guard.snapshot) if guard is not None else None
            reviewer = _Reviewer.for_attempt(inp, cfg, ctx, start)
            spent = Usage()  # the step's runs and its reviewer's: all count in the loop's
            try:
                while True:
                    result = await _until_cancelled(executor.run_step(ctx), ctx, executor)
                    result.redact(redact)
                    spent.add(result.usage)
                    result = await self._evidence(inp, ctx, result, guard, manifest)
                    if reviewer is None or not result.ok:
                        break
                    reason = await reviewer.review(ctx, result.verify, spent)
                    if reason is None:  # approved, or the reviewer gave up: the host pauses the loop
                        break
                    _again(inp, ctx, executor, reason)  # SPEC §14: the step's agent again, with the reasons
            finally:
                for each in (executor, *([reviewer.executor] if reviewer is not None else [])):
                    with contextlib.suppress(Exception):
                        await each.aclose()
            result.usage = spent
            if reviewer is not None and reviewer.rounds:
                result.reviews = reviewer.rounds
            events: list[dict[str, Any]] = list(ctx._collected)  # type: ignore[attr-defined]
            commit = None
            if result.ok and (reviewer is None or reviewer.approved):
                commit = await asyncio.to_thread(self._commit_and_push, inp, tree, redact)
                if commit.startswith("recovered:"):
                    return self._result(inp, "completed", summary=result.summary, commit=commit.split(":", 1)[1],
                                        recovered=True, events=events, usage=result.usage)
            return self._result(inp, result.outcome, summary=result.summary, error=result.error,
                                question=result.question, usage=result.usage, stop_reason=result.stop_reason,
                                checked=result.checked_by_executor, commit=commit, events=events,
                                attempt=info.attempt, verify=result.verify, protected=result.protected,
                                reviews=result.reviews)
        except (ExecutorError, UserError, ConfigError) as exc:
            raise ApplicationError(str(exc), type=type(exc).__name__, non_retryable=True) from None
        except gitcli.GitError as exc:
            raise ApplicationError(f"git on worker {self.clone.name}: {exc}", type="GitError") from None
        finally:
            beat.cancel()

    def _result(self, inp: dict[str, Any], outcome: str, *, summary: str = "", error: str | None = None,
                question: str | None = None, usage: Usage | None = None, stop_reason: str | None = None,
                checked: bool = False, commit: str | None = None, recovered: bool = False,
                events: list[dict[str, Any]] | None = None, attempt: int | None = None,
                verify: VerifyRun | None = None, protected: ProtectedCheck | None = None,
                reviews: list[ReviewRound] | None = None) -> dict[str, Any]:
        u = usage or Usage()
        return {"outcome": outcome, "summary": summary, "error": error, "question": question,
                "usage": {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
                          "total_tokens": u.total_tokens, "api_calls": u.api_calls, "cost_usd": u.cost_usd},
                "stop_reason": stop_reason, "checked_by_executor": checked, "commit": commit, "recovered": recovered,
                "events": events or [], "worker": self.clone.name, "host": socket.gethostname(),
                "try": attempt if attempt is not None else activity.info().attempt,
                "verify": verify.model_dump(mode="json") if verify is not None else None,
                "protected": protected.model_dump(mode="json") if protected is not None else None,
                "reviews": [r.model_dump(mode="json") for r in reviews] if reviews else None}

    async def _evidence(self, inp: dict[str, Any], ctx: StepContext, result: StepResult,
                        guard: receipts.Protected | None, manifest: dict[str, str] | None) -> StepResult:
        """Verify, in the clone, then the protected paths: the attempt failed when either says so."""
        verify = inp.get("verify")
        if result.ok and verify:
            result.verify = await run_verify(verify, ctx)
            if not result.verify.passed:
                result = verify_failed(ctx, result.verify, result)
        if result.ok and guard is not None and manifest is not None:
            result.protected = check = ProtectedCheck(globs=guard.globs, files=len(manifest),
                                                      approved=sorted(inp["protected"]["approved"]))
            changes = await asyncio.to_thread(_put_back, guard, manifest, check.approved)
            if changes:  # the workspace host proposes them to a person and says why (kiro.temporal.segment)
                check.ok, check.changed = False, [str(c) for c in changes]
                result = StepResult("failed", summary=result.summary, usage=result.usage, verify=result.verify,
                                    protected=check, error="the step changed protected paths")
        return result

    # -- git -------------------------------------------------------------------------------------

    def _checkout(self, inp: dict[str, Any]) -> tuple[Path, str]:
        """The loop's worktree at the branch's tip on the remote (or the loop's base commit), with
        whatever an earlier attempt on this machine left there wiped."""
        with self.clone.lock:
            return self._checkout_locked(inp)

    def _checkout_locked(self, inp: dict[str, Any]) -> tuple[Path, str]:
        tid, branch = inp["task_id"], f"kiro/{inp['task_id']}"
        main = self.clone.git()
        remote_ref = f"refs/remotes/origin/{branch}"
        if _fetch_branch(main, branch, remote_ref):
            start = main.out("rev-parse", remote_ref)
        else:
            base = inp["base_commit"]
            if not main.ok("cat-file", "-e", f"{base}^{{commit}}"):
                main.run("fetch", "-q", "origin", timeout=300)
            if not main.ok("cat-file", "-e", f"{base}^{{commit}}"):
                raise UserError(f"the loop's base commit {base[:12]} is not on the remote; push the workspace "
                                f"project's branch first (git push)")
            start = base
        tree = self.clone.path / ".kiro" / "worktrees" / tid
        if not (tree / ".git").exists():
            main.run("worktree", "prune", check=False)
            if tree.exists():
                import shutil

                shutil.rmtree(tree)
            tree.parent.mkdir(parents=True, exist_ok=True)
            main.run("worktree", "add", "-q", "--detach", str(tree), start)
        wt = self.clone.git(tree)
        wt.run("checkout", "-q", "--detach", start)
        wt.run("reset", "-q", "--hard", start)
        wt.run("clean", "-q", "-fd")
        return tree, start

    def _commit_and_push(self, inp: dict[str, Any], tree: Path, redact: Redactor) -> str:
        wt = self.clone.git(tree)
        msg = checkpoints.step_message(inp["task_id"], inp["step_id"], inp["title"], int(inp["iteration"]),
                                       redact.text)
        msg += f"Kiro-Step-Run: {inp['step_run']}\n"
        sha = checkpoints.commit_files(wt, sorted(checkpoints.scan(wt, [":/"]).changed), msg, allow_empty=True)
        assert sha is not None
        with self.clone.lock:
            return self._push_locked(inp, wt, sha, redact)

    def _push_locked(self, inp: dict[str, Any], wt: gitcli.Git, sha: str, redact: Redactor) -> str:
        push = wt.run("push", "-q", "origin", f"HEAD:refs/heads/kiro/{inp['task_id']}", check=False, timeout=300)
        if push.returncode == 0:
            return sha
        # Someone else moved the branch: another worker that ran this same attempt (this one was presumed
        # dead) pushed first. Its push is the step; ours is dropped.
        main = self.clone.git()
        remote_ref = f"refs/remotes/origin/kiro/{inp['task_id']}"
        with contextlib.suppress(gitcli.GitError):  # then nothing is found: the push's own error says why
            _fetch_branch(main, f"kiro/{inp['task_id']}", remote_ref)
        found = _find_done(main, inp, remote_ref, redact)
        if found:
            return "recovered:" + found
        raise gitcli.GitError(f"push of kiro/{inp['task_id']} failed: {(push.stderr or '').strip()[-300:]}")

    # -- the executor ----------------------------------------------------------------------------

    def _context(self, inp: dict[str, Any], cfg: Config, tree: Path,
                 redact: Redactor) -> tuple[StepContext, Any]:
        """The attempt's StepContext, with a scratch workspace on this machine holding the task file as
        the engine read it (an agent told to read or check it can)."""
        scratch = Workspace(self.clone.path / ".kiro" / "ws" / inp["task_id"])
        task_path = scratch.root / inp["task_path"]
        task_path.parent.mkdir(parents=True, exist_ok=True)
        task_path.write_text(inp["task_text"], encoding="utf-8")
        task = tasks.load(task_path)
        step = task.find(tuple(inp["step_key"])) or task.find(inp["step_id"])
        if step is None:
            raise UserError(f"step {inp['step_id']} is not in the task text the worker received")
        state = LoopState.model_validate(inp["state"])
        executor = executors.create(inp["executor"], cfg, scratch, inp["task_id"])
        collected: list[dict[str, Any]] = []

        def emit(event: Any = None, /, **fields: Any) -> None:
            if isinstance(event, str):
                collected.append({"event": event, **fields})
            elif event is not None:
                collected.append(event.to_record())

        async def sleep(seconds: float) -> str | None:
            await asyncio.sleep(seconds)
            return None

        ctx = StepContext(
            task_id=inp["task_id"], workspace=scratch, project_dir=tree, task_path=task_path, task=task, step=step,
            iteration=int(inp["iteration"]), attempt=int(inp["attempt"]), prompt=inp["prompt"],
            system_prompt=inp["system_prompt"], reinjected=bool(inp["reinjected"]), continuation=inp["continuation"],
            previous_error=inp["previous_error"], verify_output=inp["verify_output"],
            timeout_seconds=float(inp["timeout_seconds"]), config=cfg, state=state, cancel=asyncio.Event(),
            emit=emit, sleep=sleep, redact=redact)
        ctx._collected = collected  # type: ignore[attr-defined]
        return ctx, executor


async def _until_cancelled(run: Any, ctx: StepContext, executor: Any) -> StepResult:
    """Run `run` (an executor's `run_step`) to its end; the loop's `stop --force` (this activity cancelled) ends
    the step's processes now (`ctx.cancel`), then cancels the attempt."""
    task = asyncio.create_task(run)
    cancelled = False
    while True:
        try:
            result: StepResult = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            cancelled = True
            ctx.cancel.set()
    if cancelled:
        raise asyncio.CancelledError()
    return result


def _again(inp: dict[str, Any], ctx: StepContext, executor: Any, reason: str) -> None:
    """`ctx` for the step's next run in the same clone after a reviewer's changes: the prompt the engine would
    build with the reasons as the step's last error (as a local loop's reopened step gets), the task file as the
    engine sent it (the box the agent checked is open again)."""
    ctx.task_path.write_text(inp["task_text"], encoding="utf-8")
    ctx.attempt += 1
    ctx.previous_error = reason
    ctx.system_prompt, ctx.prompt = executor.build_prompts(
        ctx.task, ctx.step, ctx.state, workspace=ctx.workspace, attempt=ctx.attempt, previous_error=reason,
        verify_output=None, verify_command=inp.get("verify"), continuation=None, task_file=ctx.task_path)
    ctx.continuation = None
    ctx.redacted()


@dataclass
class _Reviewer:
    """SPEC §14 `review:` where the step's work is: after verify and the protected paths, before the commit, the
    loop's reviewer (kiro.core.review's prompt, executor and reading of its answer) reviews the step's diff in the
    clone. Each round becomes an event (replayed on the workspace host) and a ReviewRound on the result."""

    cfg: Config
    base: str | None
    first: int  # the rounds the step's record holds already (an earlier pause): this attempt's go on from them
    executor: Any
    rounds: list[ReviewRound] = field(default_factory=list)
    approved: bool = False

    @classmethod
    def for_attempt(cls, inp: dict[str, Any], cfg: Config, ctx: StepContext, start: str) -> _Reviewer | None:
        """The attempt's reviewer, or None when its step is not reviewed (no `review:`, or `when` passes it by)."""
        rv = cfg.review
        if rv is None or not review.applies(rv.when, ctx.step, ctx.task, cfg.include_optional):
            return None
        rec = ctx.state.steps.get(ctx.step.id)
        return cls(cfg, review.review_base(ctx.state, rv.when, start), len(rec.reviews) if rec is not None else 0,
                   review.reviewer_executor(cfg, ctx.workspace, ctx.task_id))

    @property
    def counted(self) -> int:
        return sum(1 for r in self.rounds if r.verdict == "changes")

    async def review(self, ctx: StepContext, verify: VerifyRun | None, spent: Usage) -> str | None:
        """One review of the step's work as it is now: None when approved, or when the loop must pause (the
        reviewer still asks for changes after max_rounds, or gave no answer kiro could read, twice); else the
        reasons for the step's next run."""
        rv = self.cfg.review
        assert rv is not None
        who = review.reviewer_name(self.cfg)
        base = self.base or await asyncio.to_thread(review.head_commit, ctx.project_dir)
        diff = await asyncio.to_thread(review.diff_since, ctx.workspace, ctx.project_dir, ctx.task_path, base)
        prompt = ctx.redact.text(review.review_prompt(ctx.step, ctx.task_path, ctx.state.task_path, rv.when, diff,
                                                      base, verify))
        last: ReviewRound | None = None
        for _ in range(review.TRIES):
            number = self.first + len(self.rounds) + 1
            ctx.emit(ev.ReviewStarted(step_id=ctx.step.id, round=number, reviewer=who))
            kept = await asyncio.to_thread(review.keep, self.cfg, ctx.workspace, ctx.task_id, ctx.project_dir,
                                           ctx.task_path)
            rctx = StepContext(
                task_id=ctx.task_id, workspace=ctx.workspace, project_dir=ctx.project_dir, task_path=ctx.task_path,
                task=ctx.task, step=ctx.step, iteration=ctx.iteration, attempt=number, prompt=prompt,
                system_prompt="", reinjected=False, continuation=None, previous_error=None, verify_output=None,
                timeout_seconds=self.cfg.step_timeout_seconds, config=self.executor.config, state=ctx.state,
                cancel=ctx.cancel, emit=ctx.emit, sleep=ctx.sleep, redact=ctx.redact)
            began = time.monotonic()
            result = await _until_cancelled(self.executor.run_step(rctx), rctx, self.executor)
            seconds = time.monotonic() - began
            result.redact(ctx.redact)
            spent.add(result.usage)
            changed = await asyncio.to_thread(review.put_back, *kept) if kept is not None else []
            last = review.round_of(number, who, result, seconds, changed).model_copy(update={"log": None})
            self.rounds.append(last)  # the round's log stays on the worker
            if last.verdict == "approve":
                ctx.emit(ev.ReviewApproved(step_id=ctx.step.id, round=number, reviewer=who))
                self.approved = True
                return None
            if last.verdict == "changes":
                break
            ctx.emit(ev.LoopWarning(message=f"review of step {ctx.step.id} (round {number}, {who}) failed: "
                                            f"{review.first_line(last.reasons)}"))
        assert last is not None
        if last.verdict != "changes":
            return None
        paused = self.counted >= rv.max_rounds
        ctx.emit(ev.ReviewRequestedChanges(step_id=ctx.step.id, round=last.round, reviewer=who,
                                           reasons=clip(last.reasons, 1000), paused=paused))
        return None if paused else review.changes_reason(who, last)


async def _heartbeat(seconds: float) -> None:
    while True:
        activity.heartbeat()
        await asyncio.sleep(seconds)


def _fetch_branch(main: gitcli.Git, branch: str, remote_ref: str) -> bool:
    """Fetch the loop's branch into `remote_ref`: True when the remote has it, False when it does not
    (the loop's first step: it starts from the base commit). Any other failure is tried again, then a
    GitError: starting from the base commit when the branch exists would run the step on old files."""
    for attempt in range(3):
        r = main.run("fetch", "-q", "origin", f"+refs/heads/{branch}:{remote_ref}", check=False, timeout=300)
        if r.returncode == 0:
            return True
        if "couldn't find remote ref" in (r.stderr or ""):
            return False
        time.sleep(0.2 * (attempt + 1))
    raise gitcli.GitError(f"fetch of {branch} failed: {(r.stderr or '').strip()[-300:]}")


def _find_done(git: gitcli.Git, inp: dict[str, Any], tip: str, redact: Redactor) -> str | None:
    """The commit on `tip` that completed this run of this step, if a worker pushed it already."""
    base = inp["base_commit"]
    rng = [tip, f"^{base}"] if base and tip != base else [tip]
    out = git.run("log", "--format=%H%x1f%B%x1e", f"--grep=Kiro-Step-Run: {inp['step_run']}", *rng,
                  check=False).stdout
    written = checkpoints.step_id_written(inp["task_id"], inp["step_id"], redact.text)
    for record in out.split("\x1e"):
        sha, _, body = record.strip().partition("\x1f")
        t = checkpoints.trailers(body)
        if (t.get("Kiro-Task-Id") == inp["task_id"] and t.get("Kiro-Step-Id") == written
                and t.get("Kiro-Step-Run") == str(inp["step_run"])):
            return sha.strip()
    return None


def _protected(inp: dict[str, Any], ctx: StepContext, tree: Path) -> receipts.Protected | None:
    """The loop's protected paths in the worker's tree (their copies kept in the attempt's scratch workspace),
    or None when it has none."""
    wanted = inp.get("protected")
    if not wanted or not wanted.get("globs"):
        return None
    return receipts.Protected(ctx.workspace, inp["task_id"], tree, [str(g) for g in wanted["globs"]])


def _put_back(guard: receipts.Protected, manifest: dict[str, str], approved: list[str]) -> list[receipts.Change]:
    """What the step did to protected paths (but what a person approved), put back before anything is committed."""
    changes = [c for c in guard.changes(manifest) if c.path not in set(approved)]
    if changes:
        guard.put_back(manifest, changes)
    return changes
