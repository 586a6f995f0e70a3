"""Steps side by side (`parallel: N`, issue #31): `(P)` steps or, with `parallel_by: depends`, steps whose
`_Depends:` are done, run at the same time, each in its own git worktree, and are merged back in plan order;
boxes, state, checkpoints and limits stay as exact as one step at a time. Real git, real shell steps, the
default box.

Each step notes in a side folder beside the workspace (granted to the box by `sandbox_paths.rw`) that it ran and
where (its cwd), so a test can tell how many times each step ran, and in which tree."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kiro.processes import sandbox
from kiro.store import tasks
from tests.agent_clis import Claude, parse_prompt, serving
from tests.conftest import Workspace
from tests.fakes import HttpError, Recorded
from tests.fakes import anthropic as fa
from tests.gitutil import files_in, fsck_problems, git, init_repo, trailers

BARRIER = ('touch "$SIDE/at.$KIRO_STEP_ID"; n=0; while [ "$(ls "$SIDE" | grep -c "^at\\.")" -lt {k} ]; do '
           'n=$((n+1)); [ $n -lt 1200 ] || exit 9; sleep 0.05; done')


def _side(ws: Workspace) -> Path:
    side = ws.root.parent / "side"
    side.mkdir(exist_ok=True)
    return side


def _config(ws: Workspace, extra: str = "") -> None:
    (ws.root / "config/autonomous_loop.yaml").write_text(
        "autonomous_loop:\n  backoff_base_seconds: 0.01\n  backoff_max_seconds: 0.05\n"
        f"sandbox_paths:\n  rw: [{json.dumps(str(_side(ws)))}]\n{extra}")


def _env(ws: Workspace) -> dict[str, str]:
    return ws.env(SIDE=str(_side(ws)), MAIN=str(ws.root))


def _plan(steps: list[tuple[str, str, str]], front: str = "") -> str:
    """(id and title, command, detail lines) -> a shell task; every command notes its run and its cwd first."""
    lines = ["---", "title: side by side", "executor: shell", *([front] if front else []), "---", "# Plan"]
    for head, cmd, details in steps:
        lines += [f"- [ ] {head}", *[f"  {d}" for d in details.splitlines() if d],
                  "  ```sh", f'  echo "$KIRO_STEP_ID $PWD" >> "$SIDE/runs.log"; {cmd}', "  ```"]
    return "\n".join(lines) + "\n"


def _runs(ws: Workspace) -> list[tuple[str, str]]:
    log = _side(ws) / "runs.log"
    return [tuple(line.split(" ", 1)) for line in log.read_text().splitlines()] if log.exists() else []  # type: ignore[misc]


def _leftovers(ws: Workspace) -> list[str]:
    """Worktrees and branches besides main, and folders under .kiro/worktrees."""
    trees = git(ws.root, "worktree", "list", "--porcelain").count("worktree ") - 1
    branches = [b for b in git(ws.root, "branch", "--format=%(refname:short)").split() if b != "main"]
    home = ws.root / ".kiro/worktrees"
    folders = [p.name for p in home.iterdir()] if home.is_dir() else []
    return [f"{trees} worktrees"] * bool(trees) + branches + folders


def _step_commits(ws: Workspace, tid: str) -> list[str]:
    """The Kiro-Step-Id of each of the loop's commits on main, oldest first."""
    shas = git(ws.root, "rev-list", "--reverse", "HEAD").split()
    return [t["Kiro-Step-Id"] for t in (trailers(ws.root, s) for s in shas)
            if t.get("Kiro-Task-Id") == tid and "Kiro-Step-Id" in t]


