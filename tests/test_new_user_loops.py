"""What a new user hit on the first night, run as they ran it (issue #32): a flat Kiro task list (items 9), a
typo in a task's frontmatter (item 5), one chosen step (`--step`, item 10b) and a clean restart (`--fresh`,
item 10c). Each test runs `kiro loop start` as a subprocess on a shell task and reads what a person reads:
the exit code, the output, the task file's boxes, the state files."""

from __future__ import annotations

from tests.conftest import Workspace

TASK = "Specs/feature/tasks.md"


def sh(step: str) -> str:
    return f'  ```sh\n  echo {step} >> ran.log\n  ```\n'


FLAT = ("---\nexecutor: shell\n---\n# Implementation Plan\n\n"
        "- [ ] 1. Set up\n" + sh("1")
        + "- [ ] 2. Implement the feature\n"  # a parent: no command of its own, its sub-steps are not indented
        + "- [ ] 2.1 The model\n" + sh("2.1")
        + "- [ ] 2.2 The view\n" + sh("2.2")
        + "- [ ] 3. Document it\n" + sh("3"))


def ran(ws: Workspace) -> list[str]:
    log = ws.root / "ran.log"
    return log.read_text().split() if log.exists() else []


def test_a_flat_kiro_list_runs_its_sub_steps_and_checks_their_parent(ws: Workspace) -> None:
    ws.task(FLAT)
    r = ws.kiro("loop", "start", "--task", TASK, "--task-id", "flat")
    assert r.returncode == 0, r.stdout + r.stderr
    assert ran(ws) == ["1", "2.1", "2.2", "3"]  # no attempt at "2" on its own (it has no command: exit 1 before)
    done = (ws.root / "Done" / "feature" / "tasks.md").read_text()
    assert "- [x] 2. Implement the feature" in done and "- [ ]" not in done
    assert ws.state("flat")["steps_total"] == 5


def test_a_frontmatter_typo_gets_a_did_you_mean_line_and_the_loop_still_runs(ws: Workspace) -> None:
    path = ws.task("---\ntitle: Typos\nmax_iteration: 1\nagnet: claude\nstatus: draft\ntags: [a, b]\nModel: x\n"
                   "executor: shell\n---\n- [ ] 1. One\n" + sh("1") + "- [ ] 2. Two\n" + sh("2"))
    before = path.read_text()
    r = ws.kiro("loop", "start", "--task", TASK, "--task-id", "typo")
    assert r.returncode == 0, r.stdout + r.stderr  # max_iteration: 1 set nothing: both steps ran
    assert ran(ws) == ["1", "2"]
    said = [line for line in (r.stdout + r.stderr).splitlines() if "did you mean" in line]
    print("\n".join(said))
    assert any(f"{TASK}:3: frontmatter key 'max_iteration' is not one kiro reads (did you mean 'max_iterations'?)"
               in line for line in said)
    assert any("'agnet'" in line and "(did you mean 'agent'?)" in line for line in said)
    assert any("'Model'" in line and "(did you mean 'model'?)" in line for line in said)
    assert {line.split("frontmatter key ")[1].split()[0] for line in said} == {"'max_iteration'", "'agnet'",
                                                                                "'Model'"}  # not status, tags
    after = (ws.root / "Done" / "feature" / "tasks.md").read_text()
    assert after.replace("[x]", "[ ]").replace("kiro_task_id: typo\n", "") == before  # the person's keys stay
    warned = [e["message"] for e in ws.events("typo") if e["event"] == "warning"]
    assert sum("did you mean" in m for m in warned) == 3  # in the loop's log too, once each


def test_a_config_key_typo_is_still_an_error(ws: Workspace) -> None:
    ws.write("config/autonomous_loop.yaml", "autonomous_loop:\n  max_iteration: 5\n")
    ws.task(FLAT)
    r = ws.kiro("loop", "start", "--task", TASK)
    assert r.returncode == 1
    assert "unknown key 'autonomous_loop.max_iteration' (did you mean 'max_iterations'?)" in r.stderr
