"""The `command` executor (SPEC §5): an external agent CLI gets the iteration's prompt on stdin or in
`{prompt_file}`; a step is done when the agent exits 0 and has checked the step's box (or on exit 0
alone with `command_success: exit_code`); a timeout or `stop --force` ends the agent's whole
process group.

The agents are small Python scripts in tmp_path, run as `<python> agent.py <out-dir> ...`. Each
records what it saw in <out-dir>: `runs.log` (one `step attempt` line per run), `prompt_<step>_<attempt>.txt`.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FAST_CONFIG, Workspace, shell_task

TASK = "Specs/feature/tasks.md"

PRELUDE = '''\
import os, pathlib, re, subprocess, sys, time
TASK = pathlib.Path(os.environ["KIRO_TASK_FILE"])
STEP = os.environ["KIRO_STEP_ID"]
ATTEMPT = int(os.environ["KIRO_ATTEMPT"])
OUT = pathlib.Path(sys.argv[1])
OUT.mkdir(exist_ok=True)

def log(name, text):
    with open(OUT / name, "a") as fh:
        fh.write(text)

def check_box():
    text = TASK.read_text()
    pat = re.compile(r"^(\\s*- \\[)[ ~-](\\]\\s+" + re.escape(STEP) + r"\\.?\\s)", re.M)
    new, n = pat.subn(r"\\g<1>x\\g<2>", text, count=1)
    assert n == 1, (STEP, text)
    TASK.write_text(new)

log("runs.log", f"{STEP} {ATTEMPT}\\n")
'''


def agent_task(n: int, extra_frontmatter: str = "") -> str:
    lines = ["---", "title: Agent task", "executor: command"]
    if extra_frontmatter:
        lines.append(extra_frontmatter)
    lines += ["---", "# Plan", ""]
    lines += [f"- [ ] {i}. Write part {i} of the greeting" for i in range(1, n + 1)]
    return "\n".join(lines) + "\n"


def make_agent(ws: Workspace, body: str, *, args: str = "", extra_config: str = "") -> Path:
    """Write the agent script and a config that runs it; return its output folder."""
    script = ws.root.parent / "agent.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    out = ws.root.parent / "agent_out"
    out.mkdir(exist_ok=True)
    cmd = f"{shlex.quote(sys.executable)} {shlex.quote(str(script))} {shlex.quote(str(out))}"
    if args:
        cmd += " " + args
    # the agent's records go outside the project: the step's box (sandbox: bwrap) lets it write there
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + f"executor_command: {json.dumps(cmd)}\n"
             + f"sandbox_paths: {{rw: [{json.dumps(str(out))}]}}\n" + textwrap.dedent(extra_config))
    return out


def runs(out: Path) -> list[str]:
    p = out / "runs.log"
    return p.read_text().splitlines() if p.exists() else []


def alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper counts as gone: it can do nothing more)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def test_prompt_on_stdin_names_step_task_and_how_to_check_the_box(ws: Workspace) -> None:
    ws.task(agent_task(1))
    out = make_agent(ws, """\
        log(f"prompt_{STEP}_{ATTEMPT}.txt", sys.stdin.read())
        check_box()
        """)
    r = ws.kiro("loop", "start", "--task", TASK)
    assert r.returncode == 0, r.stdout + r.stderr
    prompt = (out / "prompt_1_1.txt").read_text()
    assert "Write part 1 of the greeting" in prompt
    assert "step 1" in prompt.lower()
    assert TASK in prompt
    assert "[x]" in prompt  # how to check the box


def test_prompt_file_placeholder_is_a_file_holding_the_prompt(ws: Workspace) -> None:
    ws.task(agent_task(1))
    out = make_agent(ws, """\
        path = pathlib.Path(sys.argv[sys.argv.index("--message-file") + 1])
        log("prompt_path.txt", str(path))
        log(f"prompt_{STEP}_{ATTEMPT}.txt", path.read_text())
        log("stdin.txt", sys.stdin.read())
        log("env_prompt_file.txt", os.environ.get("KIRO_PROMPT_FILE", ""))
        check_box()
        """, args="--message-file {prompt_file}")
    r = ws.kiro("loop", "start", "--task", TASK)
    assert r.returncode == 0, r.stdout + r.stderr
    path = (out / "prompt_path.txt").read_text()
    assert "{prompt_file}" not in path and Path(path).is_absolute()
    prompt = (out / "prompt_1_1.txt").read_text()
    assert "Write part 1 of the greeting" in prompt and TASK in prompt
    assert (out / "stdin.txt").read_text() == ""  # the prompt went into the file, not on stdin
    assert (out / "env_prompt_file.txt").read_text() == path


def test_exit_0_without_checking_the_box_is_a_failed_attempt(ws: Workspace) -> None:
    ws.task(agent_task(2))
    out = make_agent(ws, """\
        print("I did it, honest")
        """)
    r = ws.kiro("loop", "start", "--task", TASK, "--failure-threshold", "2")
    assert r.returncode == 5, r.stdout + r.stderr
    st = ws.state(ws.only_task_id())
    assert st["total_successes"] == 0 and st["consecutive_failures"] == 2
    error = st["failed_steps"][0]["error"]
    assert "not checked" in error and "I did it, honest" in error
    assert runs(out) == ["1 1", "1 2"]
    assert "- [x]" not in (ws.root / TASK).read_text()


def test_agent_that_checks_its_box_completes_the_step_and_it_never_runs_again(ws: Workspace) -> None:
    ws.task(agent_task(3))
    out = make_agent(ws, """\
        check_box()
        print(f"did step {STEP}")
        """)
    r = ws.kiro("loop", "start", "--task", TASK)
    assert r.returncode == 0, r.stdout + r.stderr
    assert runs(out) == ["1 1", "2 1", "3 1"]
    done = (ws.root / "Done/feature/tasks.md").read_text()
    assert done.count("- [x]") == 3
    st = ws.state(ws.only_task_id())
    assert [c["step_id"] for c in st["completed_steps"]] == ["1", "2", "3"]
    assert st["total_failures"] == 0 and st["iteration"] == 3


def test_command_success_exit_code_counts_exit_0_alone(ws: Workspace) -> None:
    ws.task(agent_task(2))
    out = make_agent(ws, """\
        print("done, not touching the task file")
        """, extra_config="command_success: exit_code\n")
    r = ws.kiro("loop", "start", "--task", TASK)
    assert r.returncode == 0, r.stdout + r.stderr
    assert runs(out) == ["1 1", "2 1"]
    assert (ws.root / "Done/feature/tasks.md").read_text().count("- [x]") == 2  # kiro checked them


def test_non_zero_exit_is_a_failed_attempt_naming_the_last_line(ws: Workspace) -> None:
    ws.task(agent_task(1))
    make_agent(ws, """\
        print("thinking...")
        print("fatal: the model refused")
        check_box()  # a checked box does not count when the agent fails
        sys.exit(3)
        """)
    r = ws.kiro("loop", "start", "--task", TASK, "--failure-threshold", "1")
    assert r.returncode == 5, r.stdout + r.stderr
    st = ws.state(ws.only_task_id())
    error = st["failed_steps"][0]["error"]
    assert "3" in error.splitlines()[0] and "fatal: the model refused" in error.splitlines()[0]
    assert st["total_successes"] == 0


GRANDCHILD = """\
    child = subprocess.Popen(["sleep", "60"])
    log("pids", f"{os.getpid()} {child.pid}\\n")
    time.sleep(60)
    """


def test_step_timeout_kills_the_whole_process_group(ws: Workspace) -> None:
    ws.task(agent_task(1))
    # sandbox: off: the agent records its pids with os.getpid(), which in the box's PID namespace are not the
    # host's (the boxed step's end: tests/test_sandbox.py)
    out = make_agent(ws, GRANDCHILD, extra_config="step_timeout_seconds: 1\nsandbox: off\n")
    r = ws.kiro("loop", "start", "--task", TASK, "--failure-threshold", "1")
    assert r.returncode == 5, r.stdout + r.stderr
    agent_pid, grandchild = map(int, (out / "pids").read_text().split())
    ws.wait_for(lambda: not alive(agent_pid) and not alive(grandchild), timeout=15, what="the agent's group gone")
    st = ws.state(ws.only_task_id())
    assert "timed out" in st["failed_steps"][0]["error"]


def test_force_stop_ends_the_agents_process_group(ws: Workspace) -> None:
    ws.task(agent_task(2))
    out = make_agent(ws, GRANDCHILD, extra_config="sandbox: off\n")  # pids of the host: see the test above
    proc = ws.spawn("loop", "start", "--task", TASK)
    try:
        pids = ws.wait_for(lambda: (out / "pids").read_text().split(), what="the agent running")
        agent_pid, grandchild = map(int, pids)
        tid = ws.only_task_id()
        r = ws.run("loop", "stop", "--task-id", tid, "--force")
        assert r.returncode == 0, r.stderr
        assert proc.wait(timeout=30) == 3
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    ws.wait_for(lambda: not alive(agent_pid) and not alive(grandchild), timeout=15, what="the agent's group gone")
    st = ws.state(tid)
    assert st["status"] == "stopped" and st["current_step"]["status"] == "interrupted"
    assert runs(out) == ["1 1"]


def test_verify_failing_after_the_agent_checked_its_box_unchecks_it_and_a_later_attempt_passes(
        ws: Workspace) -> None:
    ws.task(agent_task(1, extra_frontmatter="verify: test -e ready"))
    out = make_agent(ws, """\
        line = next(x for x in TASK.read_text().splitlines() if "Write part" in x)
        log(f"line_{ATTEMPT}.txt", line)
        if ATTEMPT >= 2:
            pathlib.Path("ready").touch()
        check_box()
        """)
    r = ws.kiro("loop", "start", "--task", TASK)
    assert r.returncode == 0, r.stdout + r.stderr
    assert runs(out) == ["1 1", "1 2"]
    # attempt 2 found the box kiro had taken back: in progress again, not checked
    assert (out / "line_2.txt").read_text().startswith("- [-] 1.")
    st = ws.state(ws.only_task_id())
    assert st["total_failures"] == 1 and st["total_successes"] == 1
    assert "verify" in st["failed_steps"][0]["error"] and "test -e ready" in st["failed_steps"][0]["error"]
    assert any(e["event"] == "verify_failed" for e in ws.events(st["task_id"]))
    assert "- [x] 1." in (ws.root / "Done/feature/tasks.md").read_text()


def test_missing_executor_command_is_one_clear_line(ws: Workspace) -> None:
    ws.task(agent_task(1))
    r = ws.kiro("loop", "start", "--task", TASK)
    assert r.returncode == 1
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "executor_command" in lines[0], r.stderr
    assert not list((ws.root / ".state").glob("autonomous_loop_*.json"))


@pytest.mark.parametrize("program", ["./agents/missing.sh", "no-such-agent-cli-xyz"])
def test_agent_program_that_cannot_run_fails_before_the_loop_starts(ws: Workspace, program: str) -> None:
    ws.task(agent_task(1))
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + f"executor_command: {program} --yes\n")
    before = (ws.root / TASK).read_bytes()
    r = ws.kiro("loop", "start", "--task", TASK)
    assert r.returncode == 1
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and program in lines[0], r.stderr
    assert (ws.root / TASK).read_bytes() == before
    assert not list((ws.root / ".state").glob("autonomous_loop_*.json"))


def test_relative_agent_program_runs_from_the_project_directory(ws: Workspace) -> None:
    ws.task(agent_task(1))
    script = ws.write("agents/agent.sh", """\
        #!/bin/sh
        echo "ran in $(pwd)" > agent_ran.txt
        """)
    os.chmod(script, 0o755)
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "executor_command: ./agents/agent.sh\n"
             "command_success: exit_code\n")
    r = ws.kiro("loop", "start", "--task", TASK)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (ws.root / "agent_ran.txt").read_text().strip() == f"ran in {ws.root}"


def test_a_box_a_person_checks_while_a_shell_attempt_fails_is_honoured(ws: Workspace) -> None:
    """With the shell executor only a person checks boxes: a check made while an attempt at that very
    step is failing means "skip it" (for the command executor, whose agent checks boxes, a failed
    attempt's box is taken back: see the tests above). The "person" is the failing step itself here, so the
    box is off: in the box the task file is read-only to a step (SPEC §15)."""
    cmd = 'sed -i "s/^- \\[-\\] $KIRO_STEP_ID\\./- [x] $KIRO_STEP_ID./" "$KIRO_TASK_FILE"; exit 1'
    ws.task(shell_task(1, cmd=cmd) + "- [ ] 2. Next\n  ```sh\n  echo 2 > two.txt\n  ```\n")
    r = ws.kiro("loop", "start", "--task", TASK, "--failure-threshold", "3", "--sandbox", "off")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (ws.root / "two.txt").exists()
    st = ws.state(ws.only_task_id())
    assert st["total_failures"] == 1 and [c["step_id"] for c in st["completed_steps"]] == ["2"]


def test_kiros_own_temp_files_that_come_and_go_during_a_step_are_not_the_agents(ws: Workspace) -> None:
    """A snapshot or backup kiro's writer thread makes while the step runs shows as a `.kiro.tmp`
    file in .state/ for a moment. One seen when the attempt started and gone at its end was once
    "restored" and the attempt failed as if the agent had touched kiro's files."""
    from kiro.executors.control import ControlSnapshot
    from kiro.fs.atomic import temp_name
    from kiro.store.workspace import Workspace as KiroWorkspace

    task = ws.task(agent_task(1))
    kws = KiroWorkspace(ws.root)
    tmp = ws.root / ".state" / temp_name("autonomous_loop_t.json")
    tmp.write_text("{}")
    snap = ControlSnapshot.take(kws, "t", task)
    tmp.unlink()  # renamed into place by kiro's writer meanwhile
    (ws.root / ".state" / temp_name("autonomous_loop_t.json")).write_text("{")  # the next one, half written
    assert snap.restore() == []
    # what an agent does to kiro's files is still put back and named
    (ws.root / "config/autonomous_loop.yaml").write_text("autonomous_loop:\n  max_iterations: 999999\n")
    touched = snap.restore()
    assert touched == ["config/autonomous_loop.yaml (changed; restored)"]


def _journaled_loop(ws: Workspace) -> tuple[Any, Any, Any, Path]:
    """A running loop's store and state (journal open, a snapshot and one record made) and its task."""
    from kiro.status import Status
    from kiro.store.state import LoopState
    from kiro.store.statestore import StateStore
    from kiro.store.workspace import Workspace as KiroWorkspace

    task = ws.task(agent_task(1))
    kws = KiroWorkspace(ws.root)
    store = StateStore(kws)
    state = LoopState(task_id="t", task_path=TASK, status=Status.RUNNING)
    store.open_journal(state)
    store.save(state)
    state.iteration = 1
    store.save(state)  # a record in the journal, not in the snapshot
    return kws, store, state, task


def test_kiros_own_journal_write_caught_between_its_write_and_its_note_is_not_the_agents(
        ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop's writer thread appends a save to the state journal while the agent runs (a save
    made as the step starts lands after the snapshot of kiro's files was taken). The check after the
    attempt once ran between that append and its note as kiro's own write: it took the append for
    the agent's, wrote the journal back to its old bytes (the save was lost) and failed the attempt
    (CI: an opencode usage error ran twice). A write and its note are one step for the check."""
    import threading

    from kiro.executors.control import ControlSnapshot
    from kiro.store import journal as kjournal

    kws, store, state, task = _journaled_loop(ws)  # the journal has a record: the next save is an append
    snap = ControlSnapshot.take(kws, "t", task)

    written, go_on = threading.Event(), threading.Event()
    note = kjournal.note_own_write

    def slow_note(path: object, fd: int | None = None) -> None:
        if str(path).endswith(kjournal.JOURNAL_SUFFIX) and not written.is_set():
            written.set()  # the bytes are in the file; the note is not made yet
            go_on.wait(5)
        note(path, fd)  # type: ignore[arg-type]

    monkeypatch.setattr(kjournal, "note_own_write", slow_note)
    state.iteration = 2
    saver = threading.Thread(target=store.save, args=(state,))
    saver.start()
    assert written.wait(5)
    found: list[list[str]] = []
    checker = threading.Thread(target=lambda: found.append(snap.restore()))
    checker.start()
    checker.join(0.3)  # the check waits for the note (without it, it is done by now)
    go_on.set()
    saver.join(5)
    checker.join(5)
    assert found == [[]]
    store.close_journal("t")
    assert store.load("t").state.iteration == 2  # the save is kept


def test_an_agents_change_to_the_state_after_the_timers_snapshot_is_undone_without_losing_saves(
        ws: Workspace) -> None:
    """The timer writes a snapshot while a long step runs, and empties the journal. An agent that
    then changed the state file had it written back to its bytes from before the attempt: the
    state on disk went back to before the records the emptied journal held (a kill -9 then lost
    them). Now kiro writes it again from what it last saved."""
    from kiro.executors.control import ControlSnapshot
    from kiro.store.statestore import StateStore

    kws, store, state, task = _journaled_loop(ws)
    snap = ControlSnapshot.take(kws, "t", task)
    state.iteration = 2
    store.save(state)  # the step's start, saved while the agent runs
    store.journals["t"].flush()  # the timer's snapshot: the journal is emptied
    path = ws.root / ".state" / "autonomous_loop_t.json"
    path.write_text(path.read_text().replace('"iteration": 2', '"iteration": 7'))
    assert snap.restore() == [".state/autonomous_loop_t.json (changed; restored)"]
    assert StateStore(kws).load("t").state.iteration == 2  # as a reader (or a restart after kill -9) sees it
    state.iteration = 3
    store.save(state)
    assert StateStore(kws).load("t").state.iteration == 3
    store.close_journal("t")


def _later_saves_reach_readers(kws: Any, store: Any, state: Any, state_file: Path) -> None:
    """Two more saves, each read back whole by a reader and by the summary; then the journal closes."""
    from kiro.store import journal as kjournal
    from kiro.store.statestore import StateStore

    for i in (2, 3):
        state.iteration = i
        store.save(state)
        assert StateStore(kws).load("t").state.iteration == i
        summary = kjournal.read_summary(state_file)
        assert summary is not None and summary["iteration"] == i
    store.close_journal("t")


def test_an_agent_that_replaces_the_journal_and_summary_does_not_cut_kiro_off_from_them(ws: Workspace) -> None:
    """Put back by rename, the journal was a new file and kiro's appends went on into the old one,
    which nobody reads: every later save was lost to readers, and `status` (the summary) froze."""
    from kiro.executors.control import ControlSnapshot
    from kiro.store import journal as kjournal

    kws, store, state, task = _journaled_loop(ws)
    snap = ControlSnapshot.take(kws, "t", task)
    state_file = ws.root / ".state" / "autonomous_loop_t.json"
    for victim in (kjournal.journal_path(state_file), kjournal.summary_path(state_file)):
        fake = victim.with_name("fake")
        fake.write_bytes(victim.read_bytes() + b"\n")
        os.replace(fake, victim)
    touched = snap.restore()
    assert sorted(touched) == [f".state/autonomous_loop_t{suffix} (changed; restored)"
                               for suffix in sorted((kjournal.JOURNAL_SUFFIX, kjournal.SUMMARY_SUFFIX))]
    _later_saves_reach_readers(kws, store, state, state_file)


def test_an_agents_change_the_timers_snapshot_wrote_over_is_still_named(ws: Workspace) -> None:
    """The agent changed the state file, then the timer's snapshot replaced it with kiro's own
    before the check: the change was gone and went unsaid (CI, under load)."""
    from kiro.executors.control import ControlSnapshot

    kws, store, state, task = _journaled_loop(ws)
    snap = ControlSnapshot.take(kws, "t", task)
    path = ws.root / ".state" / "autonomous_loop_t.json"
    path.write_text(path.read_text().replace('"consecutive_failures": 0', '"consecutive_failures": 9'))
    store.journals["t"].flush()  # the timer's snapshot, over the agent's change
    assert '"consecutive_failures": 0' in path.read_text()
    assert snap.restore() == [".state/autonomous_loop_t.json (changed; restored)"]
    assert ControlSnapshot.take(kws, "t", task).restore() == []  # said once
    store.close_journal("t")


def test_an_agent_that_puts_folders_where_the_journal_and_summary_go_does_not_break_the_loop(ws: Workspace) -> None:
    """Folders in place of the loop's state file, journal and summary: removed, the files are made
    again, and every later save still reaches readers."""
    from kiro.executors.control import ControlSnapshot
    from kiro.store import journal as kjournal

    kws, store, state, task = _journaled_loop(ws)
    snap = ControlSnapshot.take(kws, "t", task)
    state_file = ws.root / ".state" / "autonomous_loop_t.json"
    for victim in (state_file, kjournal.journal_path(state_file), kjournal.summary_path(state_file)):
        victim.unlink()
        (victim / "inside").mkdir(parents=True)
    touched = snap.restore()
    assert all("restored" in t for t in touched) and len(touched) == 3, touched
    _later_saves_reach_readers(kws, store, state, state_file)
