"""Steps side by side (`parallel: N`, issue #31): open steps marked `(P)` after their number (`- [ ] 2. (P) ...`,
`- [ ] 2.1 (P) ...`) or, with `parallel_by: depends`, every open step whose `_Depends: 1.2, 3_` lines name only
done steps, run at the same time, each in its own git worktree and branch made from the loop's current commit
(kiro.git.stepbranches).

The engine stays as it is: it still takes one step at a time, in plan order, and does all the bookkeeping (the
`[-]` and `[x]` boxes, one at a time, the state, events, verify, the git checkpoint, retries and limits). What
changes is its executor: `SideBySide` (kiro.core.sidebyside) wraps it, and when the engine asks for step k it starts
the attempts at k and the steps ready after it (up to N running), each with its cwd, its box's project and its task file
copy in its own worktree. It then waits for k's attempt and brings k's work into the loop's tree (a three-way merge with
what was merged before it); the engine verifies it there and checks the box; k's checkpoint commits it. The
later attempts keep running meanwhile and are taken up when the engine gets to them. A step whose work
conflicts runs again once on the merged tree; when that conflicts too the loop waits for a person
(Needs_Action/intervention_<task_id>.md names the files).

A step the engine's features send back to its agent after its work was brought in (a reviewer's changes, SPEC
§14: kiro.core.review reviews it there, after verify, its diff against the last checkpoint being the step's own)
is taken back out of the loop's tree like a failed one, but its next attempt's worktree starts with that work
(brought in on top of the loop's current commit), so its agent makes the changes asked for, as in place.

Crash safety: `state.parallel` records each attempt's worktree, branch and how far it got; a finished attempt
is a commit on its branch (found again by its trailers when a kill came before the state said so), so a
resumed loop brings that work in instead of running the step again; an attempt killed while it ran runs again
(the step was not completed). Bringing work in writes the same files however often it is done.

Limits: an attempt is started only while the iterations left (max_iterations) cover it beside the attempts
already running, and no budget (guardrails) has run out; every attempt taken up is one iteration, as before.
What an attempt spent is added to the loop's usage when it ends (taken up or not), so the budgets count every
attempt that ended, and no attempt starts once one is spent. When the loop stops (a budget, a limit, a person),
attempts still running are ended and their worktrees removed: their steps run again later, and what they spent
so far is not counted (an agent CLI reports its usage when it ends). Finished attempts whose steps are still
open stay, recorded in the state, for the next run to take up.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kiro.core import conditions
from kiro.core.conditions import Stop
from kiro.core.hooks import Feature, LoopHandle
from kiro.store import events as ev
from kiro.store import tasks
from kiro.store.tasks import Step, TaskFile

if TYPE_CHECKING:
    from kiro.core.sidebyside import SideBySide

class Parallel(Feature):
    """`parallel: N` (more than 1): sets up `SideBySide` on the loop's executor once the loop's git is known;
    with `parallel_by: depends`, chooses the next step among those whose `_Depends:` are done."""

    def __init__(self) -> None:
        self.steps: SideBySide | None = None

    async def open(self, loop: LoopHandle) -> None:
        cfg = loop.cfg
        if cfg.parallel <= 1:
            return
        g = loop.state.git
        if g is None or not g.checkpoints or not g.toplevel:
            loop.emit(ev.LoopWarning(message=f"parallel: {cfg.parallel} needs git checkpoints (each step runs in "
                                             f"its own git worktree); the project is not in a git work tree or "
                                             f"checkpoints are off: steps run one after another"))
            return
        from kiro.core.sidebyside import Closer, SideBySide  # with it, kiro.git.stepbranches

        self.steps = SideBySide(loop, loop.executor, Path(g.worktree or g.toplevel))
        loop.executor = self.steps  # the loop's executor, run side by side
        loop.subscribe(Closer(loop, self.steps))
        await self.steps.recover()

    def choose_step(self, loop: LoopHandle, task: TaskFile, step: Step | None) -> Step | Stop | None:
        sides = self.steps
        if sides is None or step is None:
            return step
        if sides.blocked is not None:
            return sides.wait_for_person()
        if loop.cfg.parallel_by != "depends":
            return step
        now = tasks.ready(task, "depends", loop.cfg.include_optional)
        if now:
            return now[0]
        done = {s.id for s in task.steps if s.done}
        waiting = [f"{s.id} (on {', '.join(d for d in tasks.depends_on(s) if d not in done)})"
                   for s in tasks.open_leaves(task, loop.cfg.include_optional)][:5]
        return conditions.needs_action(f"no open step can start: each waits for a step that is not done "
                                       f"({'; '.join(waiting)}); fix the `_Depends:` lines, then `kiro loop resume "
                                       f"--task-id {loop.state.task_id}`", "depends_waiting")

    async def after_step(self, loop: LoopHandle, step_id: str) -> None:
        if self.steps is not None:
            self.steps.after_attempt(step_id)

    async def all_done(self, loop: LoopHandle, task: TaskFile) -> Stop | bool | None:
        if self.steps is not None:  # before the loop's own git finishes (with isolation: merges, removes its tree)
            await self.steps.clear()
        return None