def test_eight_marked_steps_run_four_at_a_time_each_in_its_worktree_and_merge_in_plan_order(ws: Workspace) -> None:
    """Steps 1-4 wait for each other (a barrier of 4), so the run completes only if four ran at once; 5-8 then
    wait for all eight. Each writes its own file in its own worktree."""
    init_repo(ws.root)
    _config(ws)
    escape = 'echo x > "$MAIN/escaped-$KIRO_STEP_ID.txt" 2>/dev/null || true'  # the box's project is the worktree
    steps = [(f"{i}. (P) Write part {i}", BARRIER.format(k=4 if i <= 4 else 8) + f"; {escape}; mkdir -p parts; "
              f"echo {i} > parts/{i}.txt", "") for i in range(1, 9)]
    ws.task(_plan(steps))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "p8", "--parallel", "4",
                env=_env(ws), timeout=300)
    print(r.stdout[-3000:], r.stderr[-2000:])
    assert r.returncode == 0
    ids = [str(i) for i in range(1, 9)]
    runs = _runs(ws)
    assert sorted(sid for sid, _ in runs) == ids  # each step ran once
    for sid, cwd in runs:  # ... in a worktree of its own
        assert Path(cwd).parent == (ws.root / ".kiro/worktrees").resolve(), cwd
        assert Path(cwd).name.startswith(f"p8.step-{sid}-")
    assert len({cwd for _, cwd in runs}) == 8
    st = ws.state("p8")
    assert st["status"] == "completed" and st["parallel"] == []
    assert [c["step_id"] for c in st["completed_steps"]] == ids
    assert st["iteration"] == 8
    assert [s.id for s in tasks.load(ws.root / "Done/feature/tasks.md").steps if s.done] == ids
    assert _step_commits(ws, "p8") == ids  # one checkpoint commit per step, in plan order
    for c in st["completed_steps"]:
        changed = git(ws.root, "show", "--format=", "--name-only", c["checkpoint"]).split()
        assert changed == [f"parts/{c['step_id']}.txt"]
    assert {f"parts/{i}.txt" for i in ids} <= files_in(ws.root, "HEAD")
    kinds = [e["event"] for e in ws.events("p8")]
    assert kinds.count("parallel_step_started") == 8 and kinds.count("step_completed") == 8
    done = [e["step_id"] for e in ws.events("p8") if e["event"] == "step_completed"]
    assert done == ids
    assert _leftovers(ws) == []
    assert git(ws.root, "status", "--porcelain", "--", "parts", "README.md") == ""
    if sandbox.unusable() is None:  # without bwrap kiro runs the steps unboxed (and says so)
        assert list(ws.root.glob("escaped-*")) == []
    assert fsck_problems(ws.root) == []


def test_only_neighbouring_marked_steps_run_together_an_unmarked_step_runs_in_place_between(ws: Workspace) -> None:
    """1 and 2 are marked, 3 is not, 4 is: 4 starts only once 3 is done (it finds 3's file), 3 runs in the
    project itself as every step did before. 5 is marked but `_Depends: 4`: it starts once 4 is done, while 6
    may start beside 4."""
    init_repo(ws.root)
    _config(ws, extra="parallel: 3\n")
    ws.task(_plan([("1. (P) One", "echo 1 > one.txt", ""), ("2. (P) Two", "echo 2 > two.txt", ""),
                   ("3. Three, alone", "test -f one.txt && test -f two.txt && echo 3 > three.txt", ""),
                   ("4. (P) Four", "test -f three.txt && echo 4 > four.txt", ""),
                   ("5. (P) Five, after four", "test -f four.txt && echo 5 > five.txt", "_Depends: 4_"),
                   ("6. (P) Six", "echo 6 > six.txt", "")]))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "pu", env=_env(ws))
    assert r.returncode == 0, r.stdout + r.stderr
    where = dict(_runs(ws))
    assert where["3"] == str(ws.root.resolve())
    assert all("/.kiro/worktrees/pu.step-" in where[i] for i in ("1", "2", "4", "5", "6"))
    assert not [e for e in ws.events("pu") if e["event"] == "step_failed"]
    assert _step_commits(ws, "pu") == ["1", "2", "3", "4", "5", "6"] and _leftovers(ws) == []


