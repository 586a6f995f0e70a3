"""The box a step runs in (issue #28): Debian's bubblewrap around shell steps, verify, an agent CLI
(here a hostile one: a shell script given as `executor_command`) and `run_command`.

Each attack a prompt injection would try is run from inside a step, the way the step would: read a
planted `~/.ssh/id_ed25519` and `~/.aws/credentials`, write `../outside`, write kiro's own folders
(`.state/`, `.hooks/`, `config/`, `.git/config`, `.git/hooks/pre-commit`), read kiro's environment
through `/proc/<kiro pid>/environ`, leave a process behind (`env -i setsid sleep`, which clears every
mark kiro's reapers look for), and `kill -9` kiro. The test then looks at the disk and the process
table (not at what the step says) and prints, per attack, whether it held. With `sandbox: bwrap` every
attack must hold; with `sandbox: off` the table shows what a person is exposed to without the box.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiro.processes import sandbox
from tests.conftest import AGENTS_CACHE, Workspace, shell_task

pytestmark = pytest.mark.skipif(sandbox.unusable() is not None, reason=f"no usable bwrap: {sandbox.unusable()}")

TASK = "Specs/feature/tasks.md"
SSH_KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nsandbox-test-key-3b1f\n-----END OPENSSH PRIVATE KEY-----\n"
AWS = "[default]\naws_secret_access_key = sandbox-test-aws-9c2e\n"
KIRO_SECRET = "sandbox-test-env-7d4a"  # in kiro's environment only: a step that reads it read kiro's environ

# What the hostile step runs, in the project directory. Each attack ends in `|| true`: the step goes
# on, and the test judges the attack by its effect on disk, not by what the step says. `kill` comes
# last: without the box it ends kiro, and the step with it. The step goes on from its leftover once it
# runs as `sleep {marker}` (its /proc/<pid>/cmdline; `[s]` keeps grep's own from matching): a look after
# kiro ended cannot miss one that was still starting.
ATTACKS = """\
cat "$HOME/.ssh/id_ed25519" > stolen_ssh_key 2>/dev/null || true
cat "$HOME/.aws/credentials" > stolen_aws 2>/dev/null || true
echo escaped > ../outside 2>/dev/null || true
echo escaped > .state/x 2>/dev/null || true
echo stop > ".hooks/stop_autonomous_loop.md" 2>/dev/null || true
echo 'verify: "touch pwned"' > config/x.yaml 2>/dev/null || true
printf '[core]\\n\\tfsmonitor = touch /tmp/pwned\\n' >> .git/config 2>/dev/null || true
printf '#!/bin/sh\\ntouch pwned\\n' > .git/hooks/pre-commit 2>/dev/null || true
while [ ! -s kiro.pid ]; do sleep 0.05; done
cat "/proc/$(cat kiro.pid)/environ" > stolen_environ 2>/dev/null || true
env -i setsid sleep {marker} > /dev/null 2>&1 < /dev/null &
until grep -qsa '^[s]leep.{marker}' /proc/[0-9]*/cmdline; do sleep 0.05; done
kill -9 "$(cat kiro.pid)" 2>/dev/null || true
echo attacks done
"""

HOSTILE_AGENT = """#!/bin/bash
# An agent CLI a prompt injection took over: it reads the prompt, then runs the attacks.
cat > /dev/null
bash attack.sh
"""


@pytest.fixture
def home(cli_home: Path) -> Path:
    """The HOME kiro runs with (outside /tmp), with a planted SSH key and AWS credentials."""
    (cli_home / ".ssh").mkdir()
    (cli_home / ".ssh" / "id_ed25519").write_text(SSH_KEY)
    (cli_home / ".aws").mkdir()
    (cli_home / ".aws" / "credentials").write_text(AWS)
    return cli_home


def sleepers(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "cmdline").read_bytes().split(b"\0")[:2] == [b"sleep", marker.encode()]:
                    found.append(int(entry.name))
    return found


@pytest.fixture
def marker() -> Iterator[str]:
    """A `sleep` argument no other process has: finds what a step left behind (and kills it after)."""
    mark = f"600.{uuid.uuid4().int % 10**9:09d}"
    yield mark
    for pid in sleepers(mark):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def git_init(root: Path) -> None:
    subprocess.run(["git", "init", "-q", str(root)], check=True)


def run_attacks(ws: Workspace, home: Path, marker: str, setting: str, *, agent: bool) -> tuple[dict[str, bool], int]:
    """Run the attacks as a shell step (or through a hostile agent CLI); returns {attack: held} and
    kiro's exit code."""
    git_init(ws.root)
    (ws.root / "attack.sh").write_text(ATTACKS.replace("{marker}", marker))
    config = f"sandbox: {setting}\nautonomous_loop:\n  failure_threshold: 1\n  max_step_retries: 0\n"
    if agent:
        agent_bin = ws.root.parent / "bin" / "hostile-agent"  # outside the project, under /tmp
        agent_bin.parent.mkdir()
        agent_bin.write_text(HOSTILE_AGENT)
        agent_bin.chmod(0o755)
        config += f"executor: command\nexecutor_command: {agent_bin}\ncommand_success: exit_code\n"
        ws.task("- [ ] 1. Do the work\n")
    else:
        ws.task("---\nexecutor: shell\n---\n- [ ] 1. Do the work\n  ```sh\n  bash attack.sh\n  ```\n")
    ws.write("config/autonomous_loop.yaml", config)
    env = ws.env(HOME=str(home), KIRO_TEST_SECRET=KIRO_SECRET)
    git_hooks = ws.root / ".git" / "hooks"
    before_git_config = (ws.root / ".git" / "config").read_text()
    proc = subprocess.Popen([sys.executable, "-m", "kiro", "loop", "start", "--task", TASK], cwd=ws.root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    (ws.root / "kiro.pid").write_text(str(proc.pid))
    out, _ = proc.communicate(timeout=120)
    left = sleepers(marker)  # the step went on once it ran: alive now unless its end took it
    held = {
        "read ~/.ssh/id_ed25519": "sandbox-test-key" not in _read(ws.root / "stolen_ssh_key"),
        "read ~/.aws/credentials": "sandbox-test-aws" not in _read(ws.root / "stolen_aws"),
        "write ../outside": not (ws.root.parent / "outside").exists(),
        "write .state/x": not (ws.root / ".state" / "x").exists(),
        "write .hooks/stop_autonomous_loop.md": not (ws.root / ".hooks" / "stop_autonomous_loop.md").exists(),
        "write config/x.yaml": not (ws.root / "config" / "x.yaml").exists(),
        "write .git/config": (ws.root / ".git" / "config").read_text() == before_git_config,
        "write .git/hooks/pre-commit": not (git_hooks / "pre-commit").exists(),
        "read /proc/<kiro pid>/environ": KIRO_SECRET not in _read(ws.root / "stolen_environ"),
        "leave `env -i setsid sleep` behind": not left,
        "kill -9 kiro": proc.returncode != -signal.SIGKILL,
    }
    print(f"\n{'agent CLI' if agent else 'shell step'} with sandbox: {setting} (kiro exit {proc.returncode})")
    for attack, ok in held.items():
        print(f"  {attack:40} {'held' if ok else 'ESCAPED'}")
    print(f"  {sum(held.values())} of {len(held)} held")
    if setting == "bwrap":
        assert proc.returncode == 0, out
        assert "attacks done" in json.dumps(ws.state(ws.only_task_id())), out
    return held, proc.returncode


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


@pytest.mark.parametrize("agent", [False, True], ids=["shell-step", "agent-cli"])
def test_every_attack_from_inside_a_step_holds_in_the_box(ws: Workspace, home: Path, marker: str,
                                                          agent: bool) -> None:
    held, _ = run_attacks(ws, home, marker, "bwrap", agent=agent)
    escaped = [attack for attack, ok in held.items() if not ok]
    assert not escaped, f"escaped the box: {escaped}"


@pytest.mark.parametrize("agent", [False, True], ids=["shell-step", "agent-cli"])
def test_without_the_box_the_table_shows_what_a_person_is_exposed_to(ws: Workspace, home: Path, marker: str,
                                                                      agent: bool) -> None:
    held, code = run_attacks(ws, home, marker, "off", agent=agent)
    assert len(held) == 11 and code is not None  # it ran; what held without the box is only printed


def test_a_three_step_task_and_verify_run_in_the_box(ws: Workspace, home: Path) -> None:
    """Steps and verify see the project read-write, kiro's folders read-only, an empty HOME and a /tmp
    of their own; the loop completes."""
    git_init(ws.root)
    ws.task(
        "---\nexecutor: shell\nverify: 'touch .state/verify_was_here 2>/dev/null || true; "
        "ls -A \"$HOME\" > verify_home; test -s step1'\n---\n"
        "- [ ] 1. Write\n  ```sh\n  echo one > step1; echo scratch > /tmp/scratch; ls -A \"$HOME\" > home_seen\n  ```\n"
        "- [ ] 2. Read\n  ```sh\n  cat step1 > step2; test ! -e /tmp/kiro-sandbox-outside-marker\n  ```\n"
        "- [ ] 3. Own tmp\n  ```sh\n  test -e /tmp/scratch && echo shared-tmp > step3 || echo own-tmp > step3\n"
        "  ```\n")
    outside_tmp = Path("/tmp/kiro-sandbox-outside-marker")
    outside_tmp.touch()
    try:
        r = ws.kiro("loop", "start", "--task", TASK, env=ws.env(HOME=str(home)))
    finally:
        outside_tmp.unlink()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "sandbox: bwrap (project read-write; .state .hooks config Logs .git" in r.stderr
    assert (ws.root / "step2").read_text() == "one\n"
    assert (ws.root / "step3").read_text() == "own-tmp\n"  # each step's /tmp is its own, gone after it
    assert not Path("/tmp/scratch").exists() or Path("/tmp/scratch").read_text() != "scratch\n"
    assert (ws.root / "home_seen").read_text() == ""  # .ssh and .aws are not there
    assert (ws.root / "verify_home").read_text() == ""
    assert not (ws.root / ".state" / "verify_was_here").exists()


def test_the_start_line_names_the_box_each_agent_step_runs_in(ws: Workspace, home: Path) -> None:
    """The loop's start line and the box an agent step runs in come from one place (executors.shell.loop_box):
    the line a person reads at start is the box the step's attempt log records, word for word (the task files
    read-only too: Specs/)."""
    agent_bin = ws.root.parent / "bin" / "quiet-agent"  # outside the project, under /tmp
    agent_bin.parent.mkdir()
    agent_bin.write_text("#!/bin/sh\ncat > /dev/null\necho done > agent_ran\n")
    agent_bin.chmod(0o755)
    ws.write("config/autonomous_loop.yaml", f"executor: command\nexecutor_command: {agent_bin}\n"
             "command_success: exit_code\nautonomous_loop:\n  failure_threshold: 1\n  max_step_retries: 0\n")
    ws.task("- [ ] 1. Do the work\n")
    r = ws.kiro("loop", "start", "--task", TASK, env=ws.env(HOME=str(home)))
    assert r.returncode == 0, r.stdout + r.stderr
    started = [x.removeprefix("sandbox: ") for x in r.stderr.splitlines() if x.startswith("sandbox: bwrap (")]
    logs = list((ws.root / "Logs").rglob("*.log"))
    recorded = [x.removeprefix("# sandbox: ") for log in logs for x in log.read_text().splitlines()
                if x.startswith("# sandbox: ")]
    print("start line:", started, "\nattempt log:", recorded)
    assert (ws.root / "agent_ran").exists()
    assert len(started) == 1 and recorded == started, r.stderr
    assert " Specs " in started[0]


def test_run_command_of_kiros_own_agent_runs_in_the_box(tmp_path: Path) -> None:
    import asyncio

    from tests.fake_openai import invoke, make_harness

    h = make_harness(tmp_path / "ws", tools={"shell": {"enabled": True, "allow": ["touch", "ls"]}})
    (tmp_path / "ws" / ".state").mkdir(exist_ok=True)

    async def go(command: str) -> str:
        return (await invoke(h.tool_env(), "run_command", {"command": command})).text

    refused = asyncio.run(go("touch .state/x"))
    written = asyncio.run(go("touch made_here"))
    print(f"run_command touch .state/x -> {refused.strip()[:120]}")
    assert "Read-only file system" in refused
    assert not (tmp_path / "ws" / ".state" / "x").exists()
    assert (tmp_path / "ws" / "made_here").exists(), written


def test_kill_9_of_kiro_mid_step_leaves_nothing_of_the_step_alive(ws: Workspace, home: Path, marker: str) -> None:
    """`env -i setsid` clears the marks kiro's reaper and ledger look for, and leaves the process
    group; only the box's PID namespace ends it when kiro dies (issue #27, item 4)."""
    ws.task("---\nexecutor: shell\n---\n- [ ] 1. Start things\n  ```sh\n"
            f"  env -i setsid sleep {marker} > /dev/null 2>&1 < /dev/null & sleep {marker} & echo go > started; wait\n"
            "  ```\n")
    proc = ws.spawn("loop", "start", "--task", TASK, env=ws.env(HOME=str(home)))
    ws.wait_for(lambda: (ws.root / "started").exists() and len(sleepers(marker)) >= 2, what="the step's sleepers")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    ws.wait_for(lambda: not sleepers(marker), timeout=20, what="every process of the step to end with kiro")


def test_stop_force_ends_a_boxed_step_and_all_it_started(ws: Workspace, home: Path, marker: str) -> None:
    """`kiro loop stop --force` ends the step now: SIGTERM to bwrap's process group reaches the command
    (it stays in bwrap's group: no --new-session), and the box's end takes the rest with it."""
    ws.task("---\nexecutor: shell\n---\n- [ ] 1. Wait\n  ```sh\n"
            f"  env -i setsid sleep {marker} > /dev/null 2>&1 < /dev/null & echo go > started; sleep {marker}\n"
            "  ```\n")
    proc = ws.spawn("loop", "start", "--task", TASK, env=ws.env(HOME=str(home)))
    ws.wait_for(lambda: (ws.root / "started").exists() and len(sleepers(marker)) >= 2, what="the step")
    r = ws.kiro("loop", "stop", "--task-id", ws.only_task_id(), "--force")
    assert r.returncode == 0, r.stdout + r.stderr
    assert proc.wait(timeout=60) == 3
    ws.wait_for(lambda: not sleepers(marker), timeout=20, what="the step's sleeps to end")


def test_a_stop_hook_pauses_a_boxed_loop_and_the_step_cannot_remove_it(ws: Workspace, home: Path) -> None:
    """A stop hook lets the running step finish and pauses the loop before the next (as without the
    box); the step sees the hook but cannot delete it (.hooks/ is read-only in the box)."""
    hook = '.hooks/stop_autonomous_loop_"$KIRO_TASK_ID".md'
    ws.task("---\nexecutor: shell\n---\n- [ ] 1. Wait for the hook\n  ```sh\n"
            f"  echo go > started; while [ ! -e {hook} ]; do sleep 0.05; done; rm -f {hook} 2>/dev/null || true\n"
            "  ```\n- [ ] 2. Next\n  ```sh\n  touch step2\n  ```\n")
    proc = ws.spawn("loop", "start", "--task", TASK, env=ws.env(HOME=str(home)))
    ws.wait_for(lambda: (ws.root / "started").exists(), what="the step")
    tid = ws.only_task_id()
    (ws.root / ".hooks" / f"stop_autonomous_loop_{tid}.md").write_text("stop\n")
    assert proc.wait(timeout=60) == 3
    assert not (ws.root / "step2").exists()
    assert ws.state(tid)["status"] == "paused"


def test_bad_sandbox_settings_are_one_line_and_exit_1(ws: Workspace, home: Path) -> None:
    ws.task("---\nexecutor: shell\n---\n- [ ] 1. Echo\n  ```sh\n  echo hi\n  ```\n")
    cases = {
        "sandbox: maybe\n": "sandbox",
        "sandbox_paths:\n  rw: [/no/such/folder/kiro]\n": "does not exist",
        "sandbox_paths:\n  ro: [relative/path]\n": "not an absolute path",
        "sandbox_network: sometimes\n": "sandbox_network",
    }
    for config, said in cases.items():
        ws.write("config/autonomous_loop.yaml", config)
        r = ws.kiro("loop", "start", "--task", TASK, env=ws.env(HOME=str(home)))
        print(f"{config.strip()!r}: exit {r.returncode}: {r.stderr.strip()}")
        assert r.returncode == 1 and said in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "Traceback" not in r.stderr
    ws.write("config/autonomous_loop.yaml", "")
    r = ws.kiro("loop", "start", "--task", TASK, "--sandbox", "sometimes", env=ws.env(HOME=str(home)))
    assert r.returncode == 1 and "--sandbox" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not list((ws.root / ".state").glob("autonomous_loop_*.json"))


def test_a_box_asked_for_that_cannot_start_is_one_line_and_no_step_runs(ws: Workspace, home: Path,
                                                                         tmp_path: Path) -> None:
    """A bwrap that cannot make a box (here: one that is refused namespaces, as a user without user
    namespaces is) with `sandbox: bwrap`: exit 1 before any step; with no setting: one line, steps
    run unconfined."""
    broken = tmp_path / "broken-bin"
    broken.mkdir()
    (broken / "bwrap").write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    (broken / "bwrap").chmod(0o755)
    env = ws.env(HOME=str(home), PATH=f"{broken}{os.pathsep}{os.environ['PATH']}")
    ws.task("---\nexecutor: shell\n---\n- [ ] 1. Echo\n  ```sh\n  echo ran > ran\n  ```\n")
    ws.write("config/autonomous_loop.yaml", "sandbox: bwrap\n")
    r = ws.kiro("loop", "start", "--task", TASK, env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "sandbox: bwrap was asked for" in r.stderr and "No permissions" in r.stderr
    assert not (ws.root / "ran").exists()
    ws.write("config/autonomous_loop.yaml", "")
    r = ws.kiro("loop", "start", "--task", TASK, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "steps run unconfined" in r.stderr and "apt-get install bubblewrap" in r.stderr
    assert (ws.root / "ran").exists()


def test_resume_keeps_the_sandbox_flag_of_start(ws: Workspace, home: Path) -> None:
    ws.task("---\nexecutor: shell\n---\n- [ ] 1. One\n  ```sh\n  touch .state/one 2>/dev/null; true\n  ```\n"
            "- [ ] 2. Two\n  ```sh\n  touch .state/two 2>/dev/null; true\n  ```\n")
    ws.write("config/autonomous_loop.yaml", "autonomous_loop:\n  max_iterations: 1\n")
    r = ws.kiro("loop", "start", "--task", TASK, "--sandbox", "off", env=ws.env(HOME=str(home)))
    assert r.returncode == 4, r.stdout + r.stderr
    assert (ws.root / ".state" / "one").exists()  # off: the step wrote kiro's folder
    r = ws.kiro("loop", "resume", "--task-id", ws.only_task_id(), "--max-iterations", "5",
                env=ws.env(HOME=str(home)))
    assert r.returncode == 0, r.stdout + r.stderr
    assert (ws.root / ".state" / "two").exists()  # resume kept --sandbox off
    assert "sandbox: bwrap" not in r.stderr


def test_codex_gives_its_own_sandbox_way_inside_kiros() -> None:
    from kiro.executors.agents.codex import BOXED_MODE, CodexPreset

    preset = CodexPreset()
    line = preset.template()
    assert line[line.index("--sandbox") + 1] == "workspace-write"  # out of the box: codex's own
    boxed = preset.boxed_argv(line)
    assert boxed[boxed.index("--sandbox") + 1] == BOXED_MODE == "danger-full-access"
    assert len(boxed) == len(line)  # replaced in place
    assert preset.boxed_argv(["codex", "exec", "-s", "read-only", "-"]) == ["codex", "exec", "-s", BOXED_MODE, "-"]
    assert preset.boxed_argv(["codex", "exec", "--sandbox=read-only", "-"])[2] == f"--sandbox={BOXED_MODE}"
    assert preset.boxed_argv(["codex", "exec", "-"]) == ["codex", "exec", "--sandbox", BOXED_MODE, "-"]


def test_sandbox_network_says_what_a_step_reaches_of_this_machine(ws: Workspace, home: Path) -> None:
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        port = server.getsockname()[1]
        seen = {}
        for network in ("on", "off", "host"):
            ws.task("---\nexecutor: shell\n---\n- [ ] 1. Call out\n  ```sh\n"
                    f"  if echo hi > /dev/tcp/127.0.0.1/{port}; then echo reached > {network}; "
                    f"else echo cut off > {network}; fi\n  ```\n", rel=f"Specs/{network}/tasks.md")
            ws.write("config/autonomous_loop.yaml", f"sandbox_network: {network}\n")
            r = ws.kiro("loop", "start", "--task", f"Specs/{network}/tasks.md", env=ws.env(HOME=str(home)))
            assert r.returncode == 0, r.stdout + r.stderr
            seen[network] = (ws.root / network).read_text().strip()
    print(f"sandbox_network: {seen}")
    # on: its own network (the internet through pasta), no service of this machine; host: the person's grant
    assert seen == {"on": "cut off" if sandbox.pasta_path() else "reached", "off": "cut off", "host": "reached"}


def test_kiro_agents_shows_the_box_each_cli_would_run_in(ws: Workspace, home: Path) -> None:
    (home / ".claude").mkdir()
    (home / ".codex").mkdir()
    env = ws.env(HOME=str(home), **AGENTS_CACHE)  # the CLIs' versions asked once per run, not again for this home
    rows = {row["name"]: row for row in json.loads(ws.kiro("agents", "--json", env=env).stdout)}
    claude, codex = rows["claude"]["sandbox"], rows["codex"]["sandbox"]
    assert rows["claude"]["bwrap_usable"] is True
    assert str(ws.root) in claude["rw"] and str(home / ".claude") in claude["rw"]
    assert str(home / ".codex") not in claude["rw"] and str(home / ".codex") in codex["rw"]
    assert str(home / ".ssh") not in claude["rw"] + claude["ro"]
    assert {str(ws.root / name) for name in (".state", ".hooks", "config", "Logs")} <= set(claude["ro"])
    # the box a loop's steps run in (executors.shell.loop_box): the task files are read-only there too
    assert str((ws.root / "Specs").resolve()) in claude["ro"], claude["ro"]
    text = ws.kiro("agents", "--verbose", env=env).stdout
    print(text.splitlines()[0])
    assert text.startswith("sandbox: bwrap, usable here (project read-write; .state .hooks config Logs")
    assert f"box: read-write {ws.root}, {home / '.claude'}; read-only" in text
    ws.write("config/autonomous_loop.yaml", "sandbox: off\n")
    rows = json.loads(ws.kiro("agents", "--json", env=env).stdout)
    assert all(row["sandbox"] is None and row["bwrap_usable"] is True for row in rows)
    assert ws.kiro("agents", env=env).stdout.startswith("sandbox: off")


# kiro's folders a workspace may not have yet when a step starts, and what a step would put in each
MISSING = {
    ".hooks": ".hooks/stop_autonomous_loop.md",  # a stop hook of its own choosing
    "config": "config/autonomous_loop.yaml",  # the next loop's config (sandbox: off)
    "Needs_Action": "Needs_Action/next.md",  # a task `watch` would start
    "Pending_Approval": "Pending_Approval/p.md",
    "Approved": "Approved/p.md",  # an approval of its own proposal
    "Rejected": "Rejected/p.md",
    ".kiro/worktrees": ".kiro/worktrees/other/planted",  # a loop's worktree before kiro makes it
    ".git": ".git/hooks/post-commit",  # a repository whose hooks kiro's git would run, outside the box
}


def test_a_step_cannot_create_a_control_folder_that_did_not_exist_when_it_started(ws: Workspace, home: Path) -> None:
    """The box binds the folders kiro has; one that is not there yet is made, empty and read-only, for the
    step (and taken away after it when still empty), so the step cannot make it. Done/ is missing too: the
    loop moves the finished task there itself."""
    for name in ("Done", "Needs_Action", "config", ".hooks"):
        (ws.root / name / "autonomous_loop.yaml").unlink(missing_ok=True)
        (ws.root / name).rmdir()
    script = "; ".join(f'{{ mkdir -p "$(dirname {path})"; echo planted > {path}; }} 2>/dev/null || true'
                       for path in MISSING.values())
    ws.task(f"---\nexecutor: shell\n---\n- [ ] 1. Plant\n  ```sh\n  {script}\n  ```\n")
    r = ws.kiro("loop", "start", "--task", TASK, env=ws.env(HOME=str(home)))
    assert r.returncode == 0, r.stdout + r.stderr
    held = {name: not (ws.root / path).exists() for name, path in MISSING.items()}
    for name, ok in held.items():
        print(f"{'held   ' if ok else 'ESCAPED'} {MISSING[name]}")
    print(f"{sum(held.values())} of {len(held)} held")
    assert all(held.values()), held
    assert (ws.root / "Done" / "feature" / "tasks.md").is_file()  # kiro made Done/ after the step, as before
    # what was made for the step only is gone: no empty .git or .kiro left in the person's workspace
    assert not (ws.root / ".git").exists() and not (ws.root / ".kiro").exists()
    assert not (ws.root / "Approved").exists() and not (ws.root / "config").exists()


def test_a_missing_control_folder_is_made_once_per_loop_not_once_per_step(ws: Workspace, home: Path) -> None:
    """Issue #41: the empty folder the box binds in place of a missing one (Approved/) is made when the
    first step starts and kept for the next steps: each step sees the same folder (its change time, to the
    nanosecond), not one made anew; it is gone when the loop has ended. A missing `.git` is still there only
    while a step runs (kiro's git would take an empty one for a repository), but it is the same folder each
    step (its inode and birth time), set aside in the state folder between steps, not made and removed anew
    (a removal costs ~2-4 ms on a disk with online discard), and nothing of it is left when the loop ends."""
    cmd = "stat -c %z Approved >> seen.txt; test -d .git && stat -c '%i %w' .git >> git.txt"
    ws.task(shell_task(3, cmd=cmd))
    (ws.root / ".state" / ".box-spare-4194305-0").mkdir()  # a killed kiro's (no pid is that high): swept
    r = ws.kiro("loop", "start", "--task", TASK, env=ws.env(HOME=str(home)))
    assert r.returncode == 0, r.stdout + r.stderr
    seen = (ws.root / "seen.txt").read_text().splitlines()
    print(f"Approved/ as the 3 steps saw it: {seen}")
    assert len(seen) == 3 and len(set(seen)) == 1, seen
    git = (ws.root / "git.txt").read_text().splitlines()
    print(f".git (inode, birth) as the 3 steps saw it: {git}")
    assert len(git) == 3 and len(set(git)) == 1, git  # bound, read-only, in every step: the same folder
    assert not (ws.root / "Approved").exists() and not (ws.root / ".git").exists()
    assert sorted(p.name for p in (ws.root / ".state").iterdir() if p.name.startswith(".box-")) == []


def test_a_step_in_its_worktree_cannot_write_another_loops_worktree(ws: Workspace, home: Path) -> None:
    """`isolation: worktree` with the task file at the workspace root: the task's folder (the root) is
    read-write for the agent to check its box, yet `.kiro/worktrees` stays read-only but for the loop's own."""
    from tests.gitutil import init_repo

    init_repo(ws.root)
    ws.write("config/autonomous_loop.yaml", "isolation: worktree\n")
    ws.task(shell_task(1, cmd="echo mine > first.txt"), "Specs/first/tasks.md")
    assert ws.kiro("loop", "start", "--task", "Specs/first/tasks.md", "--task-id", "first",
                   env=ws.env(HOME=str(home))).returncode == 0
    other = ws.root / ".kiro" / "worktrees" / "first"
    assert (other / "first.txt").read_text() == "mine\n"
    attack = (f'{{ echo planted > {other}/first.txt; echo planted > {other}/new.txt; mkdir {other.parent}/third; }} '
              f'2>/dev/null || true; echo own > own.txt')
    ws.task(shell_task(1, cmd=attack), "tasks.md")
    r = ws.kiro("loop", "start", "--task", "tasks.md", "--task-id", "second", env=ws.env(HOME=str(home)))
    assert r.returncode == 0, r.stdout + r.stderr
    assert (other / "first.txt").read_text() == "mine\n" and not (other / "new.txt").exists()
    assert not (other.parent / "third").exists()
    assert (other.parent / "second" / "own.txt").read_text() == "own\n"  # its own worktree is its to write


def test_watch_names_the_box_once_as_start_does(ws: Workspace, home: Path) -> None:
    """`kiro loop start` prints one line naming the box; `kiro loop watch` prints the same line, once
    for its loops (each distinct box once), not once per loop."""
    ws.task(shell_task(1), "Specs/solo/tasks.md")
    started = ws.kiro("loop", "start", "--task", "Specs/solo/tasks.md", env=ws.env(HOME=str(home)))
    assert started.returncode == 0, started.stdout + started.stderr
    line = [x for x in started.stderr.splitlines() if x.startswith("sandbox: bwrap (")]
    assert len(line) == 1, started.stderr
    for name in ("alpha", "beta", "gamma"):
        ws.task(shell_task(2), f"Specs/{name}/tasks.md")
    proc = ws.spawn("loop", "watch", env=ws.env(HOME=str(home)))
    try:
        ws.wait_for(lambda: all((ws.root / f"Done/{n}/tasks.md").exists() for n in ("alpha", "beta", "gamma")),
                    what="three loops done under watch")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    said = [x for x in ws.output(proc).splitlines() if x.startswith("sandbox:")]
    print("watch said:", said)
    assert said == line, ws.output(proc)


def test_a_boxed_process_outside_a_loop_gets_a_network_of_its_own_ended_with_it(tmp_path: Path) -> None:
    """A boxed process with no loop around it (no ledger) joins a network namespace made for it alone, connected
    by pasta, which ends with it (a loop's steps share the loop's: tests/test_box_network_ends.py)."""
    import asyncio

    from kiro.processes.spawn import spawn

    assert sandbox.pasta_path() is not None, "pasta (Debian's passt) is installed on every test machine"
    box = sandbox.box_for(project=tmp_path, workspace=tmp_path, state_dir=tmp_path / ".state", network="on")

    async def run() -> tuple[str, list[int]]:
        child = await spawn(["sh", "-c", "cat /proc/net/route; readlink /proc/self/ns/net"], cwd=tmp_path, box=box)
        assert child.proc.stdout is not None
        out = (await child.proc.stdout.read()).decode()
        await child.proc.wait()
        assert child.link is not None and child.link.loop is None
        held = [p.pid for p in (child.link._proc, child.link._holder) if p is not None]
        child.release()
        return out, held

    out, held = asyncio.run(run())
    gone = [pid for pid in held if not Path(f"/proc/{pid}").exists()]
    print(f"its routes and namespace: {out.split()[-1]} (kiro's {os.readlink('/proc/self/ns/net')}); pasta and "
          f"holder {held}, gone once it ended: {gone}")
    assert any(line.split("\t")[1:2] == ["00000000"] for line in out.splitlines()), "pasta connected it"
    assert out.split()[-1] != os.readlink("/proc/self/ns/net"), "not the host's network"
    assert len(held) == 2 and gone == held


def test_boxes_of_one_loop_that_run_at_once_have_a_network_each_kept_for_the_next(tmp_path: Path) -> None:
    """A loop's boxes join the network it keeps, one box at a time: two that run at once (parallel steps, each
    with its dev server on the same port) get one each; the next box takes one of them again; the loop's end
    ends both (their pasta and holder)."""
    import asyncio

    from kiro.processes import groups
    from kiro.processes.spawn import spawn

    box = sandbox.box_for(project=tmp_path, workspace=tmp_path, state_dir=tmp_path / ".state", network="on")
    argv = ["sh", "-c", "readlink /proc/self/ns/net; read _"]  # says its namespace, runs until its stdin ends

    async def run() -> tuple[list[str], list[int]]:
        ledger = groups.Ledger(tmp_path / ".state" / "processes" / "loop.json")
        groups.current_ledger.set(ledger)
        seen, held = [], []
        try:
            for together in (2, 1):
                children = [await spawn(argv, cwd=tmp_path, box=box, stdin=subprocess.PIPE) for _ in range(together)]
                for child in children:
                    assert child.proc.stdout is not None and child.proc.stdin is not None and child.link is not None
                    seen.append((await child.proc.stdout.readline()).decode().strip())
                    held += [p.pid for p in (child.link._proc, child.link._holder) if p is not None]
                for child in children:
                    child.proc.stdin.close()  # type: ignore[union-attr]
                    await child.proc.wait()
                    child.release()
        finally:
            sandbox.close_networks(ledger.token)
            ledger.close()
        return seen, sorted(set(held))

    seen, held = asyncio.run(run())
    gone = [pid for pid in held if not Path(f"/proc/{pid}").exists()]
    print(f"two boxes at once: {seen[:2]}; the next one: {seen[2]}; pastas and holders {held}, gone at the loop's "
          f"end: {gone}")
    assert seen[0] != seen[1] and seen[2] in seen[:2]
    assert len(held) == 4 and gone == held
