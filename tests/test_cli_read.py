"""The read commands as a person or a script uses them: `--help` everywhere, `status`, `state`,
`progress`, `logs` (also `--json`, `--follow`, a torn last line), naming a loop by `--task` or
`--task-id`, finding the workspace by `-w` or `$KIRO_WORKSPACE`, and a SIGKILLed loop shown as
`interrupted` and finished by `resume`."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kiro.cli import app
from tests.conftest import Workspace, shell_task

TASK = "Specs/feature/tasks.md"
SLOW = 'echo "$KIRO_STEP_ID" >> side_effects.log; sleep 0.2'


def kiro_from(cwd: Path, ws: Workspace, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """kiro run from another folder than the workspace."""
    return subprocess.run([sys.executable, "-m", "kiro", *args], cwd=cwd, env=ws.env(**env), capture_output=True,
                          text=True, timeout=120)


def ok_json(r: subprocess.CompletedProcess[str]) -> Any:
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    return json.loads(r.stdout)


@pytest.fixture
def finished(ws: Workspace) -> str:
    ws.task(shell_task(3))
    r = ws.kiro("loop", "start", "--task", TASK, "--task-id", "done1")
    assert r.returncode == 0, r.stdout + r.stderr
    return "done1"


@pytest.fixture
def unfinished(ws: Workspace) -> str:
    ws.task(shell_task(3))
    r = ws.kiro("loop", "start", "--task", TASK, "--task-id", "half", "--max-iterations", "1")
    assert r.returncode == 4, r.stdout + r.stderr
    return "half"


# -- --help ----------------------------------------------------------------------------------------

HELP = {
    (): ["loop", "init"],
    ("loop",): ["start", "status", "state", "progress", "logs", "stop", "resume"],
    ("loop", "start"): ["--task", "--task-id", "--config", "--max-iterations", "--failure-threshold", "--timeout",
                        "--executor", "--model", "--detach", "--workspace", "exit"],
    ("loop", "resume"): ["--task-id", "--task", "--max-iterations", "--reset-failures", "--detach", "--workspace"],
    ("loop", "status"): ["--task-id", "--task", "--json", "--watch", "--workspace", "interrupted"],
    ("loop", "state"): ["--task-id", "--task", "--workspace", "JSON"],
    ("loop", "progress"): ["--task-id", "--task", "--json", "--workspace"],
    ("loop", "logs"): ["--task-id", "--task", "--follow", "--json", "--workspace"],
    ("loop", "stop"): ["--task-id", "--task", "--force", "--reason", "--all", "--save-state", "--workspace"],
    ("init",): ["--example"],
}


@pytest.mark.parametrize("command", sorted(HELP), ids=lambda c: " ".join(c) or "kiro")
def test_help_explains_each_command_and_its_key_flags(command: tuple[str, ...]) -> None:
    r = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "Usage:" in r.output
    for word in HELP[command]:
        assert word in r.output, f"`kiro {' '.join(command)} --help` does not mention {word}"


def test_help_works_as_a_subprocess_too(ws: Workspace) -> None:
    r = ws.kiro("loop", "start", "--help")
    assert r.returncode == 0 and "--max-iterations" in r.stdout


def test_status_on_an_empty_workspace_says_how_to_start(ws: Workspace) -> None:
    r = CliRunner().invoke(app, ["loop", "status", "-w", str(ws.root)])
    assert r.exit_code == 0, r.output
    assert "no loops" in r.output and "kiro loop start" in r.output
    r = CliRunner().invoke(app, ["loop", "status", "-w", str(ws.root), "--json"])
    assert r.exit_code == 0 and json.loads(r.output) == []


# -- status / state / progress ---------------------------------------------------------------------


def test_status_json_is_a_list_without_an_id_and_an_object_with_one(ws: Workspace, finished: str) -> None:
    rows = ok_json(ws.kiro("loop", "status", "--json"))
    assert isinstance(rows, list) and [r["task_id"] for r in rows] == [finished]
    assert rows[0]["status"] == "completed" and rows[0]["iteration"] == 3
    row = ok_json(ws.kiro("loop", "status", "--task-id", finished, "--json"))
    assert isinstance(row, dict)
    assert row["task_id"] == finished and row["status"] == "completed"
    assert row["steps_done"] == row["steps_total"] == 3 and row["success_rate"] == 1.0


def test_status_human_table_and_detail(ws: Workspace, finished: str) -> None:
    r = ws.kiro("loop", "status", env=ws.env(COLUMNS="200"))
    assert r.returncode == 0 and finished in r.stdout and "completed" in r.stdout
    r = ws.kiro("loop", "status", "--task-id", finished, env=ws.env(COLUMNS="200"))
    assert r.returncode == 0 and "completed" in r.stdout and "3/3" in r.stdout


def test_state_prints_the_state_file_as_json(ws: Workspace, finished: str) -> None:
    st = ok_json(ws.kiro("loop", "state", "--task-id", finished))
    assert st == ws.state(finished)  # the file itself (archived on completion), not a summary
    assert st["status"] == "completed" and [c["step_id"] for c in st["completed_steps"]] == ["1", "2", "3"]


def test_progress_json_lists_every_step_with_status_and_attempts(ws: Workspace) -> None:
    # step 2 fails once, then passes
    cmd = 'if [ "$KIRO_STEP_ID" = 2 ] && [ ! -e tried ]; then touch tried; exit 1; fi'
    ws.task(shell_task(3, cmd=cmd))
    r = ws.kiro("loop", "start", "--task", TASK, "--task-id", "p")
    assert r.returncode == 0, r.stdout + r.stderr
    data = ok_json(ws.kiro("loop", "progress", "--task-id", "p", "--json"))
    assert data["steps_done"] == data["steps_total"] == 3
    steps = {s["step_id"]: s for s in data["steps"]}
    assert list(steps) == ["1", "2", "3"]
    assert all(s["status"] == "done" for s in steps.values())
    assert [steps[i]["attempts"] for i in ("1", "2", "3")] == [1, 2, 1]
    assert all(s["duration_seconds"] is not None for s in steps.values())
    r = ws.kiro("loop", "progress", "--task-id", "p", env=ws.env(COLUMNS="200"))
    assert r.returncode == 0 and "3/3" in r.stdout


def test_progress_of_an_unfinished_loop(ws: Workspace, unfinished: str) -> None:
    data = ok_json(ws.kiro("loop", "progress", "--task-id", unfinished, "--json"))
    assert [s["status"] for s in data["steps"]] == ["done", "todo", "todo"]
    assert data["steps_done"] == 1 and data["steps_total"] == 3


# -- logs ------------------------------------------------------------------------------------------


def test_logs_json_prints_the_event_log_as_jsonl(ws: Workspace, finished: str) -> None:
    r = ws.kiro("loop", "logs", "--task-id", finished, "--json")
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in r.stdout.splitlines()]
    names = [e["event"] for e in events]
    assert names.index("loop_started") < names.index("step_started") and names[-1] == "loop_finished"
    assert names.count("step_completed") == 3
    assert all(e["task_id"] == finished and "ts" in e for e in events)
    assert events == ws.events(finished)


def test_logs_human_readable(ws: Workspace, finished: str) -> None:
    r = ws.kiro("loop", "logs", "--task-id", finished)
    assert r.returncode == 0, r.stderr
    assert f"loop {finished} started" in r.stdout and "completed" in r.stdout
    r = ws.kiro("loop", "logs", "--task-id", finished, "--json", "--tail", "1")
    assert [json.loads(x)["event"] for x in r.stdout.splitlines()] == ["loop_finished"]


def test_logs_tolerate_a_torn_last_line(ws: Workspace, finished: str) -> None:
    good = ws.events(finished)
    with open(ws.root / "Logs" / f"{finished}.jsonl", "a") as fh:
        fh.write('{"ts": "2026-01-01T00:00:00+00:00", "task_id": "done1", "iteration": 3, "ev')
    r = ws.kiro("loop", "logs", "--task-id", finished, "--json")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert [json.loads(line) for line in r.stdout.splitlines()] == good
    r = ws.kiro("loop", "logs", "--task-id", finished)
    assert r.returncode == 0 and "Traceback" not in r.stderr and f"loop {finished} started" in r.stdout
    r = ws.kiro("loop", "logs", "--task-id", finished, "--follow", timeout=30)
    assert r.returncode == 0, r.stderr


def test_logs_follow_on_a_finished_loop_returns(ws: Workspace, finished: str) -> None:
    r = ws.kiro("loop", "logs", "--task-id", finished, "--follow", "--json", timeout=30)
    assert r.returncode == 0, r.stderr
    assert [json.loads(x) for x in r.stdout.splitlines()][-1]["event"] == "loop_finished"


def test_logs_follow_a_running_loop_until_it_ends(ws: Workspace) -> None:
    ws.task(shell_task(4, cmd=SLOW))
    proc = ws.spawn("loop", "start", "--task", TASK, "--task-id", "live")
    ws.wait_for(lambda: (ws.root / "Logs/live.jsonl").stat().st_size > 0, what="the event log")
    r = ws.kiro("loop", "logs", "--task-id", "live", "--follow", "--json", timeout=60)
    assert proc.wait(timeout=60) == 0
    assert r.returncode == 0, r.stderr
    names = [json.loads(x)["event"] for x in r.stdout.splitlines()]
    assert names.count("step_completed") == 4 and names[-1] == "loop_finished"


def test_logs_follow_shows_an_event_half_written_when_it_started(ws: Workspace, unfinished: str) -> None:
    """`--follow` goes on from the last complete line it read. It once went on from the file's size
    taken afterwards: the rest of a half-written line was then read as garbage and that event was
    never shown (CI saw a step_completed go missing this way)."""
    from kiro.locks import Flock
    from kiro.workspace import Workspace as KiroWorkspace

    log = ws.root / f"Logs/{unfinished}.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    assert json.loads(lines[-1])["event"] == "loop_finished"
    earlier, last = lines[:-2], lines[-2]
    log.write_bytes(b"".join(earlier) + last[:10])  # the loop is writing its next event
    lock = Flock(KiroWorkspace(ws.root).lock_file(unfinished))
    lock.acquire(0)  # the loop's process holds its lock: the loop runs
    try:
        proc = subprocess.Popen([sys.executable, "-m", "kiro", "loop", "logs", "--task-id", unfinished, "--follow",
                                 "--json"], cwd=ws.root, env=ws.env(), stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        shown = [proc.stdout.readline() for _ in earlier]  # what was there to read has been read
        with open(log, "ab") as fh:
            fh.write(last[10:] + lines[-1])
    finally:
        lock.release()
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    names = [json.loads(x)["event"] for x in [*shown, *out.splitlines()]]
    assert names == [json.loads(x)["event"] for x in lines]


# -- naming the loop and the workspace -------------------------------------------------------------


@pytest.mark.parametrize("task_arg", [TASK, "/" + TASK])
def test_task_path_works_in_place_of_task_id(ws: Workspace, unfinished: str, task_arg: str) -> None:
    assert ok_json(ws.kiro("loop", "status", "--task", task_arg, "--json"))["task_id"] == unfinished
    assert ok_json(ws.kiro("loop", "state", "--task", task_arg))["task_id"] == unfinished
    assert ok_json(ws.kiro("loop", "progress", "--task", task_arg, "--json"))["task_id"] == unfinished
    r = ws.kiro("loop", "logs", "--task", task_arg, "--json")
    assert r.returncode == 0 and {json.loads(x)["task_id"] for x in r.stdout.splitlines()} == {unfinished}
    r = ws.kiro("loop", "resume", "--task", task_arg, "--max-iterations", "10")
    assert r.returncode == 0, r.stdout + r.stderr
    assert ws.state(unfinished)["status"] == "completed"
    # once finished and moved, the task's new place names it
    done = "Done/feature/tasks.md"
    assert ok_json(ws.kiro("loop", "status", "--task", done, "--json"))["task_id"] == unfinished


def test_workspace_flag_from_another_directory(ws: Workspace, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ws.task(shell_task(2))
    r = kiro_from(elsewhere, ws, "loop", "start", "-w", str(ws.root), "--task", TASK, "--task-id", "w1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert ws.state("w1")["status"] == "completed"
    assert not (elsewhere / ".state").exists() and not (elsewhere / "side_effects.log").exists()
    rows = ok_json(kiro_from(elsewhere, ws, "loop", "status", "-w", str(ws.root), "--json"))
    assert [r["task_id"] for r in rows] == ["w1"]
    # a relative -w, and -w after the subcommand's other options
    rel = Path("..") / ws.root.name
    row = ok_json(kiro_from(elsewhere, ws, "loop", "status", "--task-id", "w1", "--json", "-w", str(rel)))
    assert row["status"] == "completed"


def test_kiro_workspace_environment_variable(ws: Workspace, finished: str, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    rows = ok_json(kiro_from(elsewhere, ws, "loop", "status", "--json", KIRO_WORKSPACE=str(ws.root)))
    assert [r["task_id"] for r in rows] == [finished]
    r = kiro_from(elsewhere, ws, "loop", "logs", "--task-id", finished, "--json", KIRO_WORKSPACE=str(ws.root))
    assert r.returncode == 0 and "loop_finished" in r.stdout
    # without it, from elsewhere, there is nothing to see
    assert ok_json(kiro_from(elsewhere, ws, "loop", "status", "--json")) == []


def test_workspace_found_from_a_subfolder(ws: Workspace, finished: str) -> None:
    sub = ws.root / "Specs" / "deep"
    sub.mkdir(parents=True)
    rows = ok_json(kiro_from(sub, ws, "loop", "status", "--json"))
    assert [r["task_id"] for r in rows] == [finished]


# -- a loop killed with SIGKILL --------------------------------------------------------------------


def test_sigkilled_loop_shows_as_interrupted_and_resume_finishes_it(ws: Workspace) -> None:
    ws.task(shell_task(6, cmd=SLOW))
    proc = ws.spawn("loop", "start", "--task", TASK, "--task-id", "k")
    ws.wait_for(lambda: ws.state("k")["completed_steps"], what="a completed step")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    st = ws.state("k")
    assert st["status"] in ("running", "sleeping")  # what the dead process last wrote
    done_before = [c["step_id"] for c in st["completed_steps"]]

    row = ok_json(ws.kiro("loop", "status", "--task-id", "k", "--json"))
    assert row["status"] == "interrupted" and row["alive"] is False and row["pid"] is None
    assert row["hint"] == "kiro loop resume --task-id k"
    rows = ok_json(ws.kiro("loop", "status", "--json"))
    assert [(r["task_id"], r["status"]) for r in rows] == [("k", "interrupted")]
    r = ws.kiro("loop", "status", env=ws.env(COLUMNS="200"))
    assert "interrupted" in r.stdout

    r = ws.kiro("loop", "resume", "--task-id", "k")
    assert r.returncode == 0, r.stdout + r.stderr
    assert ws.state("k")["status"] == "completed"
    ran = (ws.root / "side_effects.log").read_text().split()
    assert sorted(set(ran), key=int) == [str(i) for i in range(1, 7)]
    for sid in done_before:
        assert ran.count(sid) == 1, f"step {sid} ran again after the crash"


def test_status_watch_json_streams_until_interrupted(ws: Workspace, finished: str) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "kiro", "loop", "status", "--watch", "--json", "--interval", "0.1"],
                            cwd=ws.root, env=ws.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first, second = proc.stdout.readline(), proc.stdout.readline()
        assert [r["task_id"] for r in json.loads(first)] == [finished]
        assert [r["task_id"] for r in json.loads(second)] == [finished]  # refreshed, not printed once
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and "Traceback" not in err
