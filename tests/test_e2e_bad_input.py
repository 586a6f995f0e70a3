"""Bad input gets one line on stderr naming the file (and key or line), exit 1, no traceback, and
no state lost: `kiro loop start` and `resume` run as a subprocess on a real workspace, the read
commands in the test's process (`ws.run`).

Each test finds another loop in an unfinished state (run once for the module's tests, the workspace put
back after each: conftest.Kept), snapshots every file of the workspace, feeds kiro the bad input, and
checks the workspace is byte for byte what it was (lock files aside): no state file rewritten, no
half-created loop left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests import cli_forkserver, cli_inprocess
from tests.conftest import FAST_CONFIG, Kept, Workspace, new_workspace, shell_task

TASK = "Specs/feature/tasks.md"
OTHER = "Specs/other/tasks.md"


# -- helpers -------------------------------------------------------------------------------------


def snapshot(ws: Workspace) -> dict[str, bytes]:
    """Every file of the workspace and its bytes; lock files (empty flock targets) left out."""
    return {p.relative_to(ws.root).as_posix(): p.read_bytes() for p in sorted(ws.root.rglob("*"))
            if p.is_file() and not p.name.endswith(".lock")}


def one_line_error(r: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Exit 1, exactly one non-empty line on stderr that contains every needle, no traceback."""
    both = r.stdout + r.stderr
    assert "Traceback" not in both, both
    assert "internal error" not in both, both
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, r.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def warned(r: subprocess.CompletedProcess[str], *needles: str) -> str:
    """A warning on stderr that names every needle; no traceback; kiro went on."""
    both = r.stdout + r.stderr
    assert "Traceback" not in both, both
    assert r.returncode != 1, (r.returncode, r.stdout, r.stderr)
    hits = [line for line in r.stderr.splitlines() if "warning" in line and all(n in line for n in needles)]
    assert hits, r.stderr
    return hits[0]


def _other_loop(ws: Workspace) -> None:
    """An unfinished loop on another task (out of iterations after step 1), whose state must survive."""
    ws.task(shell_task(2), rel=OTHER)
    ws.task(shell_task(2))
    r = ws.kiro("loop", "start", "--task", OTHER, "--task-id", "other", "--max-iterations", "1")
    assert r.returncode == 4, r.stderr
    assert ws.state("other")["status"] == "max_iterations"


def _corrupt_loop(ws: Workspace) -> None:
    """A loop stopped at iteration 2 of 3 with a backup every iteration, its state file then torn."""
    config(ws, "  backup_state_every_n_iterations: 1\n")
    ws.task(shell_task(3))
    r = ws.kiro("loop", "start", "--task", TASK, "--task-id", "t", "--max-iterations", "2")
    assert r.returncode == 4, r.stderr
    assert len(list((ws.root / ".state/backups").glob("autonomous_loop_t.*.json"))) == 2
    (ws.root / ".state/autonomous_loop_t.json").write_text('{"task_id": "t", "status": "run')  # a torn write


def _corrupt_loop_without_a_backup(ws: Workspace) -> None:
    """That loop with its backups gone."""
    _corrupt_loop(ws)
    for p in (ws.root / ".state/backups").iterdir():
        p.unlink()


@pytest.fixture(scope="module")
def _kept(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Kept]:
    base = tmp_path_factory.mktemp("bad-input")
    return {"other": Kept(base / "other", _other_loop), "corrupt": Kept(base / "corrupt", _corrupt_loop),
            "corrupt_without_a_backup": Kept(base / "nobackup", _corrupt_loop_without_a_backup)}


@pytest.fixture
def ws(request: pytest.FixtureRequest, tmp_path: Path, _kept: dict[str, Kept]) -> Iterator[Workspace]:
    """A test that asks for `other`, `corrupt` or `corrupt_without_a_backup` gets the workspace holding that
    loop, run once for the module's tests (conftest.Kept: each test finds it as the loop left it); any other
    test, a new workspace."""
    for name, kept in _kept.items():
        if name in request.fixturenames:
            with kept.lent() as shared:
                yield shared
            return
    yield new_workspace(tmp_path / "vault")


@pytest.fixture
def other(ws: Workspace) -> str:
    """The task id of the unfinished loop of `ws` (out of iterations after step 1), whose state must survive."""
    return "other"


