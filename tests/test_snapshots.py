"""Snapshots of the markdown kiro writes for people: Dashboard.md and the reports, from fixed states,
with times normalised. The expected files live in tests/snapshots/; after a deliberate change of
wording, regenerate them with `KIRO_UPDATE_SNAPSHOTS=1 pytest tests/test_snapshots.py` and review the
diff."""

from __future__ import annotations

import os
import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kiro.store import tasks
from kiro.store.state import CompletedStep, Context, CurrentStep, FailedStep, LoopState
from kiro.views import dashboard, reports

SNAPSHOTS = Path(__file__).parent / "snapshots"
NOW = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)
ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:[+-]\d\d:\d\d|Z)")


def _at(minutes_ago: float) -> str:
    return (NOW - timedelta(minutes=minutes_ago)).isoformat(timespec="milliseconds")


def _state(task_id: str, **kw: Any) -> LoopState:
    base: dict[str, Any] = {"task_id": task_id, "task_path": f"Specs/{task_id}/tasks.md", "started_at": _at(60),
                            "updated_at": _at(1)}
    base.update(kw)
    st = LoopState.model_validate(base)
    st.refresh_metrics()
    return st


def _check(name: str, text: str) -> None:
    text = ISO.sub("<TIME>", text)
    path = SNAPSHOTS / name
    if os.environ.get("KIRO_UPDATE_SNAPSHOTS"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    expected = path.read_text(encoding="utf-8")
    assert text == expected, f"{name} differs from its snapshot (KIRO_UPDATE_SNAPSHOTS=1 regenerates it)"


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "UTC")  # "today" is the machine's local day
    time.tzset()


def _loops() -> list[dashboard.Entry]:
    auth = _state("auth_feature", title="Auth feature", status="running", iteration=15, total_successes=14,
                  total_failures=1, steps_total=10, steps_done=4, updated_at=_at(0.5),
                  current_step=CurrentStep(step_id="2.3", description="Write unit tests", status="in_progress"),
                  completed_steps=[CompletedStep(step_id=str(i), description=f"Step {i}", completed_at=_at(50 - i),
                                                 duration_seconds=60.0) for i in range(1, 5)],
                  metrics={"total_duration_seconds": 480.0})
    sleeping = _state("search_index", status="sleeping", stop_reason="backoff", iteration=3, total_successes=2,
                      total_failures=1, metrics={"total_duration_seconds": 95.0},
                      current_step=CurrentStep(step_id="1.2", description="Build the index", status="waiting_retry"))
    payment = _state("payment_integration", title="Payment integration", status="paused", stop_reason="stop_hook",
                     iteration=42, total_successes=37, total_failures=5, steps_total=12, steps_done=7,
                     current_step=CurrentStep(step_id="3.1", description="Integrate payment API"),
                     metrics={"total_duration_seconds": 1320.0})
    crashed = _state("report_export", status="running", pid=4242, iteration=6, total_successes=6,
                     current_step=CurrentStep(step_id="2", description="Export to CSV", status="in_progress"),
                     metrics={"total_duration_seconds": 200.0}, updated_at=_at(30))
    capped = _state("docs_site", title="Docs site", status="max_iterations", stop_reason="max_iterations",
                    iteration=20, max_iterations=20, total_successes=12, total_failures=8,
                    report_path="Needs_Action/intervention_docs_site.md",
                    current_step=CurrentStep(step_id="4", description="Deploy"),
                    metrics={"total_duration_seconds": 3000.0})
    email = _state("email_templates", title="Email templates", status="completed", stop_reason="all_steps_done",
                   iteration=28, total_successes=27, total_failures=1, finished_at=_at(20), steps_total=9,
                   steps_done=9, report_path="Logs/completion_reports/email_templates.md",
                   metrics={"total_duration_seconds": 900.0})
    old = _state("old_task", status="completed", iteration=3, total_successes=3,
                 finished_at=(NOW - timedelta(days=2)).isoformat(), metrics={"total_duration_seconds": 30.0})
    db = _state("database_migration", title="Database migration", status="failed", stop_reason="failure_threshold",
                iteration=67, consecutive_failures=3, total_successes=40, total_failures=27,
                report_path="Needs_Action/escalation_database_migration.md",
                failed_steps=[FailedStep(step_id="5.2", description="Run migrations", failed_at=_at(3),
                                         error="Database connection errors\nTraceback ...", retry_count=2)],
                metrics={"total_duration_seconds": 2400.0})
    return [
        dashboard.Entry(auth, "running", True),
        dashboard.Entry(sleeping, "sleeping", True),
        dashboard.Entry(payment, "paused", False),
        dashboard.Entry(crashed, "interrupted", False),
        dashboard.Entry(capped, "max_iterations", False),
        dashboard.Entry(email, "completed", False),
        dashboard.Entry(old, "completed", False),
        dashboard.Entry(db, "failed", False),
    ]