def test_with_isolation_the_attempts_branch_from_the_loops_own_branch_and_it_merges_at_the_end(ws: Workspace) -> None:
    init_repo(ws.root)
    _config(ws, extra="parallel: 3\nisolation: worktree\nmerge: auto\n")
    ws.task(_plan([(f"{i}. (P) Part {i}", f"echo {i} > p{i}.txt", "") for i in range(1, 5)]))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "pi", env=_env(ws))
    assert r.returncode == 0, r.stdout + r.stderr
    assert all("/.kiro/worktrees/pi.step-" in cwd for _, cwd in _runs(ws))
    assert _step_commits(ws, "pi") == ["1", "2", "3", "4"]  # on kiro/pi, merged into main
    assert {f"p{i}.txt" for i in range(1, 5)} <= files_in(ws.root, "main")
    assert git(ws.root, "worktree", "list", "--porcelain").count("worktree ") == 1
    assert git(ws.root, "branch", "--format=%(refname:short)").split() == ["kiro/pi", "main"]  # the loop's stays


def test_a_step_whose_verify_fails_runs_again_from_the_last_checkpoint_without_its_failed_work(ws: Workspace) -> None:
    """Verify runs in the main tree once the step's work is merged in; when it fails, that work goes back out
    (the next attempt's worktree starts from the last checkpoint too) and the step runs again."""
    init_repo(ws.root)
    bump = 'n=$(( $(cat "$SIDE/n" 2>/dev/null || echo 0) + 1 )); echo $n > "$SIDE/n"'
    _config(ws, extra="parallel: 2\nverify: '! grep -q \"attempt 1\" two.txt 2>/dev/null'\n")
    ws.task(_plan([("1. (P) One", "echo 1 > one.txt", ""),
                   ("2. (P) Two", f'{bump}; echo "attempt $n" > two.txt; [ $n -gt 1 ] || echo junk > junk.txt', "")]))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "pv", env=_env(ws))
    print(r.stdout[-3000:])
    assert r.returncode == 0, r.stdout + r.stderr
    assert [sid for sid, _ in _runs(ws)].count("2") == 2
    assert [e["step_id"] for e in ws.events("pv") if e["event"] == "verify_failed"] == ["2"]
    assert (ws.root / "two.txt").read_text() == "attempt 2\n"
    assert not (ws.root / "junk.txt").exists() and "junk.txt" not in files_in(ws.root, "HEAD")
    assert _step_commits(ws, "pv") == ["1", "2"] and _leftovers(ws) == []


def test_a_conflicting_step_runs_again_once_on_the_merged_tree(ws: Workspace) -> None:
    """Steps 1 and 2 both start from the same commit and both write shared.txt: 2's work conflicts with 1's,
    so 2 runs again on the tree with 1 merged, and that merges."""
    init_repo(ws.root)
    _config(ws)
    ws.task(_plan([("1. (P) One", BARRIER.format(k=2) + "; echo one > shared.txt", ""),
                   ("2. (P) Two", BARRIER.format(k=2) + "; echo two > shared.txt; echo 2 > two.txt", "")]))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "pc", "--parallel", "2",
                env=_env(ws), timeout=300)
    print(r.stdout[-3000:], r.stderr[-2000:])
    assert r.returncode == 0
    assert [sid for sid, _ in _runs(ws)].count("2") == 2  # once beside 1, once more on the merged tree
    conflicts = [e for e in ws.events("pc") if e["event"] == "parallel_conflict"]
    assert [(e["step_id"], e["files"], e["again"]) for e in conflicts] == [("2", ["shared.txt"], False)]
    assert (ws.root / "shared.txt").read_text() == "two\n"
    assert _step_commits(ws, "pc") == ["1", "2"]
    st = ws.state("pc")
    assert st["status"] == "completed" and st["iteration"] == 2 and st["parallel"] == []
    assert _leftovers(ws) == []