def config(ws: Workspace, extra: str) -> None:
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + extra)


# -- config ----------------------------------------------------------------------------------------

CONFIG_CASES = {
    # name: (config text after FAST_CONFIG, what the one line must name)
    "malformed_yaml": ("  max_iterations: 5\n failure_threshold: 3\n",
                       ("config/autonomous_loop.yaml:5:", "YAML")),
    "unknown_key": ("  max_iteration: 5\n",
                    ("config/autonomous_loop.yaml:4:", "max_iteration", "did you mean 'max_iterations'")),
    "wrong_type": ("  max_iterations: lots\n",
                   ("config/autonomous_loop.yaml:4:", "max_iterations", "lots")),
}


@pytest.mark.parametrize("case", sorted(CONFIG_CASES))
@pytest.mark.parametrize("command", ["start", "resume"])
def test_bad_config_is_one_line_naming_file_line_and_key(ws: Workspace, other: str, case: str,
                                                        command: str) -> None:
    text, needles = CONFIG_CASES[case]
    config(ws, text)
    before = snapshot(ws)
    args = ("--task", TASK) if command == "start" else ("--task-id", other, "--max-iterations", "5")
    r = ws.kiro("loop", command, *args)
    one_line_error(r, *needles)
    assert snapshot(ws) == before


def test_read_commands_still_work_on_a_bad_config_with_a_warning(ws: Workspace, other: str) -> None:
    config(ws, "  max_iteration: 5\n")
    r = ws.run("loop", "status", "--json")
    warned(r, "config/autonomous_loop.yaml:4:", "max_iteration")
    assert r.returncode == 0
    assert [row["task_id"] for row in json.loads(r.stdout)] == [other]


def test_config_flag_pointing_to_a_missing_file(ws: Workspace, other: str) -> None:
    before = snapshot(ws)
    one_line_error(ws.kiro("loop", "start", "--task", TASK, "--config", "nowhere/kiro.yaml"),
                   "nowhere/kiro.yaml", "not found")
    one_line_error(ws.kiro("loop", "resume", "--task-id", other, "--config", "nowhere/kiro.yaml"),
                   "nowhere/kiro.yaml", "not found")
    assert snapshot(ws) == before


# -- task files ------------------------------------------------------------------------------------

TASK_CASES: dict[str, tuple[bytes, tuple[str, ...]]] = {
    "frontmatter_bad_yaml": (b"---\ntitle: [unclosed\nexecutor: shell\n---\n- [ ] 1. a\n",
                             (f"{TASK}:", "frontmatter", "YAML")),
    "frontmatter_not_closed": (b"---\ntitle: x\nexecutor: shell\n- [ ] 1. a\n",
                               (f"{TASK}:1:", "never closed")),
    "no_steps": (b"---\ntitle: x\n---\n# Plan\n\nJust prose, no checklist.\n",
                 (TASK, "no steps")),
    "bulletless_checkboxes": (b"# Plan\n[ ] 1. a\n[ ] 2. b\n",
                              (TASK, "not list items", "line 2")),
    "not_utf8": (b"# Plan\n- [ ] 1. caf\xe9\n",
                 (f"{TASK}:2:", "UTF-8")),
}


@pytest.mark.parametrize("case", sorted(TASK_CASES))
def test_bad_task_file_is_one_line_naming_the_file(ws: Workspace, other: str, case: str) -> None:
    raw, needles = TASK_CASES[case]
    (ws.root / TASK).write_bytes(raw)
    before = snapshot(ws)
    one_line_error(ws.kiro("loop", "start", "--task", TASK), *needles)
    assert snapshot(ws) == before


def test_bad_frontmatter_value_names_file_line_and_key(ws: Workspace, other: str) -> None:
    ws.task(shell_task(1, extra_frontmatter="max_iterations: lots"))
    before = snapshot(ws)
    one_line_error(ws.kiro("loop", "start", "--task", TASK), f"{TASK}:4:", "max_iterations", "lots")
    assert snapshot(ws) == before


def test_missing_task_path(ws: Workspace, other: str) -> None:
    before = snapshot(ws)
    one_line_error(ws.kiro("loop", "start", "--task", "Specs/nope/tasks.md"), "Specs/nope/tasks.md", "not found")
    assert snapshot(ws) == before