def test_dashboard_snapshot() -> None:
    _check("Dashboard.md", dashboard.markdown(_loops(), NOW))


def test_empty_dashboard_snapshot() -> None:
    _check("Dashboard_empty.md", dashboard.markdown([], NOW))


def test_dashboard_of_a_real_workspace_shows_a_dead_process_as_interrupted(tmp_path: Path) -> None:
    """The state says running, but no process holds its lock: interrupted, under Paused."""
    from kiro.store.statestore import StateStore
    from kiro.store.workspace import Workspace

    ws = Workspace(tmp_path)
    store = StateStore(ws)
    store.save(_state("ghost", status="running", pid=999999, iteration=2, total_successes=2,
                      current_step=CurrentStep(step_id="3", description="Third")))
    text = dashboard.render(ws, store, {})
    assert "## Active Loops (0)" in text
    assert "## Paused (1)" in text and "🟠 INTERRUPTED (process 999999 died)" in text


def test_the_dashboard_keeps_of_the_states_it_read_only_what_it_shows(tmp_path: Path) -> None:
    """The dashboard of a process with many loops keeps the states it read from disk between renders (those
    of other processes, and of its own loops that ended), without their per-step records (issue #41:
    a second whole copy of every ended loop's state): the same Dashboard.md as from the whole states."""
    from kiro.store.statestore import StateStore
    from kiro.store.workspace import Workspace

    ws = Workspace(tmp_path)
    store = StateStore(ws)
    for e in _loops():
        store.save(e.state.model_copy(update={"context": Context(last_prompt="p" * 5000, last_response="r")}))
    disk = dashboard.DiskStates(store)
    kept = dashboard.render(ws, store, {}, NOW, disk=disk)
    assert kept == dashboard.render(ws, store, {}, NOW)  # read whole, every time
    assert "## Completed Today (1)" in kept and "## Failed (1)" in kept and "**Failed Step**: 5.2" in kept
    states = [st for _p, st in disk.read(set()) if st is not None]
    assert len(states) == len(_loops())
    assert all(not st.completed_steps and not st.context.last_prompt and len(st.failed_steps) <= 1 for st in states)
    assert kept == dashboard.render(ws, store, {}, NOW, disk=disk)  # from what it kept


