"""`kiro loop start` and `resume` without Typer (kiro.faststart, issue #12): a plain command line is read
by kiro itself and run by the same code as the Typer command (kiro.launch); anything unusual is left to
Typer. The same command lines, run both ways in twin workspaces, print the same lines, end with the
same exit code and leave the same files."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kiro import faststart
from tests.conftest import Workspace, shell_task

TASK = "Specs/feature/tasks.md"

PROBE = """
import json, sys
from kiro import faststart
code = faststart.run(sys.argv[1:])
sys.stdout.flush()
sys.stderr.write("\\n@@" + json.dumps({"code": code, "modules": sorted(sys.modules)}) + "\\n")
"""


@pytest.mark.parametrize(("command", "args", "options"), [
    ("start", ["--task", "a.md"], {"task": ["a.md"]}),
    ("start", ["-t", "a.md", "--task=b.md", "--task-id", "x", "-q", "--verbose"],
     {"task": ["a.md", "b.md"], "task_id": "x", "quiet": True, "verbose": True}),
    ("start", ["--task", "a.md", "--max-iterations", "3", "--failure-threshold=2", "--timeout", "2.5",
               "--executor", "shell", "--model", "m", "--agent", "claude", "--config", "c.yaml", "-w", "ws",
               "--detach"],
     {"task": ["a.md"], "max_iterations": 3, "failure_threshold": 2, "timeout": 2.5, "executor": "shell",
      "model": "m", "agent": "claude", "config": Path("c.yaml"), "workspace_path": Path("ws"), "detached": True}),
    ("start", ["--task", "a.md", "--timeout", ".5", "--model", "a", "--model", "b"],
     {"task": ["a.md"], "timeout": 0.5, "model": "b"}),
    ("resume", [], {}),
    ("resume", ["--task-id", "x", "--reset-failures", "--all", "--max-iterations", "10"],
     {"task_id": "x", "reset_failures": True, "all_loops": True, "max_iterations": 10}),
    ("resume", ["--task", "a.md", "-q"], {"task": "a.md", "quiet": True}),
])
def test_plain_command_lines_are_read_as_typer_reads_them(command: str, args: list[str],
                                                          options: dict[str, object]) -> None:
    assert faststart.parse(command, args) == options


@pytest.mark.parametrize("args", [
    [],  # --task is missing: Typer says so
    ["--task", "a.md", "-h"], ["--help"], ["--task", "a.md", "extra"], ["--task", "a.md", "--"],
    ["-qv", "--task", "a.md"], ["-ta.md"], ["--task"], ["--task", ""], ["--task", "-q"],
    ["--task", "a.md", "--max-iterations", "-1"], ["--task", "a.md", "--max-iterations", "1e3"],
    ["--task", "a.md", "--max-iterations", "1_000"], ["--task", "a.md", "--max-iterations", "٣"],
    ["--task", "a.md", "--max-iterations", " 3"], ["--task", "a.md", "--timeout", "inf"],
    ["--task", "a.md", "--timeout", "."], ["--task", "a.md", "--timeout", "1.2.3"],
    ["--task", "a.md", "--quiet=yes"], ["--task", "a.md", "--all"], ["--task", "a.md", "--no-detach"],
    ["--task", "a.md", "--reset-failures"],
])
def test_anything_unusual_is_left_to_typer(args: list[str]) -> None:
    with pytest.raises(faststart.Fallback):
        faststart.parse("start", args)


def test_resume_has_no_short_task_option() -> None:
    with pytest.raises(faststart.Fallback):
        faststart.parse("resume", ["-t", "a.md"])


def test_only_start_and_resume_and_not_when_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    for argv in (["loop", "stop", "--task-id", "x"], ["loop"], ["init"], ["loop", "start", "--help"]):
        assert faststart.run(argv) is None
    monkeypatch.setenv("KIRO_NO_FAST_START", "1")
    assert faststart.run(["loop", "start", "--task", "a.md"]) is None


def test_a_run_through_the_fast_path_imports_no_typer(ws: Workspace) -> None:
    ws.task(shell_task(2))
    r = subprocess.run([sys.executable, "-c", PROBE, "loop", "start", "--task", TASK, "--task-id", "t1"],
                       cwd=ws.root, env=ws.env(), capture_output=True, text=True, timeout=60)
    report = json.loads(r.stderr.rsplit("@@", 1)[1])
    assert report["code"] == 0, r.stderr
    assert "completed" in r.stdout
    assert not [m for m in report["modules"] if m.split(".")[0] in ("typer", "click")]
    assert ws.state("t1")["status"] == "completed"


def _scrub(text: str, root: Path) -> str:
    """What differs between two runs made the same: the workspace, clock times, pids, generated task ids,
    durations."""
    text = text.replace(str(root), "<ws>")
    text = re.sub(r"\d{4}-?\d\d-?\d\dT[0-9:.+-]+Z?", "<timestamp>", text)
    text = re.sub(r"\b\d\d:\d\d:\d\d\b", "<time>", text)
    text = re.sub(r"pid \d+", "pid <pid>", text)
    text = re.sub(r"process \d+", "process <pid>", text)
    text = re.sub(r"task_\d{8}_\d{6}", "<id>", text)
    return re.sub(r"\d+(\.\d+)?s\b", "<secs>", text)


def _normal(text: str, root: Path) -> str:
    """Output scrubbed, its lines sorted: two loops in one process print in the order they happen to run."""
    return "\n".join(sorted(_scrub(text, root).splitlines()))


def _files(root: Path) -> dict[str, str]:
    """What a run leaves that a person reads: task files (boxes), state status and counters, step output."""
    found = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_file() and p.suffix == ".md" and rel.startswith(("Specs", "Done", "Needs_Action")):
            found[rel] = _scrub(p.read_text(), root)
        elif p.is_file() and p.name == "side_effects.log":  # sorted: two loops in one process interleave
            found[rel] = "".join(sorted(p.read_text().splitlines(keepends=True)))
        elif p.is_file() and p.name == "read_path.json":  # kiro.fastread's stamp, written on success only
            found[rel] = "written"
    for tid in ("t1", "t2"):
        try:
            s = Workspace(root).state(tid)
        except AssertionError:
            continue
        found[f"state {tid}"] = json.dumps([s["status"], s["iteration"], s["total_successes"],
                                            s["total_failures"], [c["step_id"] for c in s["completed_steps"]]])
    return found


# Each scenario: commands run in order in one workspace; every command's (exit code, stdout, stderr)
# and, at the end, the workspace's files must be the same both ways.
SCENARIOS = {
    "completes": [("loop", "start", "--task", TASK, "--task-id", "t1")],
    "quiet, then a second start is refused": [("loop", "start", "--task", TASK, "--task-id", "t1", "-q",
                                                "--max-iterations", "1"),
                                               ("loop", "start", "--task", TASK, "--task-id", "t1")],
    "max iterations, resumed with a higher cap": [("loop", "start", "--task", TASK, "--task-id", "t1",
                                                   "--max-iterations", "1"),
                                                  ("loop", "resume", "--task-id", "t1", "--max-iterations", "10"),
                                                  ("loop", "resume", "--task-id", "t1")],
    "resumed by its task file": [("loop", "start", "--task", TASK, "--task-id", "t1", "--max-iterations=2"),
                                 ("loop", "resume", "--task", TASK, "-v")],
    "two tasks in one process": [("loop", "start", "--task", TASK, "-t", "Specs/other/tasks.md")],
    "bad input": [("loop", "start", "--task", "Specs/nope/tasks.md"),
                  ("loop", "start", "--task", TASK, "--executor", "bogus"),
                  ("loop", "start", "--task", TASK, "-t", "Specs/other/tasks.md", "--task-id", "t1"),
                  ("loop", "start", "--task", TASK, "--config", "config/missing.yaml"),
                  ("loop", "start", "--task", TASK, "--max-iterations", "0"),
                  ("loop", "resume", "--task-id", "nobody"),
                  ("loop", "resume"),
                  ("loop", "resume", "--all", "--task-id", "t1")],
    "failing step": [("loop", "start", "--task", "Specs/fails/tasks.md", "--task-id", "t2",
                      "--failure-threshold", "1")],
    "resume --all with nothing paused": [("loop", "resume", "--all")],
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_both_ways_print_the_same_and_leave_the_same_files(tmp_path: Path, ws: Workspace, name: str) -> None:
    ws.task(shell_task(3))
    ws.task(shell_task(2), rel="Specs/other/tasks.md")
    ws.task(shell_task(2, cmd="exit 7"), rel="Specs/fails/tasks.md")
    twin = Workspace(tmp_path / "twin")
    shutil.copytree(ws.root, twin.root)
    for command in SCENARIOS[name]:
        fast = ws.kiro(*command)
        typer = twin.kiro(*command, env=twin.env(KIRO_NO_FAST_START="1"))
        seen = [(r.returncode, _normal(r.stdout, w.root), _normal(r.stderr, w.root))
                for r, w in ((fast, ws), (typer, twin))]
        assert seen[0] == seen[1], command
        assert "Traceback" not in fast.stderr + typer.stderr
    assert _files(ws.root) == _files(twin.root)