def test_a_step_that_conflicts_again_waits_for_a_person_and_keeps_their_edit(ws: Workspace) -> None:
    """Step 2 writes shared.txt, and each time it runs someone also edits shared.txt in the main tree without
    committing it (done here by the step itself, in the main tree the test grants it): kiro never writes over
    that edit. Run again once, it conflicts again: the loop waits for a person, naming the file."""
    init_repo(ws.root)
    _config(ws, extra="")
    (ws.root / "config/autonomous_loop.yaml").write_text(
        (ws.root / "config/autonomous_loop.yaml").read_text().replace("rw: [", f"rw: [{json.dumps(str(ws.root))}, "))
    bump = 'n=$(( $(cat "$SIDE/n" 2>/dev/null || echo 0) + 1 )); echo $n > "$SIDE/n"'
    ws.task(_plan([("1. (P) One", "echo one > one.txt", ""),
                   ("2. (P) Two", f'echo two > shared.txt; {bump}; echo "draft $n" > "$MAIN/shared.txt"', "")]))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "pn", "--parallel", "2",
                env=_env(ws), timeout=300)
    print(r.stdout[-3000:], r.stderr[-2000:])
    assert r.returncode == 6  # waiting for a person
    st = ws.state("pn")
    assert st["status"] == "paused" and st["stop_reason"] == "step_conflict"
    assert "shared.txt" in st["stop_message"]
    assert [c["step_id"] for c in st["completed_steps"]] == ["1"]
    assert [sid for sid, _ in _runs(ws)].count("2") == 2  # ran again once, not more
    assert [e["again"] for e in ws.events("pn") if e["event"] == "parallel_conflict"] == [False, True]
    note = (ws.root / "Needs_Action/intervention_pn.md").read_text()
    assert "shared.txt" in note and "step 2" in note
    assert (ws.root / "shared.txt").read_text() == "draft 2\n"  # the person's edit, not kiro's
    assert {s.id: s.done for s in tasks.load(ws.root / "Specs/feature/tasks.md").steps} == {"1": True, "2": False}


class _ClaudeWritingAPart(Claude):
    """Claude Code's model, as tests.agent_clis plays it, that first writes `part-<step>.txt` in the folder it
    runs in (the step's own worktree), then checks its box in the task file it was told to check."""

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        self.seen: list[tuple[str, str]] = []  # (step, the worktree its prompt named)

    def brain(self, rec: Recorded) -> fa.Turn | HttpError:
        if not fa.is_agent_call(rec.body):
            return super().brain(rec)
        path, old, new = parse_prompt(fa.first_user_text(rec.body))
        step = old.split("]", 1)[1].split(".", 1)[0].strip()
        # the step's own worktree, where Claude Code runs (its system prompt names its working directory; the
        # task file it checks is its copy, kiro.executors.control.StepCopy)
        cwd = re.search(r"working directory: ([^\s\\]+)", json.dumps(rec.body), re.I)
        tree = Path(cwd.group(1)) if cwd else Path(path).parents[2]
        plan = [("Write", {"file_path": str(tree / f"part-{step}.txt"), "content": f"part {step}\n"}),
                ("Read", {"file_path": path}), ("Edit", {"file_path": path, "old_string": old, "new_string": new})]
        done = len(fa.tool_results(rec.body))
        if done == 0:
            self.seen.append((step, str(tree)))
        if done < len(plan):
            return fa.Turn([fa.tool_use(*plan[done])])
        return fa.Turn([fa.text(f"Wrote part {step} and checked the box")])


def test_claude_code_does_marked_steps_side_by_side_each_in_its_worktree(ws: Workspace, cli_home: Path) -> None:
    for c in serving(_ClaudeWritingAPart(cli_home)):
        init_repo(ws.root)
        _config(ws, extra="parallel: 3\nagent: claude\n")
        ws.task("---\ntitle: Parts\n---\n# Plan\n" + "".join(f"- [ ] {i}. (P) Write part {i}\n" for i in (1, 2, 3)))
        r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "pa",
                    env=ws.env(**c.env()), timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        seen = sorted(c.seen)
        assert [step for step, _ in seen] == ["1", "2", "3"]  # each step's first attempt did it
        assert all(f"/.kiro/worktrees/pa.step-{step}-" in tree for step, tree in seen), seen
        assert [(ws.root / f"part-{i}.txt").read_text() for i in (1, 2, 3)] == [f"part {i}\n" for i in (1, 2, 3)]
        assert _step_commits(ws, "pa") == ["1", "2", "3"] and _leftovers(ws) == []
        done = (ws.root / "Done/feature/tasks.md").read_text()
        assert done.endswith("---\n# Plan\n" + "".join(f"- [x] {i}. (P) Write part {i}\n" for i in (1, 2, 3)))


