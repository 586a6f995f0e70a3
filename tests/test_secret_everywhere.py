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

import json
import shlex
import subprocess
import sys
import textwrap
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
    """The files whose name or bytes hold the secret."""
    needle = SECRET.encode()
    scanned, found = 0, []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if rel.startswith(".git/") or rel in PERSONS or rel.endswith("/loud/tasks.md"):
            continue
        if SECRET in rel:
            found.append(rel)
        elif p.is_file() and not p.is_symlink():
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


AGENT = """\
import os, pathlib, re, sys
seen = pathlib.Path(sys.argv[1])
step, attempt = os.environ["KIRO_STEP_ID"], os.environ["KIRO_ATTEMPT"]
(seen / f"prompt_{len(list(seen.iterdir()))}.txt").write_text(sys.stdin.read())
print("working with", os.environ["ACME_SERVICE_TOKEN"])
task = pathlib.Path(os.environ["KIRO_TASK_FILE"])
task.write_text(re.sub(r"- \\[[ -]\\] " + re.escape(step), "- [x] " + step, task.read_text(), count=1))
"""


def test_an_agent_clis_prompt_attempt_logs_and_their_names_hold_no_planted_secret(ws: Workspace,
                                                                                  tmp_path: Path) -> None:
    """With an agent CLI (the command executor): the prompt it is sent, its attempt logs
    (`Logs/<task_id>/<step_id>-<attempt>.log`, named by the step's id, which for a step with no number
    is its text) and everything else kiro writes hold no planted secret."""
    seen = tmp_path / "seen"  # outside the workspace: what the agent was sent
    seen.mkdir()
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT)
    command = f"{shlex.quote(sys.executable)} {shlex.quote(str(agent))} {shlex.quote(str(seen))}"
    ws.write("config/autonomous_loop.yaml", f"executor_command: {json.dumps(command)}\n"
             f"sandbox_paths: {{rw: [{json.dumps(str(seen))}]}}\n"  # the step's box may write `seen`
             "agent_env: {pass: [ACME_SERVICE_TOKEN]}\n")  # the person's grant: the agent prints the secret
    ws.task(textwrap.dedent(f"""\
        ---
        title: Agent work for {SECRET}
        executor: command
        instructions: the token is {SECRET}
        ---
        - [ ] Deploy with {SECRET}
        - [ ] Announce {SECRET} {"and more words " * 20}
        """), rel="Specs/loud/tasks.md")
    r = ws.kiro("loop", "start", "--task", "Specs/loud/tasks.md", "--task-id", "cli",
                env=ws.env(ACME_SERVICE_TOKEN=SECRET))
    assert r.returncode == 0, r.stdout + r.stderr
    logs = sorted(p.name for p in (ws.root / "Logs/cli").iterdir())
    assert len(logs) == 2 and logs[1] == "Deploy_with__REDACTED_-1.log", logs
    assert logs[0].startswith("Announce__REDACTED__and_more_words_") and len(logs[0]) == 80 + 13 + len("-1.log"), logs
    files, in_files = _files_holding(ws.root)
    prompts = sorted(seen.iterdir())
    in_prompts = [p.name for p in prompts if SECRET in p.read_text()]
    print(f"agent CLI: searched {files} files and their names, {len(prompts)} prompts and the command's output: "
          f"{len(in_files) + len(in_prompts) + (SECRET in r.stdout + r.stderr)} held it")
    assert len(prompts) == 2 and in_files == [] and in_prompts == [] and SECRET not in r.stdout + r.stderr


def test_a_message_to_a_loop_is_cut_of_the_secrets_the_config_names(ws: Workspace) -> None:
    """`kiro loop tell` stores the message in the loop's inbox: a value the config names as secret
    (`secret_env`: a name the environment-wide rules would not take for a secret) is cut there too."""
    ws.write("config/autonomous_loop.yaml", "secret_env: [DB_WORD]\n")
    ws.task("---\ntitle: t\nexecutor: shell\n---\n- [ ] 1. one\n  ```sh\n  true\n  ```\n", rel="Specs/m/tasks.md")
    env = ws.env(DB_WORD=SECRET)
    assert ws.kiro("loop", "start", "--task", "Specs/m/tasks.md", "--task-id", "m", env=env).returncode == 0
    r = ws.run("loop", "tell", "--task-id", "m", f"the database word is {SECRET}", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    files, found = _files_holding(ws.root)
    inbox = [p for p in (ws.root / ".state").rglob("*") if p.is_file() and b"the database word is" in p.read_bytes()]
    assert found == [] and len(inbox) == 1 and b"the database word is [REDACTED]" in inbox[0].read_bytes()


def test_the_openai_agent_is_sent_no_planted_secret_and_writes_none(ws: Workspace) -> None:
    """With kiro's own agent against the scripted server: a secret in the task's title, `instructions`,
    a step's title and details, and in a file the agent reads, reaches no request sent to the model (the
    system and step prompts, tool results) and no file kiro writes (transcript, memory, state, events).
    The model echoes it back in a summary and a memory: cut there too."""
    from tests.fake_openai import FakeOpenAI, call

    (ws.root / "notes.txt").write_text(f"the deploy token is {SECRET}\n")
    ws.task(textwrap.dedent(f"""\
        ---
        title: Agent for {SECRET}
        executor: openai
        instructions: mention {SECRET} nowhere
        ---
        - [ ] 1. Read the notes about {SECRET}
          - detail: {SECRET}
        """), rel="Specs/loud/tasks.md")
    with FakeOpenAI() as fake:
        fake.reply(tool_calls=[call("read_file", {"path": "notes.txt"})])
        fake.reply(tool_calls=[call("memory_save", {"content": f"token {SECRET}", "type": "fact"})])
        fake.reply(tool_calls=[call("complete_step", {"summary": f"read it: {SECRET}"})])
        ws.write("config/autonomous_loop.yaml", f"llm:\n  base_url: {json.dumps(fake.base_url)}\n")
        r = ws.kiro("loop", "start", "--task", "Specs/loud/tasks.md", "--task-id", "agent",
                    env=ws.env(ACME_SERVICE_TOKEN=SECRET))
        assert r.returncode == 0, r.stdout + r.stderr
        bodies = [json.dumps(req.body) for req in fake.chat_requests]
    assert len(bodies) == 3 and "[REDACTED]" in bodies[0] and "the deploy token is [REDACTED]" in bodies[1]
    files, in_files = _files_holding(ws.root)
    in_files = [f for f in in_files if f != "notes.txt"]  # the person's own notes hold it, as they wrote it
    in_requests = [i for i, b in enumerate(bodies) if SECRET in b]
    held = len(in_files) + len(in_requests)
    print(f"openai agent: searched {files} files and {len(bodies)} requests: {held} held it")
    assert in_files == [] and in_requests == [] and SECRET not in r.stdout + r.stderr
