"""The read commands as a person or a script uses them: `--help` everywhere, `status`, `state`,
`progress`, `logs` (also `--json`, `--follow`, a torn last line), naming a loop by `--task` or
`--task-id`, finding the workspace by `-w` or `$KIRO_WORKSPACE`, and a SIGKILLed loop shown as
`interrupted` and finished by `resume`.

The read commands run in the test's process (`ws.run`); a loop runs as a process of its own (`ws.kiro`,
`ws.spawn`). Tests that only read a finished loop, or the three loops of `loops`, share one workspace per
module (`done`, `shared_loops`): each made by running real loops once, not once per test."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kiro.cli import app
from tests import cli_forkserver
from tests.conftest import Kept, Workspace, new_workspace, shell_task

TASK = "Specs/feature/tasks.md"
SLOW = 'echo "$KIRO_STEP_ID" >> side_effects.log; sleep 0.2'


def kiro_from(cwd: Path, ws: Workspace, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """A read command run from another folder than the workspace (in this process)."""
    return ws.run(*args, cwd=cwd, env=ws.env(**env))


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


@pytest.fixture(scope="module")
def done(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    """A workspace with one loop, `done1`, finished (3 steps), shared by the tests of this module that only
    read it."""
    ws = new_workspace(tmp_path_factory.mktemp("done") / "vault")
    ws.task(shell_task(3))
    r = ws.kiro("loop", "start", "--task", TASK, "--task-id", "done1")
    assert r.returncode == 0, r.stdout + r.stderr
    return ws


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


def test_status_json_is_a_list_without_an_id_and_an_object_with_one(done: Workspace) -> None:
    ws, finished = done, "done1"
    rows = ok_json(ws.run("loop", "status", "--json"))
    assert isinstance(rows, list) and [r["task_id"] for r in rows] == [finished]
    assert rows[0]["status"] == "completed" and rows[0]["iteration"] == 3
    row = ok_json(ws.run("loop", "status", "--task-id", finished, "--json"))
    assert isinstance(row, dict)
    assert row["task_id"] == finished and row["status"] == "completed"
    assert row["steps_done"] == row["steps_total"] == 3 and row["success_rate"] == 1.0


def test_status_human_table_and_detail(done: Workspace) -> None:
    ws, finished = done, "done1"
    r = ws.run("loop", "status", env=ws.env(COLUMNS="200"))
    assert r.returncode == 0 and finished in r.stdout and "completed" in r.stdout
    r = ws.run("loop", "status", "--task-id", finished, env=ws.env(COLUMNS="200"))
    assert r.returncode == 0 and "completed" in r.stdout and "3/3" in r.stdout


def test_state_prints_the_state_file_as_json(done: Workspace) -> None:
    ws, finished = done, "done1"
    st = ok_json(ws.run("loop", "state", "--task-id", finished))
    assert st == ws.state(finished)  # the file itself (archived on completion), not a summary
    assert st["status"] == "completed" and [c["step_id"] for c in st["completed_steps"]] == ["1", "2", "3"]


def test_progress_json_lists_every_step_with_status_and_attempts(ws: Workspace) -> None:
    # step 2 fails once, then passes
    cmd = 'if [ "$KIRO_STEP_ID" = 2 ] && [ ! -e tried ]; then touch tried; exit 1; fi'
    ws.task(shell_task(3, cmd=cmd))
    r = ws.kiro("loop", "start", "--task", TASK, "--task-id", "p")
    assert r.returncode == 0, r.stdout + r.stderr
    data = ok_json(ws.run("loop", "progress", "--task-id", "p", "--json"))
    assert data["steps_done"] == data["steps_total"] == 3
    steps = {s["step_id"]: s for s in data["steps"]}
    assert list(steps) == ["1", "2", "3"]
    assert all(s["status"] == "done" for s in steps.values())
    assert [steps[i]["attempts"] for i in ("1", "2", "3")] == [1, 2, 1]
    assert all(s["duration_seconds"] is not None for s in steps.values())
    r = ws.run("loop", "progress", "--task-id", "p", env=ws.env(COLUMNS="200"))
    assert r.returncode == 0 and "3/3" in r.stdout


def test_progress_of_an_unfinished_loop(ws: Workspace, unfinished: str) -> None:
    data = ok_json(ws.run("loop", "progress", "--task-id", unfinished, "--json"))
    assert [s["status"] for s in data["steps"]] == ["done", "todo", "todo"]
    assert data["steps_done"] == 1 and data["steps_total"] == 3


# -- logs ------------------------------------------------------------------------------------------


def test_logs_json_prints_the_event_log_as_jsonl(done: Workspace) -> None:
    ws, finished = done, "done1"
    r = ws.run("loop", "logs", "--task-id", finished, "--json")
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in r.stdout.splitlines()]
    names = [e["event"] for e in events]
    assert names.index("loop_started") < names.index("step_started") and names[-1] == "loop_finished"
    assert names.count("step_completed") == 3
    assert all(e["task_id"] == finished and "ts" in e for e in events)
    assert events == ws.events(finished)


def test_logs_human_readable(done: Workspace) -> None:
    ws, finished = done, "done1"
    r = ws.run("loop", "logs", "--task-id", finished)
    assert r.returncode == 0, r.stderr
    assert f"loop {finished} started" in r.stdout and "completed" in r.stdout
    r = ws.run("loop", "logs", "--task-id", finished, "--json", "--tail", "1")
    assert [json.loads(x)["event"] for x in r.stdout.splitlines()] == ["loop_finished"]


def test_logs_tolerate_a_torn_last_line(ws: Workspace, finished: str) -> None:
    good = ws.events(finished)
    with open(ws.root / "Logs" / f"{finished}.jsonl", "a") as fh:
        fh.write('{"ts": "2026-01-01T00:00:00+00:00", "task_id": "done1", "iteration": 3, "ev')
    r = ws.run("loop", "logs", "--task-id", finished, "--json")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert [json.loads(line) for line in r.stdout.splitlines()] == good
    r = ws.run("loop", "logs", "--task-id", finished)
    assert r.returncode == 0 and "Traceback" not in r.stderr and f"loop {finished} started" in r.stdout
    r = ws.kiro("loop", "logs", "--task-id", finished, "--follow", timeout=30)
    assert r.returncode == 0, r.stderr


def test_logs_follow_on_a_finished_loop_returns(done: Workspace) -> None:
    ws, finished = done, "done1"
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
    from kiro.fs.locks import Flock
    from kiro.store.workspace import Workspace as KiroWorkspace

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
    assert ok_json(ws.run("loop", "status", "--task", task_arg, "--json"))["task_id"] == unfinished
    assert ok_json(ws.run("loop", "state", "--task", task_arg))["task_id"] == unfinished
    assert ok_json(ws.run("loop", "progress", "--task", task_arg, "--json"))["task_id"] == unfinished
    r = ws.run("loop", "logs", "--task", task_arg, "--json")
    assert r.returncode == 0 and {json.loads(x)["task_id"] for x in r.stdout.splitlines()} == {unfinished}
    r = ws.kiro("loop", "resume", "--task", task_arg, "--max-iterations", "10")
    assert r.returncode == 0, r.stdout + r.stderr
    assert ws.state(unfinished)["status"] == "completed"
    # once finished and moved, the task's new place names it
    done = "Done/feature/tasks.md"
    assert ok_json(ws.run("loop", "status", "--task", done, "--json"))["task_id"] == unfinished


def test_workspace_flag_from_another_directory(ws: Workspace, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ws.task(shell_task(2))
    r = cli_forkserver.run(["loop", "start", "-w", str(ws.root), "--task", TASK, "--task-id", "w1"], cwd=elsewhere,
                           env=ws.env(), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert ws.state("w1")["status"] == "completed"
    assert not (elsewhere / ".state").exists() and not (elsewhere / "side_effects.log").exists()
    rows = ok_json(kiro_from(elsewhere, ws, "loop", "status", "-w", str(ws.root), "--json"))
    assert [r["task_id"] for r in rows] == ["w1"]
    # a relative -w, and -w after the subcommand's other options
    rel = Path("..") / ws.root.name
    row = ok_json(kiro_from(elsewhere, ws, "loop", "status", "--task-id", "w1", "--json", "-w", str(rel)))
    assert row["status"] == "completed"


def test_kiro_workspace_environment_variable(done: Workspace, tmp_path: Path) -> None:
    ws, finished = done, "done1"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    rows = ok_json(kiro_from(elsewhere, ws, "loop", "status", "--json", KIRO_WORKSPACE=str(ws.root)))
    assert [r["task_id"] for r in rows] == [finished]
    r = kiro_from(elsewhere, ws, "loop", "logs", "--task-id", finished, "--json", KIRO_WORKSPACE=str(ws.root))
    assert r.returncode == 0 and "loop_finished" in r.stdout
    # without it, from elsewhere, there is nothing to see
    assert ok_json(kiro_from(elsewhere, ws, "loop", "status", "--json")) == []


def test_workspace_found_from_a_subfolder(done: Workspace) -> None:
    ws, finished = done, "done1"
    sub = ws.root / "Done" / "feature"  # the finished task's folder, two levels down
    assert sub.is_dir()
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

    row = ok_json(ws.run("loop", "status", "--task-id", "k", "--json"))
    assert row["status"] == "interrupted" and row["alive"] is False and row["pid"] is None
    assert row["hint"] == "kiro loop resume --task-id k"
    rows = ok_json(ws.run("loop", "status", "--json"))
    assert [(r["task_id"], r["status"]) for r in rows] == [("k", "interrupted")]
    r = ws.run("loop", "status", env=ws.env(COLUMNS="200"))
    assert "interrupted" in r.stdout

    r = ws.kiro("loop", "resume", "--task-id", "k")
    assert r.returncode == 0, r.stdout + r.stderr
    assert ws.state("k")["status"] == "completed"
    ran = (ws.root / "side_effects.log").read_text().split()
    assert sorted(set(ran), key=int) == [str(i) for i in range(1, 7)]
    for sid in done_before:
        assert ran.count(sid) == 1, f"step {sid} ran again after the crash"


def test_status_watch_json_streams_until_interrupted(ws: Workspace, finished: str) -> None:
    proc = ws.spawn("loop", "status", "--watch", "--json", "--interval", "0.1")  # its output: a file
    try:
        lines = ws.wait_for(lambda: ws.output(proc).splitlines()[:2] if ws.output(proc).count("\n") >= 2 else None,
                            what="two refreshes")
        assert [[r["task_id"] for r in json.loads(line)] for line in lines] == [[finished]] * 2  # refreshed
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 0, ws.output(proc)  # Ctrl-C ends it
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in ws.output(proc)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_status_watch_json_ends_on_a_ctrl_c_python_lost(capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C raised inside a finaliser is printed as "Exception ignored" and lost: the watch still ends at its
    next turn, not refreshing for ever (a CI run's `status --watch --json` did not end within 30 s of SIGINT)."""
    import threading

    from kiro.views import console

    class InterruptedWhileCollected:
        def __del__(self) -> None:
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # to this thread: handled in this loop
            for _ in range(1_000_000):  # a loop's backward jumps: where Python runs the signal's handler
                pass

    calls = 0

    def data() -> list[int]:
        nonlocal calls
        calls += 1
        assert calls <= 3, "the watch went on after Ctrl-C"
        if calls == 2:
            InterruptedWhileCollected()  # collected at once, the KeyboardInterrupt raised in its __del__
        return [calls]

    before = signal.getsignal(signal.SIGINT)  # Python's own; under pytest-xdist's workers: ignored
    console.watch_json(data, 0.01)
    assert capsys.readouterr().out.splitlines() == ["[1]", "[2]"]
    assert signal.getsignal(signal.SIGINT) is before  # the handler the watch found is back