def test_a_token_budget_holds_across_attempts_run_side_by_side(ws: Workspace, cli_home: Path) -> None:
    """Two attempts start together; once one has ended, the tokens it spent are past max_total_tokens: no
    third attempt starts, and the loop stops at the budget. The usage counts each attempt that ended, taken up
    or not, once (an attempt still running when the loop stops is ended; what it spent so far is not counted:
    see kiro.core.parallel)."""
    for c in serving(_ClaudeWritingAPart(cli_home)):
        init_repo(ws.root)
        _config(ws, extra="parallel: 2\nagent: claude\nguardrails:\n  max_total_tokens: 300\n")
        ws.task("---\ntitle: Parts\n---\n# Plan\n" + "".join(f"- [ ] {i}. (P) Write part {i}\n" for i in (1, 2, 3, 4)))
        r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "pt",
                    env=ws.env(**c.env()), timeout=300)
        assert r.returncode == 4, r.stdout + r.stderr
        assert {step for step, _ in c.seen} <= {"1", "2"}
        assert {e["step_id"] for e in ws.events("pt") if e["event"] == "parallel_step_started"} <= {"1", "2"}
        st = ws.state("pt")
        assert st["stop_reason"] == "max_total_tokens"
        per_call = c.input_tokens + c.output_tokens
        ended = [e["step_id"] for e in ws.events("pt") if e["event"] == "parallel_step_finished"]
        assert st["usage"]["total_tokens"] >= len(ended) * 4 * per_call  # Write, Read, Edit, the last word
        assert st["usage"]["total_tokens"] <= c.calls() * per_call
        assert [x["step_id"] for x in st["completed_steps"]] == ["1"]
        # an attempt that ended is kept for the next run, whose budget is bigger: taken up, not done again
        assert [(x["step_id"], x["status"]) for x in st["parallel"]] == ([("2", "done")] if "2" in ended else [])
        _config(ws, extra="parallel: 2\nagent: claude\nguardrails:\n  max_total_tokens: 100000\n")
        r = ws.kiro("loop", "resume", "--task-id", "pt", env=ws.env(**c.env()), timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        asked = [step for step, _ in c.seen]
        assert sorted(asked) == ["1", "2", "3", "4"] if "2" in ended else sorted(set(asked)) == ["1", "2", "3", "4"]
        assert _step_commits(ws, "pt") == ["1", "2", "3", "4"] and _leftovers(ws) == []


def test_depends_lines_order_the_steps_and_each_sees_the_work_it_depends_on(ws: Workspace) -> None:
    init_repo(ws.root)
    _config(ws, extra="parallel_by: depends\n")
    need = 'for f in {files}; do test -f "parts/$f.txt" || {{ echo "missing $f"; exit 7; }}; done'
    ws.task(_plan([
        ("1. Base", "mkdir -p parts; echo 1 > parts/1.txt", ""),
        ("2. Uses 1", need.format(files="1") + "; echo 2 > parts/2.txt", "- _Depends: 1_"),
        ("3. Alone", "mkdir -p parts; echo 3 > parts/3.txt", ""),
        ("4. Uses 2 and 3", need.format(files="2 3") + "; echo 4 > parts/4.txt", "_Depends: 2, 3_"),
        ("5. Uses a later step", need.format(files="6") + "; echo 5 > parts/5.txt", "_Depends: 6_"),
        ("6. Also alone", "mkdir -p parts; echo 6 > parts/6.txt", ""),
    ], front="parallel: 3"))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "pd", env=_env(ws), timeout=300)
    print(r.stdout[-3000:], r.stderr[-2000:])
    assert r.returncode == 0
    st = ws.state("pd")
    assert [c["step_id"] for c in st["completed_steps"]] == ["1", "2", "3", "4", "6", "5"]
    assert not [e for e in ws.events("pd") if e["event"] == "step_failed"]
    assert sorted(sid for sid, _ in _runs(ws)) == ["1", "2", "3", "4", "5", "6"]
    assert _step_commits(ws, "pd") == ["1", "2", "3", "4", "6", "5"]
    assert _leftovers(ws) == []