def test_the_dashboard_makes_again_only_the_blocks_that_can_have_changed(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A process with a thousand loops re-rendered every loop's block each second. A loop read from its file and
    kept (`DiskStates`) and shown outside Active Loops says the same while its file and status are the same: its
    block is kept; an active one's (its duration runs), a live one's, and one whose file or status changed are
    made again. The text is the one a render from scratch makes."""
    from kiro.store.statestore import StateStore
    from kiro.store.workspace import Workspace

    ws = Workspace(tmp_path)
    store = StateStore(ws)
    loops = _loops()
    for e in loops:
        store.save(e.state)
    ghost = _state("ghost", status="running", pid=999999, iteration=2)  # its process gone: Paused, interrupted
    store.save(ghost)
    live = {"mine": _state("mine", status="running", iteration=1)}
    made: list[str] = []
    block = dashboard._block

    def counted(e: dashboard.Entry, now: datetime, section: str) -> list[str]:
        made.append(e.state.task_id)
        return block(e, now, section)

    monkeypatch.setattr(dashboard, "_block", counted)
    disk = dashboard.DiskStates(store)
    first = dashboard.render(ws, store, live, NOW, disk=disk)
    shown = len(made)
    assert "mine" in made and "ghost" in made and shown > 5
    made.clear()
    assert dashboard.render(ws, store, live, NOW, disk=disk) == first
    assert made == ["mine"]  # the others, read from their files, are not running here: kept
    assert first == dashboard.render(ws, store, live, NOW)
    changed = store.load("ghost").state
    changed.iteration = 3
    store.save(changed)  # its file changed: read and made again
    made.clear()
    again = dashboard.render(ws, store, live, NOW, disk=disk)
    assert sorted(made) == ["ghost", "mine"]
    assert again == dashboard.render(ws, store, live, NOW) != first and "**Iteration**: 3/" in again
    held = store.acquire("ghost")  # its status as shown changes (running, alive): made again, under Active Loops
    try:
        made.clear()
        now_alive = dashboard.render(ws, store, live, NOW, disk=disk)
        assert sorted(made) == ["ghost", "mine"]
        assert now_alive == dashboard.render(ws, store, live, NOW) != again and "## Active Loops (2)" in now_alive
        made.clear()
        dashboard.render(ws, store, live, NOW, disk=disk)
        assert sorted(made) == ["ghost", "mine"]  # an active loop's block is made at every render
    finally:
        store.release("ghost", held)


def _report_state() -> LoopState:
    return _state(
        "auth_feature", title="Auth feature", status="completed", iteration=6, total_successes=5, total_failures=1,
        steps_total=5, steps_done=5, finished_at=_at(0), consecutive_failures=0,
        current_step=CurrentStep(step_id="3", description="Checkpoint - ensure all tests pass"),
        completed_steps=[CompletedStep(step_id="1", description="Set up project structure", completed_at=_at(30),
                                       duration_seconds=42.5),
                         CompletedStep(step_id="2.1", description="Create the User model", completed_at=_at(20),
                                       duration_seconds=130.0)],
        failed_steps=[FailedStep(step_id="2.1", description="Create the User model", failed_at=_at(25),
                                 error="pytest: 2 failed\nE   assert 1 == 2", retry_count=0)],
        usage={"prompt_tokens": 12000, "completion_tokens": 3000, "total_tokens": 15000, "api_calls": 9,
               "cost_usd": 0.0123},
        metrics={"total_duration_seconds": 600.0})


def test_report_snapshots() -> None:
    st = _report_state()
    _check("completion_report.md", reports.completion_report(st, moved_to="Done/auth_feature/tasks.md"))
    st.status = "max_iterations"
    _check("intervention_request.md", reports.intervention_request(
        st, reason="max_iterations", detail="max_iterations 6 reached after 6 iterations"))
    st.status, st.consecutive_failures = "failed", 3
    _check("escalation.md", reports.escalation(st, reason="failure_threshold",
                                               detail="failure_threshold 3 reached (3 consecutive failures)",
                                               recent=st.failed_steps))
    _check("stop_hook.md", reports.stop_hook(st, task_id=st.task_id, reason="lunch break"))
    _check("human_request.md", reports.human_request(st, question="Which database should the User model use?"))
    _check("progress_report.md", reports.progress_report(
        st, steps=[("1", "Set up project structure", True), ("2.1", "Create the User model", True),
                   ("2.2", "Implement login", False)]))


def test_a_reports_frontmatter_reads_back_as_the_values_written() -> None:
    """The frontmatter is YAML a program reads back: characters a file name may hold (a NEL, U+0085,
    from a Windows-1252 name; a line separator; quotes; a colon; a leading dash) come back unchanged.
    PyYAML's own emitter wrote NEL inside a quoted scalar, which read back as a space; kiro writes
    through libyaml's (kiro.store.frontmatter.write)."""
    import yaml

    for name in ("a\x85b", "\x85", "x\u2028y", "it's: \"quoted\"", "- leading dash", "trail ", "é\ufeff中"):
        path = f"Done/{name}/tasks.md"
        text = reports.completion_report(_report_state().model_copy(update={"task_path": path}), moved_to=path)
        head = text.split("---\n")[1]
        assert yaml.safe_load(head)["task_path"] == path, (name, head)


def test_a_progress_report_of_a_long_file_lists_the_steps_around_the_current_one() -> None:
    """Of a file longer than PROGRESS_STEPS_LISTED steps, a progress report lists that many around
    the current step and says how many it leaves out; the counts are of the whole file."""
    from kiro.core.listeners import PROGRESS_STEPS_LISTED, _window

    n = PROGRESS_STEPS_LISTED * 4
    text = "\n".join(f"- [{'x' if i <= 2 * PROGRESS_STEPS_LISTED else ' '}] {i}. Step {i}" for i in range(1, n + 1))
    task = tasks.parse(text + "\n")
    listed = _window(task)
    assert listed.stop - listed.start == PROGRESS_STEPS_LISTED
    assert listed.start < 2 * PROGRESS_STEPS_LISTED < listed.stop  # the current step (index 600) is listed
    steps = [(s.id, s.title, s.done) for s in task.steps[listed]]
    out = reports.progress_report(_report_state(), steps=steps, done=task.done_count, total=n,
                                  before=listed.start, after=n - listed.stop)
    assert f"**Steps done**: {2 * PROGRESS_STEPS_LISTED}/{n}" in out
    assert f"_{listed.start:,} steps above not listed_" in out
    assert f"_{n - listed.stop:,} steps below not listed_" in out
    assert out.count("\n- [") == PROGRESS_STEPS_LISTED
    done = tasks.parse(text.replace("[ ]", "[x]") + "\n")
    assert _window(done) == slice(n - PROGRESS_STEPS_LISTED, n)  # all done: the last ones
    assert _window(tasks.parse("- [ ] 1. One\n")) == slice(0, 1)