# -- status reads each loop's summary --------------------------------------------------------------


def three_loops(ws: Workspace) -> Workspace:
    """Three loops: one completed (archived), one stopped at max_iterations, one paused by its hook."""
    ws.task(shell_task(3))
    assert ws.kiro("loop", "start", "--task", TASK, "--task-id", "done1").returncode == 0
    ws.task(shell_task(3), rel="Specs/other/tasks.md")
    assert ws.kiro("loop", "start", "--task", "Specs/other/tasks.md", "--task-id", "half",
                   "--max-iterations", "1").returncode == 4
    ws.task(shell_task(2), rel="Specs/third/tasks.md")
    (ws.root / ".hooks" / "stop_autonomous_loop_held.md").write_text("stop\n")
    assert ws.kiro("loop", "start", "--task", "Specs/third/tasks.md", "--task-id", "held").returncode == 3
    return ws


@pytest.fixture(scope="module")
def kept_loops(tmp_path_factory: pytest.TempPathFactory) -> Kept:
    return Kept(tmp_path_factory.mktemp("kept_loops"), three_loops)


@pytest.fixture
def loops(kept_loops: Kept) -> Iterator[Workspace]:
    """The three loops, for a test that changes them: lent to it and put back after it (conftest.Kept), the
    loops run again only after a test that removed or replaced one of their files."""
    with kept_loops.lent() as ws:
        yield ws


