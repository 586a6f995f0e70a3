"""The one status vocabulary (kiro.status.Status): what the state file holds, what `status` shows,
the exit code a run ends with, and where Dashboard.md puts a loop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kiro.core import conditions
from kiro.errors import StateError
from kiro.status import RECORDED, Status
from kiro.store.state import LoopState, effective_status
from kiro.store.statestore import StateStore
from kiro.store.workspace import Workspace, locate_task
from kiro.views import dashboard, loops

# SPEC §6: the code `start`/`resume` exit with, by the status the loop ends in
SPEC_EXIT = {"completed": 0, "paused": 3, "stopped": 3, "max_iterations": 4, "timed_out": 4, "failed": 5}


def _store(tmp_path: Path) -> StateStore:
    ws = Workspace(tmp_path)
    ws.ensure_folders()
    return StateStore(ws)


def test_the_values_are_the_state_file_strings_of_spec_section_4() -> None:
    assert {str(s) for s in RECORDED} == {"pending", "running", "sleeping", "paused", "stopped", "completed",
                                          "failed", "max_iterations", "timed_out"}
    assert Status.INTERRUPTED not in RECORDED


@pytest.mark.parametrize("status", sorted(SPEC_EXIT))
def test_exit_code_follows_the_spec_table(status: str) -> None:
    assert Status(status).exit_code == SPEC_EXIT[status]


def test_every_stop_condition_carries_its_status_exit_code_except_waiting_for_a_person(tmp_path: Path) -> None:
    ws = Workspace(tmp_path)
    st = LoopState(task_id="t", task_path="Specs/t.md", iteration=5, max_iterations=5, consecutive_failures=3)
    stops = [conditions.completed("done"), conditions.stop_hook(tmp_path / ".hooks" / "x", ws),
             conditions.stopped("signal", "stopped"), conditions.max_iterations(st), conditions.timed_out(10, 11),
             conditions.guardrail("max_total_tokens", 10, 12, "budget"), conditions.failure_threshold(st),
             conditions.step_retries("1.1", 3, 2)]
    for stop in stops:
        assert isinstance(stop.status, Status)
        assert stop.exit_code == stop.status.exit_code, stop
    person = conditions.needs_action("moved to Needs_Action/")
    assert (person.status, person.exit_code) == (Status.PAUSED, 6)


def test_a_state_round_trips_with_the_same_json_string(tmp_path: Path) -> None:
    store = _store(tmp_path)
    for status in RECORDED:
        st = LoopState(task_id=f"t_{status}", task_path="Specs/t.md")
        st.transition(status, "test")
        store.save(st)
        raw = json.loads(store.path(st.task_id).read_text())
        assert raw["status"] == str(status)
        assert store.load(st.task_id).state.status is status


def test_interrupted_is_shown_never_recorded(tmp_path: Path) -> None:
    store = _store(tmp_path)
    st = LoopState(task_id="t", task_path="Specs/t.md")
    with pytest.raises(ValueError, match="never recorded"):
        st.transition(Status.INTERRUPTED)
    raw = json.loads(st.dump_json())
    raw["status"] = "interrupted"
    store.path("t").write_text(json.dumps(raw))
    with pytest.raises(StateError, match="unreadable"):  # no backup to fall back on: says so
        store.load("t")


def test_a_running_state_without_its_process_shows_interrupted_with_a_resume_hint(tmp_path: Path) -> None:
    store = _store(tmp_path)
    st = LoopState(task_id="t", task_path="Specs/t.md")
    st.transition(Status.RUNNING)
    store.save(st)
    assert effective_status(st, alive=False) is Status.INTERRUPTED
    row = loops.loop_row(store, st)  # nobody holds the lock
    assert (row["status"], row["recorded_status"]) == ("interrupted", "running")
    assert row["hint"] == "kiro loop resume --task-id t"


@pytest.mark.parametrize(("status", "hint"), [
    ("max_iterations", "kiro loop resume --task-id t --max-iterations 20"),
    ("failed", "kiro loop resume --task-id t --reset-failures"),
    ("timed_out", "kiro loop resume --task-id t --timeout SECONDS"),
    ("paused", "kiro loop resume --task-id t"),
    ("completed", None),
])
def test_the_status_row_hint_names_the_limit_to_raise(tmp_path: Path, status: str, hint: str | None) -> None:
    st = LoopState(task_id="t", task_path="Specs/t.md", max_iterations=10)
    st.transition(status)
    assert loops.loop_row(_store(tmp_path), st, alive=False)["hint"] == hint


def test_dashboard_puts_each_status_in_its_section() -> None:
    expected = {"running": "Active Loops", "sleeping": "Active Loops", "paused": "Paused", "stopped": "Paused",
                "interrupted": "Paused", "pending": "Paused", "max_iterations": "Paused", "timed_out": "Paused",
                "completed": "Completed Today", "failed": "Failed"}
    entries = [dashboard.Entry(LoopState(task_id=f"t_{value}", task_path="Specs/t.md", title=f"task {value}"),
                               Status(value), alive=Status(value).is_active)
               for value in expected]
    text = dashboard.markdown(entries)
    section = ""
    found: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("## "):
            section = line[3:].split(" (")[0]
        elif line.startswith("### Task: task "):
            found[line.removeprefix("### Task: task ").split(" ")[0]] = section
    assert found == expected
    assert "🟠 INTERRUPTED" in text and "🛑 MAX ITERATIONS" in text


def test_a_moved_and_renamed_task_file_is_found_by_the_kiro_task_id_in_its_frontmatter(tmp_path: Path) -> None:
    """kiro.store.workspace.locate_task reads frontmatter with the one reader (kiro.store.frontmatter): CRLF lines, a
    quoted id and a long frontmatter are read; a broken one, or an id kiro would not make, is no match."""
    ws = Workspace(tmp_path)
    ws.ensure_folders()
    (ws.root / "Done/other").mkdir(parents=True)
    (ws.root / "Done/other/broken.md").write_text("---\nkiro_task_id: t1\nbad: [\n---\n- [x] 1. a\n")
    (ws.root / "Done/other/wrong.md").write_text("---\nkiro_task_id: ../t1\n---\n- [x] 1. a\n")
    assert locate_task(ws, ws.root / "Specs/gone/tasks.md", "t1") == (None, None)
    notes = "".join(f"note_{i}: {'x' * 60}\r\n" for i in range(100))  # past the first 4 KiB
    moved = ws.root / "Done/other/renamed.md"
    moved.write_bytes(f"---\r\ntitle: T\r\n{notes}kiro_task_id: 't1'\r\n---\r\n- [x] 1. a\r\n".encode())
    assert locate_task(ws, ws.root / "Specs/gone/tasks.md", "t1") == ("Done", moved)