def test_depends_on_a_step_that_never_comes_waits_for_a_person(ws: Workspace) -> None:
    init_repo(ws.root)
    _config(ws, extra="parallel: 2\nparallel_by: depends\n")
    ws.task(_plan([("1. Fine", "echo 1 > one.txt", ""), ("2. Stuck", "true", "_Depends: 9_")]))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "pw", env=_env(ws))
    assert r.returncode == 6, r.stdout + r.stderr
    st = ws.state("pw")
    assert st["stop_reason"] == "depends_waiting" and "2 (on 9)" in st["stop_message"]
    assert _leftovers(ws) == []


def test_max_iterations_holds_across_the_attempts_run_side_by_side(ws: Workspace) -> None:
    init_repo(ws.root)
    _config(ws)
    ws.task(_plan([(f"{i}. (P) Part {i}", f"echo {i} > p{i}.txt", "") for i in range(1, 9)]))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "pm", "--max-iterations", "3",
                "--parallel", "4", env=_env(ws))
    print(r.stdout[-3000:], r.stderr[-2000:])
    assert r.returncode == 4
    assert len(_runs(ws)) == 3  # no attempt beyond the cap was started
    st = ws.state("pm")
    assert st["stop_reason"] == "max_iterations" and st["iteration"] == 3
    assert [c["step_id"] for c in st["completed_steps"]] == ["1", "2", "3"]
    assert _step_commits(ws, "pm") == ["1", "2", "3"]
    assert _leftovers(ws) == []
    # resumed with room for the rest, --parallel 4 kept as --sandbox is: the other five, each once, side by side
    r = ws.kiro("loop", "resume", "--task-id", "pm", "--max-iterations", "20", env=_env(ws))
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(sid for sid, _ in _runs(ws)) == [str(i) for i in range(1, 9)]
    assert all("/.kiro/worktrees/" in cwd for _, cwd in _runs(ws))
    assert _leftovers(ws) == []


def test_parallel_one_and_no_git_run_steps_in_place_as_before(ws: Workspace) -> None:
    _config(ws, extra="parallel: 4\n")  # no git repository: one after another, in the project, with a warning
    ws.task(_plan([(f"{i}. (P) Part {i}", f"echo {i} > p{i}.txt", "") for i in range(1, 4)]))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "ng", env=_env(ws))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "parallel: 4 needs git checkpoints" in r.stdout + r.stderr
    assert [cwd for _, cwd in _runs(ws)] == [str(ws.root.resolve())] * 3
    init_repo(ws.root)  # a git repository, and parallel 1 given on the command line: in place, as before
    ws.task(_plan([(f"{i}. (P) Again {i}", f"echo {i} > q{i}.txt", "") for i in range(1, 4)]), rel="Specs/two/tasks.md")
    r = ws.kiro("loop", "start", "--task", "Specs/two/tasks.md", "--task-id", "p1", "--parallel", "1", env=_env(ws))
    assert r.returncode == 0, r.stdout + r.stderr
    assert [cwd for _, cwd in _runs(ws)] == [str(ws.root.resolve())] * 6
    assert not [e for e in ws.events("p1") if e["event"].startswith("parallel_")]
    assert _step_commits(ws, "p1") == ["1", "2", "3"] and _leftovers(ws) == []


def test_bringing_work_in_again_after_a_kill_mends_its_own_half_written_file_never_a_persons_edit(
        tmp_path: Path) -> None:
    """What a resumed loop does when a kill fell while a step's work was being written into the tree
    (kiro.git.stepbranches.bring_in with `again`): a file that holds the beginning of the merged content, or
    is missing, is kiro's own and is written whole; a file a person changed is a conflict and stays theirs."""
    from kiro.git.stepbranches import bring_in

    repo = tmp_path / "repo"
    repo.mkdir()
    init_repo(repo)
    (repo / "a.txt").write_text("base\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-qm", "a")
    git(repo, "switch", "-qc", "step")
    (repo / "a.txt").write_text("base\n" + "the step's long line\n" * 50)
    (repo / "b.txt").write_text("new\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "the step's work")
    work = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "switch", "-q", "main")
    whole = "base\n" + "the step's long line\n" * 50
    (repo / "a.txt").write_text(whole[:300])  # torn by the kill
    got = bring_in(repo, work, "", [], again=True)
    assert got.conflicts == [] and sorted(got.files) == ["a.txt", "b.txt"]
    assert (repo / "a.txt").read_text() == whole and (repo / "b.txt").read_text() == "new\n"
    (repo / "b.txt").unlink()
    (repo / "a.txt").write_text("a person's draft\n")  # not the merge's beginning: theirs
    for again in (True, False):
        got = bring_in(repo, work, "", [], again=again)
        assert got.conflicts == ["a.txt"] and got.files == []
        assert (repo / "a.txt").read_text() == "a person's draft\n" and not (repo / "b.txt").exists()