# -- flags -----------------------------------------------------------------------------------------


def test_unknown_executor(ws: Workspace, other: str) -> None:
    before = snapshot(ws)
    one_line_error(ws.kiro("loop", "start", "--task", TASK, "--executor", "bogus"), "bogus", "shell")
    one_line_error(ws.kiro("loop", "resume", "--task-id", other, "--executor", "bogus"), "bogus", "shell")
    assert snapshot(ws) == before


@pytest.mark.parametrize("bad_id", ["a/b", "../escape"])
def test_task_id_with_a_slash(ws: Workspace, other: str, bad_id: str) -> None:
    before = snapshot(ws)
    one_line_error(ws.kiro("loop", "start", "--task", TASK, "--task-id", bad_id), repr(bad_id))
    one_line_error(ws.kiro("loop", "resume", "--task-id", bad_id), repr(bad_id))
    one_line_error(ws.run("loop", "status", "--task-id", bad_id), repr(bad_id))
    assert snapshot(ws) == before
    assert not (ws.root.parent / "escape").exists()


def test_resume_and_status_of_an_unknown_task_id(ws: Workspace, other: str) -> None:
    before = snapshot(ws)
    one_line_error(ws.kiro("loop", "resume", "--task-id", "nosuch"), "'nosuch'")
    one_line_error(ws.run("loop", "status", "--task-id", "nosuch"), "'nosuch'")
    assert snapshot(ws) == before


@pytest.mark.parametrize("args", [("--tail", "-5"), ("-n", "-1"), ("--tail=-2", "--follow")])
def test_a_negative_tail_is_one_line(ws: Workspace, other: str, args: tuple[str, ...]) -> None:
    """`logs --tail -5` printed nothing and exited 0."""
    before = snapshot(ws)
    run = ws.kiro if cli_inprocess.needs_a_process(args) else ws.run  # --follow: a process of its own
    one_line_error(run("loop", "logs", "--task-id", other, *args),
                   "--tail must be 0 or more", args[-1] if args[-1] != "--follow" else "-2")
    assert snapshot(ws) == before


# -- corrupt state ---------------------------------------------------------------------------------


@pytest.fixture
def corrupt(ws: Workspace) -> tuple[str, Path]:
    """The loop `t` of `ws`, stopped at iteration 2 of 3 with a backup every iteration, its state file then
    torn; and that state file."""
    return "t", ws.root / ".state/autonomous_loop_t.json"


@pytest.fixture
def corrupt_without_a_backup(ws: Workspace) -> tuple[str, Path]:
    """That loop of `ws`, its backups gone; and its state file."""
    return "t", ws.root / ".state/autonomous_loop_t.json"


def test_corrupt_state_read_commands_fall_back_to_the_newest_backup_and_say_so(
        ws: Workspace, corrupt: tuple[str, Path]) -> None:
    tid, main = corrupt
    torn = main.read_bytes()
    r = ws.run("loop", "status", "--task-id", tid, "--json")
    assert r.returncode == 0, r.stderr
    warned(r, ".state/autonomous_loop_t.json", ".state/backups/")
    row = json.loads(r.stdout)
    assert row["task_id"] == tid and row["iteration"] == 2
    r = ws.run("loop", "state", "--task-id", tid)
    assert r.returncode == 0, r.stderr
    warned(r, ".state/autonomous_loop_t.json", "backup")
    assert json.loads(r.stdout)["iteration"] == 2
    assert main.read_bytes() == torn  # reading never "repairs" the evidence


def test_corrupt_state_shows_in_the_table_from_its_backup(ws: Workspace, corrupt: tuple[str, Path]) -> None:
    tid, _main = corrupt
    r = ws.run("loop", "status", "--json")
    assert r.returncode == 0, r.stderr
    warned(r, ".state/autonomous_loop_t.json", "backup")
    assert [row["task_id"] for row in json.loads(r.stdout)] == [tid]


def test_start_refuses_a_task_whose_unfinished_loop_has_a_corrupt_state(ws: Workspace,
                                                                        corrupt: tuple[str, Path]) -> None:
    before = snapshot(ws)
    r = ws.kiro("loop", "start", "--task", TASK)
    one_line_error(r, "kiro loop resume --task-id t")
    assert snapshot(ws) == before