@pytest.fixture(scope="module")
def shared_loops(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    """The three loops in one workspace shared by the tests of this module that only read it."""
    return three_loops(new_workspace(tmp_path_factory.mktemp("loops") / "vault"))


def rows_by_id(ws: Workspace) -> dict[str, dict[str, Any]]:
    """`kiro loop status --json` by task id, run in this process (typer's CliRunner): no signal, no tty, and a
    fraction of a forked process's second on a loaded machine."""
    r = CliRunner().invoke(app, ["loop", "status", "-w", str(ws.root), "--json"])
    assert r.exit_code == 0 and "Traceback" not in r.stderr, r.output
    return {row["task_id"]: row for row in json.loads(r.stdout)}


def timeless(row: dict[str, Any]) -> dict[str, Any]:
    """A row without what the clock moves between two reads."""
    return {k: v for k, v in row.items() if k not in ("duration_seconds", "duration", "next_run")}


def test_a_loops_row_in_the_table_is_its_row_in_detail(loops: Workspace) -> None:
    """The table reads each loop's summary, the detail its state file: the same row either way, for
    plain, paused, archived and scheduled loops."""
    from datetime import timedelta

    from kiro import timeutil
    from kiro.store.state import LoopState, ScheduleInfo
    from kiro.store.statestore import StateStore
    from kiro.store.workspace import Workspace as KiroWorkspace

    ws = loops
    store = StateStore(KiroWorkspace(ws.root))
    for tid, status, stateful in (("nightly", "paused", True), ("ended", "completed", True)):
        store.save(LoopState(task_id=tid, task_path=f"Specs/{tid}/tasks.md", status=status, runs=3,
                             last_run_at=timeutil.iso(),
                             next_run_at=timeutil.iso(timeutil.now() + timedelta(seconds=3630)),
                             schedule=ScheduleInfo(expression="every 1h", stateful=stateful)), fsync=False)
    table = rows_by_id(ws)
    assert set(table) == {"done1", "half", "held", "nightly", "ended"}
    assert table["nightly"]["schedule"] == "every 1h" and table["nightly"]["next_run"].startswith("in 1h")
    assert table["half"]["hint"] == "kiro loop resume --task-id half --max-iterations 2"
    for tid, row in table.items():
        detail = ok_json(ws.run("loop", "status", "--task-id", tid, "--json"))
        assert timeless(detail) == timeless(row), tid
    updated = [r["updated_at"] for r in ok_json(ws.run("loop", "status", "--json"))]
    assert updated == sorted(updated, reverse=True)  # newest first
    text = ws.run("loop", "status")
    assert text.returncode == 0 and text.stdout.splitlines()[0].startswith("TASK ID")
    assert len(text.stdout.splitlines()) == 6


def test_status_reads_the_summary_and_the_state_when_the_summary_is_torn(loops: Workspace) -> None:
    from kiro.store import journal

    ws = loops
    summary = ws.root / ".state" / "autonomous_loop_half.summary"
    data = journal.decode_summary(summary.read_bytes())
    assert data is not None and data["iteration"] == 1
    data["title"] = "FROM THE SUMMARY"
    summary.write_bytes(journal.encode_summary(data))
    assert rows_by_id(ws)["half"]["title"] == "FROM THE SUMMARY"
    summary.write_bytes(summary.read_bytes()[:40])  # torn: its CRC fails, the state file is read
    assert rows_by_id(ws)["half"]["title"] != "FROM THE SUMMARY"
    assert rows_by_id(ws)["half"]["iteration"] == 1
    summary.unlink()
    assert rows_by_id(ws)["half"]["iteration"] == 1


def test_the_summary_decoder_refuses_what_the_encoder_did_not_write() -> None:
    from kiro.store import journal

    good = journal.encode_summary({"task_id": "a", "status": "paused", "note": "é ⏎"})
    assert journal.decode_summary(good) == {"task_id": "a", "status": "paused", "note": "é ⏎"}
    assert journal.decode_summary(good + b"    ") is not None  # padded in place to a longer old one
    a_list = journal.SUMMARY_MAGIC + b"%08x 2\n[]" % __import__("zlib").crc32(b"[]")
    for bad in (good[:-3], good[:20], b"", b"kiro-summary 1 zz 5\n{}", good.replace(b"paused", b"pausex"),
                b"kiro-summary 2 " + good[15:], a_list):
        assert journal.decode_summary(bad) is None, bad


def test_a_live_loop_then_killed_then_locked_by_another_process(ws: Workspace) -> None:
    """Running and alive while its process holds the lock; interrupted once it is killed; running
    again while some other process (here flock(1)) holds its lock."""
    import os

    from kiro.fs import locks

    ws.task(shell_task(2, cmd="sleep 30"))
    proc = ws.spawn("loop", "start", "--task", TASK, "--task-id", "live")
    try:
        # the table reads the summary, which the loop rewrites after its journal's fdatasync (seconds on a
        # busy disk), the detail the journal: both show the step once the table does
        ws.wait_for(lambda: (ws.state("live").get("current_step") or {}).get("status") == "in_progress"
                    and rows_by_id(ws)["live"]["current_step_id"] == "1", what="the step to start")
        row = rows_by_id(ws)["live"]
        assert (row["status"], row["alive"], row["pid"]) == ("running", True, proc.pid)
        detail = ok_json(ws.run("loop", "status", "--task-id", "live", "--json"))
        assert timeless(detail) == timeless(row)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        proc.kill()
        proc.wait()
    row = rows_by_id(ws)["live"]
    assert (row["status"], row["alive"], row["hint"]) == ("interrupted", False, "kiro loop resume --task-id live")
    lock = ws.root / ".state/autonomous_loop_live.lock"
    holder = subprocess.Popen(["flock", str(lock), "sleep", "60"], start_new_session=True)
    try:
        ws.wait_for(lambda: locks.holder_pid(lock) == holder.pid, what="flock holding the lock")
        row = rows_by_id(ws)["live"]
        assert row["status"] == "running" and row["alive"] is True
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # flock and its sleep, which holds the lock too
        holder.wait()
    ws.wait_for(lambda: not locks.is_held(lock), what="the killed sleep to let the lock go")
    assert rows_by_id(ws)["live"]["status"] == "interrupted"


def test_a_sleeping_loop_says_why_with_or_without_its_summary(ws: Workspace) -> None:
    from kiro import timeutil
    from kiro.store.state import LoopState
    from kiro.store.statestore import StateStore
    from kiro.store.workspace import Workspace as KiroWorkspace

    store = StateStore(KiroWorkspace(ws.root))
    st = LoopState(task_id="napping", task_path="Specs/n/tasks.md", status="running", sleep_until=timeutil.iso())
    st.transition("sleeping", "max_cpu_percent")
    store.save(st, fsync=False)
    lock = store.acquire("napping")  # this process is the loop's live process
    try:
        for _ in range(2):
            table = rows_by_id(ws)["napping"]
            detail = ok_json(ws.run("loop", "status", "--task-id", "napping", "--json"))
            for row in (table, detail):
                assert (row["status"], row["sleeping_because"], row["alive"]) == ("sleeping", "max_cpu_percent", True)
                assert row["sleep_until"] == st.sleep_until
            assert timeless(table) == timeless(detail)
            (ws.root / ".state" / "autonomous_loop_napping.summary").unlink(missing_ok=True)
    finally:
        store.release("napping", lock)


def test_a_global_stop_hook_changes_the_hint_of_every_resumable_loop(loops: Workspace) -> None:
    ws = loops
    assert rows_by_id(ws)["held"]["hint"] == "kiro loop resume --task-id held"
    (ws.root / ".hooks/stop_autonomous_loop.md").write_text("stop all\n")
    rows = rows_by_id(ws)
    assert rows["held"]["hint"] == "kiro loop resume --all"
    assert rows["half"]["hint"] == "kiro loop resume --task-id half --max-iterations 2"  # a limit to raise
    assert ok_json(ws.run("loop", "status", "--task-id", "held", "--json"))["hint"] == "kiro loop resume --all"


def test_loops_added_and_gone_show_in_the_table(loops: Workspace) -> None:
    ws = loops
    ws.task(shell_task(1), rel="Specs/fourth/tasks.md")
    assert ws.kiro("loop", "start", "--task", "Specs/fourth/tasks.md", "--task-id", "fourth").returncode == 0
    assert set(rows_by_id(ws)) == {"done1", "half", "held", "fourth"}
    gone = list((ws.root / ".state").rglob("autonomous_loop_fourth.*"))
    assert gone
    for p in gone:  # the loop's files, wherever they are (a completed loop's are archived)
        p.unlink()
    assert set(rows_by_id(ws)) == {"done1", "half", "held"}


def test_an_agent_running_status_in_its_step_is_not_blamed(ws: Workspace) -> None:
    """An agent that runs `kiro loop status` during its step writes nothing kiro blames on it."""
    from tests.test_command_executor import agent_task, make_agent, runs

    ws.task(agent_task(1))
    out = make_agent(ws, """\
        r = subprocess.run([sys.executable, "-m", "kiro", "loop", "status"], capture_output=True, text=True)
        r = subprocess.run([sys.executable, "-m", "kiro", "loop", "status"], capture_output=True, text=True)
        log("status.txt", r.stdout)
        log("status.err", f"exit {r.returncode}: {r.stderr}")
        check_box()
        """)
    r = ws.kiro("loop", "start", "--task", TASK, "--task-id", "agent")
    assert r.returncode == 0, r.stdout + r.stderr
    assert runs(out) == ["1 1"]  # one attempt: nothing blamed on the agent
    assert "agent" in (out / "status.txt").read_text(), (out / "status.err").read_text()
    assert ws.state("agent")["total_failures"] == 0


RUN_KIRO = """
sys.argv = ["kiro", *sys.argv[1:]]
try:
    runpy.run_module("kiro", run_name="__main__")
except SystemExit as e:
    code = e.code
sys.stdout.flush()
"""
"""`kiro ARGS` inside a probe: `code` is its exit code; what the probe says follows on stderr after "@@"."""


def probed(script: str, ws: Workspace, *args: str, shows: bool = True,
           runs: dict[tuple[str, ...], subprocess.CompletedProcess[str]] | None = None) -> list[str]:
    """A read command run under a probe `script` (it prints `@@ <exit code> <what it saw...>` last on
    stderr): what the probe saw. The command must end well and (`shows`) print something. With `runs`
    (shared_probe), a run already made of the same script and command in the same workspace is read again."""
    key = (script, *args)
    r = runs.get(key) if runs is not None else None
    if r is None:
        r = subprocess.run([sys.executable, "-c", script, *args], cwd=ws.root, env=ws.env(), capture_output=True,
                           text=True, timeout=120)
        if runs is not None:
            runs[key] = r
    code, *seen = r.stderr.rsplit("@@", 1)[1].split()
    assert code in ("0", "None"), r.stderr
    if shows:
        assert r.stdout.strip(), "the command showed nothing"
    return seen


PROBE = ("import runpy, sys" + RUN_KIRO
         + 'sys.stderr.write("\\n@@" + " ".join([str(code), *sorted(sys.modules)]) + "\\n")\n')

Probe = Callable[..., list[str]]  # shared_probe(script, *args, shows=True): what the probe saw


@pytest.fixture(scope="module")
def shared_probe(shared_loops: Workspace) -> Probe:
    """probed() in shared_loops, each probe of a command run once for the module: the tests that read the
    modules one `kiro loop status` imported ask different questions of the same run, as a person's one run."""
    runs: dict[tuple[str, ...], subprocess.CompletedProcess[str]] = {}

    def probe(script: str, *args: str, shows: bool = True) -> list[str]:
        return probed(script, shared_loops, *args, shows=shows, runs=runs)
    return probe


@pytest.mark.parametrize("args", [("loop", "status"), ("loop", "status", "--json"),
                                  ("loop", "status", "--task-id", "half"), ("loop", "state", "--task-id", "half"),
                                  ("loop", "logs", "--task-id", "done1", "--tail", "3"),
                                  ("loop", "progress", "--task-id", "half")], ids=" ".join)
def test_read_commands_import_no_agent_client_and_no_watcher(shared_probe: Probe, args: tuple[str, ...]) -> None:
    """STYLE 11: a read command does not import openai or watchfiles."""
    modules = shared_probe(PROBE, *args, shows=False)
    heavy = [m for m in modules if m.split(".")[0] in ("openai", "watchfiles", "httpx", "temporalio")]
    assert heavy == []


# What a command that only reads has no use for (issue #41): the engine, an executor (beyond the table of
# which kinds read messages), git, the server; the event kinds' models, where the records are shown as read;
# the Kiro specs' reader in a workspace laid out by `kiro init`; the frontmatter reader, where no task file was moved.
RUNS_LOOPS = ("kiro.core.engine", "kiro.core.runner", "kiro.executors.", "kiro.git", "kiro.serve", "kiro.temporal")
LIGHT = ("kiro.executors.kinds",)


@pytest.mark.parametrize("args", [("loop", "status"), ("loop", "status", "--json"),
                                  ("loop", "logs", "--task-id", "done1", "--tail", "3"),
                                  ("loop", "logs", "--task-id", "done1", "--tail", "3", "--json")], ids=" ".join)
def test_read_commands_import_nothing_that_runs_a_loop(shared_probe: Probe, args: tuple[str, ...]) -> None:
    """`kiro loop status` and `kiro loop logs` load what reads the state and the log, no more: a person
    waits for every module a command imports."""
    modules = shared_probe(PROBE, *args)
    loaded = [m for m in modules if m.startswith(RUNS_LOOPS) and m not in LIGHT]
    if "logs" in args:
        loaded += [m for m in modules if m == "kiro.store.events"]
    loaded += [m for m in modules if m == "kiro.store.kirospec"]  # the Kiro specs' reader: no spec is read
    loaded += [m for m in modules if m == "kiro.store.frontmatter"]  # a task file's frontmatter: none is read
    print(f"{' '.join(args)}: {len([m for m in modules if m.startswith('kiro')])} kiro modules; "
          f"of the engine's: {loaded or 'none'}")
    assert loaded == []


@pytest.mark.parametrize("args", [("loop", "status"), ("loop", "status", "--json"),
                                  ("loop", "logs", "--task-id", "done1", "--tail", "3")], ids=" ".join)
def test_status_and_logs_make_no_state_model(shared_probe: Probe, args: tuple[str, ...]) -> None:
    """Issue #41: the table of loops is read from the summaries the loops write beside their states, and the
    log as its records: neither command imports the state's models, its receipts or the event kinds (about
    60 M instructions of class making); kiro.store.statestore imports them when a state is first read."""
    modules = shared_probe(PROBE, *args)
    models = [m for m in modules if m in ("kiro.store.state", "kiro.store.receipts", "kiro.store.events")]
    print(f"{' '.join(args)}: model modules imported: {models or 'none'}")
    assert models == []


SOURCE_PROBE = """
import inspect, runpy, sys
read = []
find = inspect.findsource
def findsource(obj):
    code = getattr(obj, "f_code", None)  # pydantic looks a class up by the frame that makes it
    read.append("/".join(code.co_filename.split("/")[-3:]) if code else getattr(obj, "__qualname__", repr(obj)))
    return find(obj)
inspect.findsource = findsource
""" + RUN_KIRO + """sys.stderr.write("\\n@@" + " ".join([str(code), *read]) + "\\n")
"""


@pytest.mark.parametrize("args", [("loop", "status"), ("loop", "logs", "--task-id", "done1", "--tail", "3")],
                         ids=" ".join)
def test_read_commands_parse_no_source(shared_loops: Workspace, args: tuple[str, ...]) -> None:
    """Issue #41: a read command does not read and parse Python source to start. The config's field
    descriptions (the docstring under each key) are read from kiro/store/config.py only when a schema or
    the docs are made, not when the config is resolved (it cost about 200 M instructions, a third of
    kiro's own start-up)."""
    read = probed(SOURCE_PROBE, shared_loops, *args)
    print(f"{' '.join(args)}: source looked up for {len(read)} objects: {read or 'none'}")
    assert read == []


EVAL_PROBE = """
import builtins, runpy, sys
texts = []
evaluate = builtins.eval
def eval_(source, *args, **kwargs):
    if isinstance(source, str) and sys._getframe(1).f_code.co_filename.endswith("inspect.py"):
        texts.append(source)  # an annotation written as text, evaluated for inspect.signature(eval_str=True)
    return evaluate(source, *args, **kwargs)
builtins.eval = eval_
""" + RUN_KIRO + """sys.stderr.write("\\n@@" + str(code) + " " + str(len(texts)) + "\\n")
"""


@pytest.mark.parametrize("args", [("loop", "status"), ("loop", "logs", "--task-id", "done1", "--tail", "3")],
                         ids=" ".join)
def test_read_commands_evaluate_no_annotation_text(shared_loops: Workspace, args: tuple[str, ...]) -> None:
    """Issue #41: Typer reads each command's parameters from its annotations, for every command of the app,
    on every run. Written as text (`from __future__ import annotations`), each was evaluated again then, twice
    (about 250 `eval` calls and 60 M instructions for `kiro loop status`); kiro/cli's command modules have
    their annotations evaluated once, at import."""
    (evaluated,) = probed(EVAL_PROBE, shared_loops, *args)
    print(f"{' '.join(args)}: {evaluated} annotations evaluated from text")
    assert evaluated == "0"


def test_a_config_naming_agents_is_checked_without_importing_a_preset(loops: Workspace) -> None:
    """Issue #40 item 2: the agent names are checked against the registry's metadata (kiro.plugins.AGENTS),
    not by importing the presets: `kiro loop status` with `agent:` and `fallback_agents:` set loads none."""
    config = loops.root / "config" / "autonomous_loop.yaml"
    config.write_text(config.read_text() + "agent: codex\nfallback_agents: [gemini, claude-acp]\n")
    modules = probed(PROBE, loops, "loop", "status", shows=False)
    presets = [m for m in modules if m.startswith("kiro.executors.agents")]
    print(f"loop status with agent: codex: preset modules imported: {presets or 'none'}")
    assert presets == []


def test_logs_tail_reads_from_the_end_as_read_events_would(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Torn lines, blank lines, a line longer than the block, JSON that is not an object, no final
    newline: the last N events are those of kiro.store.logread.read_events, at every block boundary."""
    from kiro.store import logread as events

    lines = [json.dumps({"event": "e", "n": i}) for i in range(30)]
    lines[5] = '{"event": "torn'
    lines[9] = ""
    lines[12] = json.dumps({"event": "long", "text": "x" * 200})
    lines[15] = "[1, 2]"
    lines[20] = "   "
    cases = {"newline at the end": "\n".join(lines) + "\n", "no newline at the end": "\n".join(lines),
             "torn tail": "\n".join(lines) + '\n{"event": "half', "empty": ""}
    for block in (1, 7, 64, 65536):
        monkeypatch.setattr(events, "TAIL_BLOCK", block)
        for name, text in cases.items():
            path = tmp_path / f"{block}_{name}.jsonl"
            path.write_text(text)
            every = list(events.read_events(path))
            for n in (0, 1, 2, 5, 13, 26, 40):
                assert events.read_last(path, n) == (every[-n:] if n else []), (block, name, n)
    assert events.read_last(tmp_path / "missing.jsonl", 3) == []


def test_logs_tail_prints_the_last_events(done: Workspace) -> None:
    ws, finished = done, "done1"
    every = ok_json_lines(ws.run("loop", "logs", "--task-id", finished, "--json"))
    assert ok_json_lines(ws.run("loop", "logs", "--task-id", finished, "--tail", "3", "--json")) == every[-3:]
    assert ok_json_lines(ws.run("loop", "logs", "--task-id", finished, "-n", "0", "--json")) == []
    assert ok_json_lines(ws.run("loop", "logs", "--task-id", finished, "--tail=100000", "--json")) == every
    text = ws.run("loop", "logs", "--task-id", finished, "--tail", "2")
    assert text.returncode == 0 and text.stdout.splitlines() == ws.run(
        "loop", "logs", "--task-id", finished).stdout.splitlines()[-2:]


def ok_json_lines(r: subprocess.CompletedProcess[str]) -> list[Any]:
    assert r.returncode == 0, r.stdout + r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


# -- events printed into a pipe ---------------------------------------------------------------------


def test_a_loop_run_into_a_pipe_prints_what_rich_prints_without_importing_it(ws: Workspace) -> None:
    """`kiro loop start` whose output is not a terminal prints each event's line as rich would
    (`console.event_plain`) and never imports rich (~30 ms of its start-up, issue #12)."""
    import io

    from rich.console import Console

    from kiro.views import console

    ws.write("Specs/a/tasks.md", shell_task(2, cmd="printf 'tab\\there \\a bell é ▶'"))
    code = ("import runpy, sys\nsys.argv = ['kiro', 'loop', 'start', '--task', 'Specs/a/tasks.md']\n"
            "try:\n    runpy.run_module('kiro', run_name='__main__')\n"
            "except SystemExit as e:\n    print('exit', e.code, 'rich' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ws.root, env=ws.env(), capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.splitlines()[-1] == "exit 0 False", out.stdout + out.stderr
    # the same lines as rich's, for every event of the run and a few awkward ones
    task_id = ws.only_task_id()
    records = ws.events(task_id) + [
        {"event": "step_failed", "ts": "2026-11-23T07:00:00.000+00:00", "iteration": 3, "step_id": "2",
         "attempt": 2, "error": "bell \a back\b ff\f cr\r vt\v [bold]not markup[/] é 漢 " + "x" * 300},
        {"event": "step_started", "ts": "2026-11-23T07:00:00.000+00:00", "iteration": 4, "step_id": "[x]",
         "description": "emoji 🎉 and :smile: and \x1b[31mansi\x1b[0m", "attempt": 1},
        # the time's part of the line is not made printable first: its control codes are dropped as rich drops them
        {"event": "step_completed", "ts": "2026-11-23T0\r:\a0\b\f\v0.000+00:00", "iteration": 5, "step_id": "✓",
         "duration_seconds": 0.5}]
    for with_task in (False, True):
        for e in records:
            plain = console.event_plain(e, with_task=with_task)
            rich_text = console.format_event(e, with_task=with_task)
            assert (plain is None) == (rich_text is None), e
            if rich_text is None:
                continue
            buf = io.StringIO()
            Console(file=buf, highlight=False, soft_wrap=True).print(rich_text)
            assert plain + "\n" == buf.getvalue(), e
    printed = [line for line in out.stdout.splitlines()[:-1] if not line.startswith(task_id + ":")]
    shown = [console.event_plain(e) for e in ws.events(task_id)
             if e["event"] not in ("tool_called", "model_called", "iteration_started", "reinjected",
                                   "report_written")]
    assert printed == [s for s in shown if s is not None]


def test_a_step_with_no_number_is_named_once_when_it_starts() -> None:
    """Its text is its id: `▶ Deploy it`, not `▶ Deploy it Deploy it`; a numbered step shows both."""
    from kiro.views import console

    base = {"event": "step_started", "ts": "2026-11-27T07:00:00.000+00:00", "iteration": 1, "attempt": 1}
    once = console.event_plain({**base, "step_id": "Deploy it", "description": "Deploy it"})
    assert once == "07:00:00 [1] ▶ Deploy it"
    assert console.event_plain({**base, "step_id": "2", "description": "Deploy it"}) == "07:00:00 [1] ▶ 2 Deploy it"


READS = [("loop", "status"), ("loop", "status", "--json"), ("loop", "status", "--task-id", "x"),
         ("loop", "state", "--task-id", "x"), ("loop", "progress"), ("loop", "logs"), ("loop", "logs", "--json"),
         ("loop", "stats"), ("loop", "stats", "--json"), ("loop", "history"), ("loop", "history", "--json"),
         ("loop", "history", "--task-id", "x"), ("loop", "digest"), ("loop", "digest", "--json")]


def test_a_read_command_in_a_folder_that_is_no_workspace_creates_nothing(ws: Workspace, tmp_path: Path) -> None:
    """`kiro loop history` in a folder that was never a workspace made `.state/kiro.db` (a person who typed
    it in the wrong folder found a `.state/` there). A read command creates nothing: it says there is
    nothing (exit 0), or names what is missing (exit 1), in one line."""
    plain = tmp_path / "not_a_workspace"
    plain.mkdir()
    (plain / "notes.txt").write_text("mine\n")
    failed = []
    for args in READS:
        r = kiro_from(plain, ws, *args, "-w", str(plain))
        made = sorted(p.relative_to(plain).as_posix() for p in plain.rglob("*") if p.name != "notes.txt")
        ok = r.returncode in (0, 1) and "Traceback" not in r.stderr and not made
        print(f"{'held' if ok else 'FAILED'}: kiro {' '.join(args)} -> exit {r.returncode}, made {made or 'nothing'}")
        if not ok:
            failed.append((args, r.returncode, made, r.stderr))
            for p in sorted(plain.rglob("*"), reverse=True):
                if p.name != "notes.txt":
                    p.unlink() if p.is_file() else p.rmdir()
    print(f"{len(READS) - len(failed)} of {len(READS)} read commands created nothing")
    assert failed == []
    r = kiro_from(plain, ws, "loop", "history", "-w", str(plain))
    assert (r.returncode, r.stdout.strip()) == (0, "no history yet"), r.stderr


MODELS_PROBE = """
import builtins, inspect, runpy, sys
evaluated, parsed = [], []
evaluate = builtins.eval
def eval_(source, *args, **kwargs):
    if sys._getframe(1).f_code.co_filename.endswith(("typing.py", "_typing_extra.py")):
        evaluated.append(source)  # a ForwardRef: an annotation written as text, evaluated for pydantic
    return evaluate(source, *args, **kwargs)
builtins.eval = eval_
from_text = inspect._signature_fromstr
def signature_fromstr(cls, obj, text, *args, **kwargs):
    parsed.append(getattr(obj, "__qualname__", repr(obj)))  # a builtin's signature, tokenized from its text
    return from_text(cls, obj, text, *args, **kwargs)
inspect._signature_fromstr = signature_fromstr
""" + RUN_KIRO + """sys.stderr.write("\\n@@" + " ".join([str(code), str(len(evaluated)), *parsed]) + "\\n")
"""


@pytest.mark.parametrize("args", [("loop", "status"), ("loop", "logs", "--task-id", "done1", "--tail", "3")],
                         ids=" ".join)
def test_read_commands_build_the_models_without_evaluating_or_tokenizing_text(
        shared_loops: Workspace, args: tuple[str, ...]) -> None:
    """Issue #41: the config's and the state's models are made with their annotations as objects (their
    modules have no `from __future__ import annotations`: pydantic evaluated each field's text, about 300
    `eval` calls for `kiro loop status`), and an empty list or dict default comes from a Python function, not
    `list` or `dict` (pydantic reads a default factory's signature, and a builtin's is tokenized from its text)."""
    evaluated, *parsed = probed(MODELS_PROBE, shared_loops, *args)
    print(f"{' '.join(args)}: {evaluated} annotations evaluated from text; builtin signatures tokenized: "
          f"{parsed or 'none'}")
    assert (evaluated, parsed) == ("0", [])


REGEX_PROBE = """
import re, runpy, sys
made = []
compile_ = re._compile
def _compile(pattern, flags):
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.endswith(("re/__init__.py", "functools.py")):
        frame = frame.f_back
    if frame is not None and frame.f_globals.get("__name__", "").startswith("kiro.") and pattern not in seen:
        made.append(frame.f_globals["__name__"] + ":" + frame.f_code.co_name)
    seen.add(pattern)
    return compile_(pattern, flags)
seen = set()
re._compile = _compile
""" + RUN_KIRO + """sys.stderr.write("\\n@@" + " ".join([str(code), *made]) + "\\n")
"""
# What a read command compiles of kiro's own patterns: what it prints is cleaned of control characters
# (console) and of words in a credential format (redact), task ids are checked (workspace), the environment
# is scanned for tokens (redact), and the config file is read (config's YAML loader, and PyYAML's reader's
# character class in its quick spelling: kiro.fs.safeio.yaml_module).
READ_PATTERNS = {"kiro.views.console:<module>", "kiro.store.workspace:<module>", "kiro.store.redact:_token_formats",
                 "kiro.store.redact:_token_words", "kiro.store.config:_loader", "kiro.fs.safeio:yaml_module"}


@pytest.mark.parametrize("args", [("loop", "status"), ("loop", "logs", "--task-id", "done1", "--tail", "3")],
                         ids=" ".join)
def test_read_commands_compile_only_the_patterns_they_use(shared_loops: Workspace, args: tuple[str, ...]) -> None:
    """Issue #41: Python compiles a regex in Python code; kiro's patterns for command lines and URLs
    (redact), backup names (state), Kiro specs (kirospec) and environment names (config) are compiled
    where first used, not at import: a read command compiles none of them."""
    made = probed(REGEX_PROBE, shared_loops, *args)
    print(f"{' '.join(args)}: kiro's patterns compiled by {sorted(set(made))}")
    assert set(made) <= READ_PATTERNS


PLUGIN_PROBE = """
import importlib.metadata, os, runpy, sys
groups = []
entry_points = importlib.metadata.entry_points
def entry_points_(**params):
    groups.append(params.get("group", "*"))  # pydantic.plugin._loader binds this name when first imported
    return entry_points(**params)
importlib.metadata.entry_points = entry_points_
""" + RUN_KIRO + """sys.stderr.write("\\n@@" + " ".join([str(code), str("PYDANTIC_DISABLE_PLUGINS" in os.environ),
                                         *groups]) + "\\n")
"""


@pytest.mark.parametrize("args", [("loop", "status"), ("loop", "logs", "--task-id", "done1", "--tail", "3")],
                         ids=" ".join)
def test_read_commands_look_for_no_pydantic_plugin(shared_loops: Workspace, args: tuple[str, ...]) -> None:
    """Issue #41: pydantic's first model build scans every installed package's entry points for a pydantic
    plugin (~26 M instructions); kiro runs none and says so in the process (kiro.plugins.no_pydantic_plugins),
    without PYDANTIC_DISABLE_PLUGINS in the environment a step or a hook would inherit."""
    in_environment, *groups = probed(PLUGIN_PROBE, shared_loops, *args)
    print(f"{' '.join(args)}: entry point groups scanned: {groups or 'none'}; "
          f"PYDANTIC_DISABLE_PLUGINS left in the environment: {in_environment}")
    assert "pydantic" not in groups and in_environment == "False"


@pytest.mark.parametrize("args", [("loop", "status"), ("loop", "logs", "--task-id", "done1", "--tail", "3")],
                         ids=" ".join)
def test_read_commands_read_no_package_metadata(shared_probe: Probe, args: tuple[str, ...]) -> None:
    """Issue #41: pydantic's plugin loader imports importlib.metadata (email, csv, zipfile: ~53 M instructions)
    on the first validator any code builds, Typer's for the command's options included; kiro puts a loader of
    no plugins in its place first (kiro.plugins.no_pydantic_plugins), and a read command reads no package's
    metadata for anything else."""
    modules = shared_probe(PROBE, *args)
    metadata = [m for m in modules if m.startswith(("importlib.metadata", "email", "zipfile", "csv"))]
    print(f"{' '.join(args)}: package metadata modules imported: {metadata or 'none'}")
    assert metadata == []


COMMANDS_PROBE = """
import runpy, sys, typer.main
built = []
from_info = typer.main.get_command_from_info
def get_command_from_info(command_info, **kwargs):
    command = from_info(command_info, **kwargs)
    built.append(command.name)
    return command
typer.main.get_command_from_info = get_command_from_info
""" + RUN_KIRO + """sys.stderr.write("\\n@@" + " ".join([str(code), *built]) + "\\n")
"""


@pytest.mark.parametrize("args", [("loop", "status"), ("loop", "logs", "--task-id", "done1", "--tail", "3")],
                         ids=" ".join)
def test_loop_commands_make_only_the_command_run(shared_loops: Workspace, args: tuple[str, ...]) -> None:
    """Issue #41: Typer reads the parameters of every command of a group it runs (the loop group's fourteen,
    ~35 M instructions); `kiro loop <command>` registers the one command it names (`kiro loop --help`, a
    misspelt command and the shell's completion still get every one)."""
    built = probed(COMMANDS_PROBE, shared_loops, *args)
    print(f"{' '.join(args)}: commands Typer made: {built}")
    assert built == [args[1]]


@pytest.mark.parametrize("args", [("loop", "--help"), ("loop", "stauts")], ids=" ".join)
def test_loop_help_and_a_misspelt_command_know_every_loop_command(ws: Workspace, args: tuple[str, ...]) -> None:
    """`kiro loop --help` lists, and a misspelt `kiro loop stauts` suggests from, every loop command: only a
    command named in full is registered alone (test_loop_commands_make_only_the_command_run)."""
    r = ws.kiro(*args)
    shown = r.stdout + r.stderr
    if "--help" in args:
        assert r.returncode == 0, shown
        assert all(name in shown for name in ("start", "resume", "status", "logs", "stop", "watch", "history")), shown
    else:
        assert r.returncode == 1 and "'status'" in shown and "'stats'" in shown, shown
