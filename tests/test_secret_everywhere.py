"""A known secret planted in everything a person writes into a task, then looked for everywhere kiro
writes (issue #5's rule: no secret kiro knows of reaches any file, log, prompt or report).

The secret is an environment variable named like a token, so the run's redactor knows it. It is put in
the task's title, a key of the person's own, `instructions`, a heading, numbered and unnumbered step
titles (an unnumbered step's text is its id), a step's details, what a step prints, the verify command
and what it prints. The loop runs with git checkpoints, fails at its last step (an escalation report),
is rolled back to the unnumbered step, and every read command is run. Then every file under the
workspace (but the person's own task file and config), every git object (commit messages included) and
every command's output is searched. The test prints what it searched; it fails on any hit. Before
2026-11-27 the loop's summary file, the checkpoint commit messages and the rollback's held it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import Workspace
from tests.gitutil import git, init_repo

SECRET = "tok-planted-" + "3" * 24
TASK = f"""\
---
title: Ship it with {SECRET}
owner_note: ask for {SECRET}
instructions: use {SECRET} when asked
executor: shell
verify: echo "verified with {SECRET}"
---
# Plan for {SECRET}
- [ ] Deploy with {SECRET}
  ```sh
  echo two > two.txt
  ```
- [ ] 2. Write the file {SECRET}
  - detail: the token is {SECRET}
  ```sh
  echo "writing with $ACME_SERVICE_TOKEN" && echo one > one.txt
  ```
- [ ] 3. Fail loudly {SECRET}
  ```sh
  echo "failing with $ACME_SERVICE_TOKEN"; exit 1
  ```
"""
CONFIG = "autonomous_loop:\n  failure_threshold: 1\n  backoff_base_seconds: 0.01\ncheckpoints: git\n"
PERSONS = {"config/autonomous_loop.yaml"}  # the person's own files (and the task file, wherever it moved)


def _files_holding(root: Path) -> tuple[int, list[str]]:
    needle = SECRET.encode()
    scanned, found = 0, []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if rel.startswith(".git/") or rel in PERSONS or rel.endswith("/loud/tasks.md"):
            continue
        if p.is_file() and not p.is_symlink():
            scanned += 1
            if needle in p.read_bytes():
                found.append(rel)
    return scanned, found


def _objects_holding(root: Path) -> tuple[int, list[str]]:
    """Every object in the repository (loose or packed), as git reads it back."""
    listed = git(root, "cat-file", "--batch-all-objects", "--batch-check=%(objectname) %(objecttype)").split("\n")
    names = [line.split()[0] for line in listed if line.strip()]
    dump = subprocess.run(["git", "cat-file", "--batch"], cwd=root, input=("\n".join(names) + "\n").encode(),
                          capture_output=True, check=True).stdout
    found = [n for n in names if SECRET.encode() in subprocess.run(
        ["git", "cat-file", "-p", n], cwd=root, capture_output=True).stdout] if SECRET.encode() in dump else []
    return len(names), found


def test_a_secret_planted_in_every_field_of_a_task_reaches_no_file_commit_or_output(ws: Workspace) -> None:
    init_repo(ws.root)
    ws.write("config/autonomous_loop.yaml", CONFIG)
    ws.task(TASK, rel="Specs/loud/tasks.md")
    env = ws.env(ACME_SERVICE_TOKEN=SECRET)
    outputs: list[tuple[str, str]] = []

    def kiro(*args: str) -> str:
        r = ws.kiro(*args, env=env)
        outputs.append((" ".join(args), r.stdout + r.stderr))
        return r.stdout

    kiro("loop", "start", "--task", "Specs/loud/tasks.md", "--task-id", "loud")
    state = ws.state("loud")
    assert state["status"] == "failed" and len(state["completed_steps"]) == 2, state["status"]
    assert (ws.root / "Needs_Action/escalation_loud.md").exists()
    for args in (("loop", "status"), ("loop", "status", "--json"), ("loop", "progress", "--task-id", "loud"),
                 ("loop", "state", "--task-id", "loud"), ("loop", "logs", "--task-id", "loud"),
                 ("loop", "history", "--task-id", "loud"), ("loop", "stats")):
        kiro(*args)
    kiro("loop", "rollback", "--task-id", "loud", "--to-step", f"Deploy with {SECRET}")
    rolled = [e for e in ws.events("loud") if e["event"] == "rolled_back"]
    assert len(rolled) == 1, outputs[-1]
    kiro("loop", "logs", "--task-id", "loud")

    files, in_files = _files_holding(ws.root)
    objects, in_objects = _objects_holding(ws.root)
    in_outputs = [cmd for cmd, out in outputs if SECRET in out]
    commits = git(ws.root, "log", "--all", "--format=%s").splitlines()
    print(f"planted in 10 places of the task; searched {files} files, {objects} git objects ({len(commits)} commits) "
          f"and {len(outputs)} command outputs: {len(in_files) + len(in_objects) + len(in_outputs)} held it")
    assert in_files == [] and in_objects == [] and in_outputs == []
    assert any("[REDACTED]" in subject for subject in commits), commits