def test_corrupt_state_resume_continues_from_the_backup_and_says_so(
        ws: Workspace, corrupt: tuple[str, Path]) -> None:
    tid, _main = corrupt
    r = ws.kiro("loop", "resume", "--task-id", tid, "--max-iterations", "10")
    assert r.returncode == 0, r.stdout + r.stderr
    warned(r, ".state/autonomous_loop_t.json", ".state/backups/")
    st = ws.state(tid)
    assert st["status"] == "completed" and st["iteration"] == 3
    # the backup was taken after step 2 completed: nothing ran twice
    assert (ws.root / "side_effects.log").read_text().split() == ["1", "2", "3"]


def test_corrupt_state_without_a_backup_is_one_line_naming_the_state_file(
        ws: Workspace, corrupt_without_a_backup: tuple[str, Path]) -> None:
    tid, main = corrupt_without_a_backup
    before = snapshot(ws)
    for cmd in ("status", "resume", "state", "progress"):
        run = ws.kiro if cmd == "resume" else ws.run  # resume runs a loop: a process of its own
        one_line_error(run("loop", cmd, "--task-id", tid), ".state/autonomous_loop_t.json")
    # a fresh start of the same task refuses too, rather than silently dropping the old loop
    r = ws.kiro("loop", "start", "--task", TASK, "--task-id", "t")
    one_line_error(r, ".state/autonomous_loop_t.json")
    assert snapshot(ws) == before


def test_corrupt_state_without_a_backup_is_named_by_the_table(ws: Workspace,
                                                             corrupt_without_a_backup: tuple[str, Path]) -> None:
    r = ws.run("loop", "status", "--json")
    assert r.returncode == 0, r.stderr
    warned(r, ".state/autonomous_loop_t.json")
    assert json.loads(r.stdout) == []


# -- the agent program is missing -------------------------------------------------------------------


def test_resume_with_a_missing_executor_program_is_one_line_and_changes_nothing(ws: Workspace,
                                                                                 other: str) -> None:
    config(ws, "executor_command: /nonexistent/bin/agent-cli --yes\n")
    before = snapshot(ws)
    r = ws.kiro("loop", "resume", "--task-id", other, "--max-iterations", "5", "--executor", "command")
    line = one_line_error(r, "/nonexistent/bin/agent-cli")
    assert re.search(r"not found|does not exist|no such", line, re.I), line
    assert snapshot(ws) == before  # no iteration spent, no box marked in progress


def test_start_with_a_missing_executor_program_creates_no_loop(ws: Workspace, other: str) -> None:
    config(ws, "executor_command: definitely-not-an-agent-cli-xyz -p\n")
    before = snapshot(ws)
    r = ws.kiro("loop", "start", "--task", TASK, "--executor", "command")
    one_line_error(r, "definitely-not-an-agent-cli-xyz", "PATH")
    assert snapshot(ws) == before


# -- the attacks that still worked -------------------------------------------------------------------
# Issue "Hold against the attacks that still work", items 7 and 11, and "What a new user hit", item 8: each
# case runs on its own copy of a workspace that holds an unfinished loop, beside an empty folder; the
# whole folder around both is compared before and after, so a file made outside the workspace counts.


def tree(root: Path) -> dict[str, bytes | None]:
    """Every file (its bytes) and folder (None) under `root`; lock files (empty flock targets) left out."""
    return {p.relative_to(root).as_posix(): None if p.is_dir() else p.read_bytes()
            for p in sorted(root.rglob("*")) if not p.name.endswith(".lock")}


def scheduled(value: str) -> Callable[[Path], None]:
    def write(root: Path) -> None:
        (root / TASK).write_text(shell_task(2, extra_frontmatter=f"schedule: {value}"))
    return write


def configured(extra: str) -> Callable[[Path], None]:
    def write(root: Path) -> None:
        (root / "config/autonomous_loop.yaml").write_text(FAST_CONFIG + extra)
    return write


def kiro_task_id(value: str) -> Callable[[Path], None]:
    def write(root: Path) -> None:
        (root / TASK).write_text(shell_task(2, extra_frontmatter=f"kiro_task_id: {value}"))
    return write


