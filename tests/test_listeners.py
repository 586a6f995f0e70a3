"""The engine emits; listeners act (kiro.core.listeners): the task moved to Done/, reports, the archive,
notifiers, Dashboard.md. And executors own their prompts and their idea of done (STYLE 13, 15)."""

from __future__ import annotations

import asyncio
from typing import Any

from kiro.core.engine import Loop
from kiro.core.hooks import LoopListener
from kiro.core.runner import prepare_start, run_loops
from kiro.executors.base import ExecutorBase, StepContext, StepResult
from kiro.store import events
from kiro.store.state import LoopState
from kiro.store.workspace import Workspace as KiroWorkspace
from tests.conftest import Workspace, shell_task


class Scribe(ExecutorBase):
    """An executor of its own: its own finish instruction, and it checks boxes itself."""

    name = "scribe"
    system_template = "agent_cli.md"
    checks_boxes = True

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def finish_instruction(self, step: Any, task_path: str, **where: Any) -> str:
        return f"SCRIBE: write DONE {step.id} on the last line."

    async def run_step(self, ctx: StepContext) -> StepResult:
        self.seen.append((ctx.system_prompt, ctx.prompt))
        return StepResult("completed", summary="done")


def test_an_executor_brings_its_own_prompt_and_the_engine_sends_it(ws: Workspace) -> None:
    ws.task(shell_task(2))
    scribe = Scribe()
    run = prepare_start(KiroWorkspace(ws.root), "Specs/feature/tasks.md", task_id="s", executor=scribe)
    [outcome] = asyncio.run(run_loops([run]))
    assert outcome.exit_code == 0
    assert [p.splitlines()[-1] for _s, p in scribe.seen] == ["SCRIBE: write DONE 1 on the last line.",
                                                             "SCRIBE: write DONE 2 on the last line."]
    assert all("box" in system for system, _p in scribe.seen)  # agent_cli.md speaks of checkboxes
    assert ws.state("s")["executor"] == "scribe"


class Recorder(LoopListener):
    def __init__(self, loop: Loop) -> None:
        super().__init__(loop)
        self.kinds: list[str] = []
        self.saves = 0
        self.closed = False

    def __call__(self, event: events.Event) -> None:
        self.kinds.append(event.event)

    def saved(self, state: LoopState) -> None:
        self.saves += 1

    async def aclose(self) -> None:
        self.closed = True


def test_the_end_of_a_loop_is_listeners_reacting_in_order(ws: Workspace) -> None:
    ws.task(shell_task(2))
    run = prepare_start(KiroWorkspace(ws.root), "Specs/feature/tasks.md", task_id="e")
    seen: list[events.Event] = []
    recorders: list[Recorder] = []

    async def go() -> Any:
        from kiro import executors
        from kiro.core.listeners import standard

        loop = Loop(run, executors.create("shell", run.config, run.ws, "e"), [seen.append])
        loop.subscribe(*standard(loop))
        recorders.append(Recorder(loop))
        loop.subscribe(recorders[0])
        try:
            return await loop.run()
        finally:
            await loop.executor.aclose()
            assert run.release is not None
            run.release()

    outcome = asyncio.run(go())
    assert outcome.exit_code == 0 and outcome.report == "Logs/completion_reports/e.md"
    assert all(isinstance(e, events.Event) for e in seen)  # listeners get typed records
    tail = [e.event for e in seen][-5:]
    assert tail == ["state_changed", "stop_condition", "task_moved", "report_written", "loop_finished"]
    moved = next(e for e in seen if isinstance(e, events.TaskMoved))
    assert (moved.from_, moved.to) == ("Specs/feature/tasks.md", "Done/feature/tasks.md")
    report = (ws.root / "Logs/completion_reports/e.md").read_text()
    assert "Done/feature/tasks.md" in report  # the report names where the task went
    assert (ws.root / ".state/archive/autonomous_loop_e.json").exists()
    rec = recorders[0]
    assert rec.closed and rec.saves >= 3 and rec.kinds[-1] == "loop_finished"
    assert "## Completed Today (1)" in (ws.root / "Dashboard.md").read_text()


def test_without_the_standard_listeners_the_engine_moves_and_writes_nothing(ws: Workspace) -> None:
    """The engine itself only records the state and emits: moving, reports, archive are listeners' jobs."""
    ws.task(shell_task(1))
    run = prepare_start(KiroWorkspace(ws.root), "Specs/feature/tasks.md", task_id="bare")

    async def go() -> Any:
        from kiro import executors

        loop = Loop(run, executors.create("shell", run.config, run.ws, "bare"))
        try:
            return await loop.run()
        finally:
            assert run.release is not None
            run.release()

    outcome = asyncio.run(go())
    assert outcome.exit_code == 0 and outcome.report is None
    assert (ws.root / "Specs/feature/tasks.md").exists()
    assert not list(ws.root.glob("Logs/completion_reports/*"))
    assert ws.state("bare")["status"] == "completed"
    assert (ws.root / ".state/autonomous_loop_bare.json").exists()  # not archived



def test_the_archive_replaces_a_completed_loops_last_save_while_that_is_still_queued(
        ws: Workspace, monkeypatch: Any) -> None:
    """With other loops in the process a loop's writes are queued (kiro.fs.writer). Its last save (the report's
    path, after the completion report) and the archive that follows are queued together; the archive holds all
    that save does, so it takes the save's place as a newer save would: no journal append (and fdatasync) of a
    record the archive writes again a moment later. The archived state is the whole last save."""
    import json
    import threading

    from kiro.fs import writer
    from kiro.store.statestore import LiveJournal, StateStore

    ws.task(shell_task(2))
    run = prepare_start(KiroWorkspace(ws.root), "Specs/feature/tasks.md", task_id="q")
    appended: list[dict[str, Any]] = []
    real = LiveJournal._append

    def append(self: LiveJournal, pending: list[tuple[int, bytes]], summary: dict[str, Any]) -> None:
        appended.extend(json.loads(line) for _n, line in pending)
        real(self, pending, summary)

    monkeypatch.setattr(LiveJournal, "_append", append)
    held = threading.Event()

    class HoldWrites(LoopListener):
        """After the completion report (the save before it written), keeps the loop's write queue busy until the
        loop has finished, as a slow disk would: the last save is still queued when the archive comes."""

        def __call__(self, event: events.Event) -> None:
            if event.event == "report_written":
                self.loop.writes.flush_sync()
                self.loop.writes.submit(lambda: held.wait(30))
            elif event.event == "loop_finished":  # after the archive is queued (listeners in order)
                held.set()

    async def go() -> Any:
        from kiro import executors
        from kiro.core.listeners import standard

        loop = Loop(run, executors.create("shell", run.config, run.ws, "q"))
        loop.subscribe(*standard(loop), HoldWrites(loop))
        try:
            with writer.loop_running():  # another loop in the process: writes go to the writer threads
                return await loop.run()
        finally:
            held.set()
            await loop.executor.aclose()
            assert run.release is not None
            run.release()

    outcome = asyncio.run(go())
    assert outcome.exit_code == 0
    state = json.loads((ws.root / ".state/archive/autonomous_loop_q.json").read_text())
    assert state["status"] == "completed" and [c["step_id"] for c in state["completed_steps"]] == ["1", "2"]
    assert state["report_path"] == "Logs/completion_reports/q.md"
    assert not (ws.root / ".state/autonomous_loop_q.json").exists()
    assert appended and not any("report_path" in r["set"] for r in appended), appended
    assert StateStore(KiroWorkspace(ws.root)).load("q").state.report_path == state["report_path"]
