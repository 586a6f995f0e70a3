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
    assert after.replace("[x]", "[ ]") == before  # the person's keys stay, and kiro adds none
    warned = [e["message"] for e in ws.events("typo") if e["event"] == "warning"]
    assert sum("did you mean" in m for m in warned) == 3  # in the loop's log too, once each


def test_a_thousand_typo_like_keys_are_six_lines_not_a_thousand() -> None:
    from kiro.store.config import frontmatter_typos

    said = frontmatter_typos({f"model{i}": i for i in range(1000)} | {"x" * 100_000: 1}, {"model0": 2}, "t.md")
    print(f"1,001 odd keys: {len(said)} lines")
    assert len(said) == 6 and said[0].startswith("t.md:2: frontmatter key 'model0'")
    assert said[-1] == "t.md: 95 more frontmatter keys look like typos of keys kiro reads"  # model0..model99


def test_a_config_key_typo_is_still_an_error(ws: Workspace) -> None:
    ws.write("config/autonomous_loop.yaml", "autonomous_loop:\n  max_iteration: 5\n")
    ws.task(FLAT)
    r = ws.kiro("loop", "start", "--task", TASK)
    assert r.returncode == 1
    assert "unknown key 'autonomous_loop.max_iteration' (did you mean 'max_iterations'?)" in r.stderr


# -- --step: one chosen step -----------------------------------------------------------------------------------


def boxes(ws: Workspace, rel: str = TASK) -> dict[str, str]:
    return {line.split("] ")[1].split()[0]: line[3] for line in (ws.root / rel).read_text().splitlines()
            if line.startswith("- [")}