START = ("loop", "start", "--task", TASK)
ATTACKS: dict[str, tuple[Callable[[Path], None] | None, str, tuple[str, ...], tuple[str, ...]]] = {
    # name: (what to write in the workspace first, where kiro runs: "vault" or the empty folder "bare",
    #        the command ({here} is the case's folder), what the one error line must say)
    "--detach --task-id ../../X": (None, "vault", (*START, "--detach", "--task-id", "../../X"),
                                   ("invalid task id", "'../../X'")),
    "--detach --task-id /abs/X": (None, "vault", (*START, "--detach", "--task-id", "{here}/abs/X"),
                                  ("invalid task id",)),
    "--detach --task-id of 300 characters": (None, "vault", (*START, "--detach", "--task-id", "d" * 300),
                                             ("invalid task id", "300 characters")),
    "resume --detach --task-id ../../X": (None, "vault", ("loop", "resume", "--detach", "--task-id", "../../X"),
                                          ("invalid task id", "'../../X'")),
    "NUL in state_directory": (configured('  state_directory: "st\\0ate"\n'), "vault", START,
                               ("config/autonomous_loop.yaml:4:", "state_directory", "NUL")),
    "--task of 5,000 characters": (None, "vault", ("loop", "start", "--task", "t" * 5000),
                                   ("task file", "5000 characters")),
    "--workspace of 5,000 characters": (None, "vault", ("loop", "status", "--workspace", "w" * 5000),
                                        ("workspace", "5000 characters", "File name too long")),
    "kiro_task_id of 300 characters": (kiro_task_id("k" * 300), "vault", START,
                                       (f"{TASK}:4:", "kiro_task_id", "300 characters")),
    "stop --reason not UTF-8": (None, "vault", ("loop", "stop", "--task-id", "other", "--reason", "bad\udcffbyte"),
                                ("--reason", "UTF-8", "0xff")),
    "llm.base_url port 99999": (configured("llm:\n  base_url: http://127.0.0.1:99999/v1\n"), "vault",
                                (*START, "--executor", "openai"), ("llm.base_url", "65535")),
    'schedule "0 0 31 2 *"': (scheduled('"0 0 31 2 *"'), "vault", START, (f"{TASK}:4:", "never fires")),
    'schedule "0 0 31 4,6,9,11 *"': (scheduled('"0 0 31 4,6,9,11 *"'), "vault", START,
                                     (f"{TASK}:4:", "never fires")),
    "schedule {every: 99999999999d}": (scheduled("{every: 99999999999d}"), "vault", START,
                                       (f"{TASK}:4:", "schedule.every", "100 years")),
    "stop --all in a folder that is no workspace": (None, "bare", ("loop", "stop", "--all"),
                                                   ("is not a kiro workspace", "kiro init")),
    "watch --detach in a folder that is no workspace": (None, "bare", ("loop", "watch", "--detach"),
                                                       ("is not a kiro workspace", "kiro init")),
}


def _end_background(here: Path) -> None:
    """A supervisor a failing case left running in the background (the previous release's watch --detach)."""
    for pid_file in here.rglob("watch.pid"):
        with contextlib.suppress(ValueError, OSError):
            os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)


def test_the_attacks_that_still_worked_are_one_line_and_change_nothing(ws: Workspace, other: str,
                                                                      tmp_path: Path) -> None:
    held, failed = 0, []
    for n, (name, (setup, where, args, needles)) in enumerate(ATTACKS.items()):
        here = tmp_path / f"case{n}"
        shutil.copytree(ws.root, here / "vault", symlinks=True)
        (here / "bare").mkdir()
        if setup is not None:
            setup(here / "vault")
        before = tree(here)
        line = [a.replace("{here}", str(here)) for a in args]
        if cli_inprocess.needs_a_process(line):
            r = cli_forkserver.run(line, cwd=here / where, env=ws.env(), timeout=120)
        else:  # a refusal of a command that needs no process of its own: in this process
            r = cli_inprocess.run(line, cwd=here / where, env=ws.env())
        _end_background(here)
        try:
            one_line_error(r, *needles)
            made = sorted(tree(here).keys() ^ before.keys())
            assert not made, f"made or removed {made[:3]}"
            assert tree(here) == before, "changed a file"
        except AssertionError as exc:
            failed.append(f"{name}: {' '.join(str(exc).split())[:300]}")
            print(f"broke  {name}")
        else:
            held += 1
            print(f"held   {name}: {r.stderr.strip()[:160]}")
    print(f"attacks that still worked: tried {len(ATTACKS)}, held {held}")
    assert not failed, "\n".join(failed)