@pytest.mark.parametrize(("where", "value", "said"), [
    ("flag", "0", "--parallel: Input should be greater than or equal to 1"),
    ("flag", "four", "Invalid value for '--parallel'"),
    ("config", "true", "parallel: should be a number of steps, 1 or more"),
    ("config", "-2", "parallel: Input should be greater than or equal to 1"),
    ("config", "100", "parallel: Input should be less than or equal to 32"),
    ("frontmatter", "2.5", "frontmatter key 'parallel'"),
    ("parallel_by", "sideways", "parallel_by: Input should be 'marker' or 'depends'"),
    ("temporal", "2", "steps side by side (parallel) are not built on the temporal backend"),
])
def test_a_bad_parallel_value_is_one_line_and_exit_1_and_makes_nothing(ws: Workspace, where: str, value: str,
                                                                       said: str) -> None:
    init_repo(ws.root)
    _config(ws, extra=f"parallel: {value}\n" if where == "config" else
            f"parallel_by: {value}\n" if where == "parallel_by" else
            f"parallel: {value}\nbackend: temporal\n" if where == "temporal" else "")
    ws.task(_plan([("1. (P) One", "true", "")], front=f"parallel: {value}" if where == "frontmatter" else ""))
    before = sorted(p.relative_to(ws.root).as_posix() for p in ws.root.rglob("*") if ".git/" not in p.as_posix())
    args = ["--parallel", value] if where == "flag" else []
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", *args, env=_env(ws))
    print(f"{where}={value!r}: exit {r.returncode}: {r.stderr.strip()}")
    assert r.returncode == 1
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1 and said in lines[0] and "Traceback" not in lines[0]
    after = sorted(p.relative_to(ws.root).as_posix() for p in ws.root.rglob("*") if ".git/" not in p.as_posix())
    assert after == before


def test_a_step_taken_up_after_its_attempt_finished_is_timed_by_its_attempt_not_by_its_merge(ws: Workspace) -> None:
    """Issue #38 item 10: a parallel step's duration was the time of its merge (0.1 s for a 2.4 s attempt).
    Step 2 works 1.5 s and finishes first; step 1 waits for it, so step 2 is taken up after its attempt ended."""
    init_repo(ws.root)
    _config(ws)
    wait_two = 'n=0; while [ ! -f "$SIDE/two.done" ]; do n=$((n+1)); [ $n -lt 2400 ] || exit 9; sleep 0.05; done'
    ws.task(_plan([("1. (P) Wait for two", wait_two + "; echo 1 > one.txt", ""),
                   ("2. (P) Work a while", 'sleep 1.5; echo 2 > two.txt; touch "$SIDE/two.done"', "")]))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "pt", "--parallel", "2",
                env=_env(ws), timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    took = {e["step_id"]: e["duration_seconds"] for e in ws.events("pt") if e["event"] == "step_completed"}
    print("step durations:", took)
    assert took["2"] >= 1.5  # its attempt slept 1.5 s; its merge took a fraction of that
    assert {c["step_id"]: c["duration_seconds"] for c in ws.state("pt")["completed_steps"]} == took
    # issue #38 item 17: the `(P)` mark is kiro's to read, not part of the title it shows and commits
    shown = [e["description"] for e in ws.events("pt") if e["event"] in ("step_started", "step_completed")]
    subjects = git(ws.root, "log", "--format=%s").splitlines()
    print("titles shown:", shown, "| commits:", subjects)
    assert set(shown) == {"Wait for two", "Work a while"}
    assert not [s for s in subjects if "(P)" in s] and any("Work a while" in s for s in subjects)
    assert "- [x] 2. (P) Work a while" in (ws.root / "Done/feature/tasks.md").read_text()  # the file keeps it