def test_step_does_the_chosen_step_only_then_exits_0_and_resume_does_the_rest(ws: Workspace) -> None:
    ws.task(FLAT)
    r = ws.kiro("loop", "start", "--task", TASK, "--task-id", "one", "--step", "2.1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert ran(ws) == ["2.1"]  # not 1, which is open before it
    assert boxes(ws) == {"1.": " ", "2.": " ", "2.1": "x", "2.2": " ", "3.": " "}
    state = ws.state("one")
    assert (state["status"], state["stop_reason"]) == ("stopped", "step_done")
    assert "one: stopped (step_done) - step 2.1 is done; `kiro loop resume --task-id one`" in r.stdout
    r = ws.kiro("loop", "resume", "--task-id", "one")
    assert r.returncode == 0, r.stdout + r.stderr
    assert ran(ws) == ["2.1", "1", "2.2", "3"] and ws.state("one")["status"] == "completed"


def test_step_after_step_needs_no_resume(ws: Workspace) -> None:
    ws.task(FLAT)
    for tid, step in (("a", "2.2"), ("b", "1")):
        r = ws.kiro("loop", "start", "--task", TASK, "--task-id", tid, "--step", step)
        assert r.returncode == 0, r.stdout + r.stderr
    assert ran(ws) == ["2.2", "1"]
    assert "set aside the unfinished loop 'a' (stopped)" in r.stderr  # it did what it was started for
    assert (ws.state("a")["stop_reason"], ws.state("b")["stop_reason"]) == ("restarted", "step_done")


def test_step_naming_a_parent_does_its_open_sub_steps_and_the_last_open_step_completes_the_task(
        ws: Workspace) -> None:
    ws.task(FLAT.replace("- [ ] 1. Set up", "- [x] 1. Set up").replace("- [ ] 3. Document", "- [x] 3. Document"))
    r = ws.kiro("loop", "start", "--task", TASK, "--task-id", "two", "--step", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert ran(ws) == ["2.1", "2.2"]
    assert ws.state("two")["status"] == "completed"  # nothing was left: the task is done, and in Done/
    assert (ws.root / "Done" / "feature" / "tasks.md").exists()


def test_a_step_that_is_not_there_or_is_done_is_one_line_and_nothing_is_made(ws: Workspace) -> None:
    path = ws.task(FLAT.replace("- [ ] 2.2 The view", "- [x] 2.2 The view"))
    before = path.read_bytes()
    tried = {"9.9": "--step '9.9': Specs/feature/tasks.md has no step with that id; its steps are 1, 2, 2.1, 2.2, 3",
             "2.2": "--step 2.2: step 2.2 of Specs/feature/tasks.md is already done (its box is checked)",
             "": "--step '': Specs/feature/tasks.md has no step with that id"}
    for step, said in tried.items():
        for extra in ((), ("--detach",)):
            r = ws.kiro("loop", "start", "--task", TASK, "--step", step, *extra)
            print(f"--step {step!r} {' '.join(extra)}: exit {r.returncode}: {r.stderr.strip()}")
            assert r.returncode == 1 and said in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
            assert "Traceback" not in r.stderr
    assert path.read_bytes() == before and not list((ws.root / ".state").glob("autonomous_loop_*.json"))
    assert not list((ws.root / "Logs").glob("*.out")) and ran(ws) == []
    r = ws.kiro("loop", "start", "--task", TASK, "--task", TASK, "--step", "1")
    assert r.returncode == 1 and "--step names a step of one task file" in r.stderr


# -- --fresh: a clean restart -----------------------------------------------------------------------------------


def test_fresh_sets_the_unfinished_loop_aside_and_starts_anew_keeping_the_checked_boxes(ws: Workspace) -> None:
    ws.task(FLAT)
    r = ws.kiro("loop", "start", "--task", TASK, "--task-id", "old", "--max-iterations", "1")
    assert r.returncode == 4, r.stdout + r.stderr
    assert (ws.root / "Needs_Action" / "intervention_old.md").exists()
    r = ws.kiro("loop", "start", "--task", TASK)
    assert r.returncode == 1
    assert "start it afresh with `kiro loop start --fresh --task Specs/feature/tasks.md`" in r.stderr

    state_file = ws.root / ".state" / "autonomous_loop_old.json"
    before = state_file.read_bytes()
    for bad in (("--task-id", "old"), ("--executor", "command"), ("--task-id", "../x")):  # refused: nothing set aside
        r = ws.kiro("loop", "start", "--task", TASK, "--fresh", *bad)
        print(f"--fresh {' '.join(bad)}: exit {r.returncode}: {r.stderr.strip()}")
        assert r.returncode == 1 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
        assert state_file.read_bytes() == before and (ws.root / "Needs_Action" / "intervention_old.md").exists()

    r = ws.kiro("loop", "start", "--task", TASK, "--task-id", "new", "--fresh")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "set aside the unfinished loop 'old' (max_iterations) in .state/archive/autonomous_loop_old.json" in r.stderr
    assert ran(ws) == ["1", "2.1", "2.2", "3"]  # step 1, checked by the old loop, is not done again
    old = ws.state("old")  # archived, not lost: every command still finds it
    assert (old["status"], old["stop_reason"], old["iteration"]) == ("stopped", "restarted", 1)
    assert (ws.root / ".state" / "archive" / "autonomous_loop_old.json").exists()
    assert not (ws.root / ".state" / "autonomous_loop_old.json").exists()
    assert not (ws.root / "Needs_Action" / "intervention_old.md").exists()
    assert list((ws.root / "Logs" / "resolved").glob("intervention_old_*.md"))
    status = ws.run("loop", "status", "--task-id", "old", "--json")
    assert status.returncode == 0 and '"restarted"' in status.stdout
    r = ws.kiro("loop", "resume", "--task-id", "old")  # two loops on one task file: refused
    assert r.returncode == 1 and "was set aside by `kiro loop start --fresh`" in r.stderr
    assert ws.state("new")["status"] == "completed"


def test_fresh_does_not_touch_a_loop_that_is_running(ws: Workspace) -> None:
    ws.task("---\nexecutor: shell\n---\n- [ ] 1. Wait\n  ```sh\n  while [ ! -f go ]; do sleep 0.05; done\n  ```\n")
    running = ws.spawn("loop", "start", "--task", TASK, "--task-id", "busy")
    try:
        ws.wait_for(lambda: ws.state("busy")["status"] == "running", what="the loop to run")
        r = ws.kiro("loop", "start", "--task", TASK, "--fresh")
        assert r.returncode == 1 and "busy" in r.stderr and "Traceback" not in r.stderr
        assert (ws.root / ".state" / "autonomous_loop_busy.json").exists()
    finally:
        (ws.root / "go").touch()
        assert running.wait(60) == 0, ws.output(running)
    assert ws.state("busy")["status"] == "completed"