def test_post_api_loops_with_a_task_id_out_of_the_workspace_makes_no_file(ws: Workspace, other: str,
                                                                          tmp_path: Path) -> None:
    from tests.serve_helpers import start_server, stop_loops

    served = start_server(ws)
    try:
        def files() -> dict[str, bytes]:  # the running server rewrites Dashboard.md on its own schedule
            return {k: v for k, v in snapshot(ws).items() if k != "Dashboard.md"}

        before = files()
        for bad in ("../../X", f"{tmp_path}/abs/X", "d" * 300):
            r = served.post("/api/loops", {"task": TASK, "options": {"task_id": bad}})
            assert r.status_code == 400, (bad, r.status_code, r.text)
            assert "invalid task id" in r.text, r.text
        assert files() == before
        assert not (tmp_path / "X.out").exists() and not (tmp_path / "abs").exists()
    finally:
        served.stop()
        stop_loops(ws.root)


# -- words a terminal would obey ---------------------------------------------------------------------

ESCAPES = {  # what a hostile task file or agent writes, and what it would do to the person's terminal
    "OSC 52 (write the clipboard)": "\x1b]52;c;ZXZpbA==\x07",
    "OSC 0 (set the title), ST-ended": "\x1b]0;pwned\x1b\\",
    "clear the screen": "\x1b[2J",
    "hide what follows": "\x1b[8m",
    "carriage return (overwrite the line)": "\r",
}


def test_a_task_file_or_steps_output_sends_no_control_sequence_to_the_terminal(ws: Workspace) -> None:
    """A step title and a step's output holding terminal escapes reached every line kiro printed of them
    (the event lines, the status table, the detail view, progress, logs, history) as they were: a task
    file or an agent could write the person's clipboard, set the window's title, clear the screen or hide
    text. They are shown as `cat -v` shows them (^[), on a terminal's path (rich) too."""
    from kiro.views import console

    words = "".join(ESCAPES.values())
    printed = words.replace("\\", "\\\\").replace("\x1b", "\\033").replace("\x07", "\\007").replace("\r", "\\r")
    markup = "[link=https://evil.example]docs[/link]"  # rich markup: on a terminal, a hyperlink (OSC 8)
    ws.task(f"---\ntitle: t\n---\n- [ ] 1. {markup} {words} now\n  ```sh\n  printf '{printed}\\n'; exit 1\n"
            f"  ```\n")
    runs = {"start": ws.kiro("loop", "start", "--task", TASK, "--task-id", "esc", "--failure-threshold", "1")}
    for args in (("status",), ("status", "--task-id", "esc"), ("progress", "--task-id", "esc"),
                 ("logs", "--task-id", "esc"), ("history",)):
        runs[" ".join(args)] = ws.run("loop", *args, env=ws.env(COLUMNS="400"))
    assert runs["start"].returncode == 5, runs["start"].stderr
    held = 0
    for what, r in runs.items():
        out = r.stdout + r.stderr
        ok = "Traceback" not in out and not any(c in out for c in ("\x1b", "\x07", "\r"))
        held += ok
        print(f"{'held' if ok else 'OBEYED'}: kiro loop {what}")
    event = {"event": "step_failed", "ts": "2026-11-27T00:00:00", "iteration": 1, "step_id": "1", "attempt": 1,
             "error": words}
    rich_line = console.format_event(event)
    assert rich_line is not None and not any(c in rich_line.plain for c in ("\x1b", "\x07", "\r"))
    print(f"terminal escapes: {len(ESCAPES)} kinds in a title and an output; {held} of {len(runs)} commands held")
    assert held == len(runs)
    assert "^[]52;c;ZXZpbA==^G" in runs["start"].stdout  # shown, not obeyed
    assert markup in runs["progress --task-id esc"].stdout  # shown as written, not rendered
