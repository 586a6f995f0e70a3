"""One loop on the temporal backend, end to end: `kiro loop start` (unchanged for the user) against a real
Temporal dev server, a real `kiro worker` with its own git clone, real git, the shell executor."""

from __future__ import annotations

from tests.conftest import Workspace, shell_task
from tests.temporal.conftest import Project, Workers

# SPEC §14 on this backend: the worker runs verify (writing a JUnit report) and checks the protected paths in its
# clone. Step 2's first attempt also changes README.md (protected), which the worker puts back, failing it; step
# 3's first attempt leaves a file BAD, which fails verify.
VERIFY = """test ! -e BAD && printf '<testsuite><testcase name="a"/></testsuite>' > verify.xml && wc -l < work.txt"""
EVIDENCE = "verify: '" + VERIFY.replace("'", "''") + "'\nverify_report: verify.xml\nprotected_paths: [README.md]\n"
STEP = ('echo "step $KIRO_STEP_ID" >> work.txt; [ "$KIRO_STEP_ID" != 2 ] || [ -e "$RUNS/touched" ] || '
        '{ touch "$RUNS/touched"; echo "changed by step 2" >> README.md; }; [ "$KIRO_STEP_ID" != 3 ] || '
        '[ -e "$RUNS/bad" ] || { touch "$RUNS/bad" BAD; }')


def test_one_loop_on_one_worker(tws: Workspace, project: Project, workers: Workers) -> None:
    runs = project.base / "runs"
    workers.env = {"RUNS": str(runs)}
    (tws.root / "config/autonomous_loop.yaml").write_text(
        (tws.root / "config/autonomous_loop.yaml").read_text() + EVIDENCE)
    workers.start_workspace()
    workers.start("w1")
    tws.task(shell_task(3, cmd=STEP))
    r = tws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "one", timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    # the foreground prints the whole run, as a local loop does: also what the worker wrote at once
    assert "loop one started" in r.stdout and all(f"✓ {n} done" in r.stdout for n in (1, 2, 3)), r.stdout
    st = tws.state("one")
    assert st["status"] == "completed" and st["total_successes"] == 3 and st["total_failures"] == 2
    assert [c["step_id"] for c in st["completed_steps"]] == ["1", "2", "3"]
    assert project.branch_file("one", "work.txt") == "step 1\nstep 2\nstep 3\n"
    subjects = project.branch_log("one")
    assert subjects == ["kiro(one): 1 Step number 1", "kiro(one): 2 Step number 2", "kiro(one): 3 Step number 3"]
    shas = project.branch_shas("one")
    assert [c["checkpoint"] for c in st["completed_steps"]] == shas
    assert (tws.root / "Done/feature/tasks.md").read_text().count("- [x]") == 3
    assert (tws.root / "Logs/completion_reports/one.md").exists()
    assert not (tws.root / "work.txt").exists()  # the work is on the branch, not in the workspace's checkout

    # the protected README.md: put back on the worker, never committed; the person's own copy untouched
    assert project.branch_file("one", "README.md") == "# project\n"
    assert (tws.root / "README.md").read_text() == "# project\n"
    changed = [e for e in tws.events("one") if e["event"] == "protected_paths_changed"]
    assert [(e["step_id"], e["changes"]) for e in changed] == [("2", ["changed README.md"])], changed
    proposal = tws.root / changed[0]["proposal"]
    assert proposal.parent.name == "Pending_Approval" and "README.md" in proposal.read_text()
    failed = [e for e in tws.events("one") if e["event"] == "step_failed"]
    assert [e["step_id"] for e in failed] == ["2", "3"], failed
    assert "README.md, which protected_paths protects" in failed[0]["error"], failed
    # step 3's failed verify on the worker: the typed event, and the attempt's error, as a local loop's
    bad = [e for e in tws.events("one") if e["event"] == "verify_failed"]
    assert [(e["step_id"], e["command"]) for e in bad] == [("3", VERIFY)], bad
    assert failed[1]["error"].startswith(f"verify `{VERIFY}` failed:"), failed

    # every step's receipt: verify's command, exit code, output and test counts from the worker, its commit
    for n, (c, sha) in enumerate(zip(st["completed_steps"], shas, strict=True), 1):
        rc = c["receipt"]
        assert rc is not None, c
        v = rc["verify"]
        assert v["command"] == VERIFY and v["exit_code"] == 0 and v["output_tail"].strip() == str(n), v
        assert v["tests"]["passed"] == 1 and v["seconds"] >= 0, v
        assert rc["checkpoint"] == sha and "work.txt" in rc["diff_stat"], rc
        assert rc["protected"] == {"globs": ["README.md"], "files": 1, "changed": [], "approved": [], "ok": True}
        assert rc["attempts"] == (1 if n == 1 else 2), rc
    shown = tws.kiro("loop", "receipt", "--task-id", "one", timeout=60)
    assert shown.returncode == 0, shown.stderr
    print(shown.stdout)
    for n, sha in enumerate(shas, 1):
        part = shown.stdout.split(f"step {n}: Step number {n}\n", 1)[1].split("\nstep ", 1)[0]
        assert "exit 0; tests: 1 passed" in part and f"checkpoint {sha[:12]}" in part, part
        assert "protected paths (README.md): untouched" in part, part


def test_an_unreachable_server_is_one_line_and_starts_nothing(tws: Workspace, project: Project) -> None:
    from tests.temporal.conftest import free_port

    tws.write("config/autonomous_loop.yaml", f"backend:\n  kind: temporal\n  address: 127.0.0.1:{free_port()}\n")
    tws.task(shell_task(1))
    r = tws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "nope", timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr, (r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "backend.address" in lines[0] and "cannot reach the Temporal server" in lines[0], lines
    assert not (tws.root / "Logs" / "temporal_worker.out").exists()  # no workspace worker was started
    assert not list((tws.root / ".state").glob("autonomous_loop_*.json"))  # and no loop
    assert "kiro_task_id" not in (tws.root / "Specs/feature/tasks.md").read_text()


def test_kiro_worker_on_a_local_workspace_says_so(ws: Workspace) -> None:
    r = ws.kiro("worker", "--clone", str(ws.root.parent / "c"), timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "backend is local" in r.stderr and "backend.kind: temporal" in r.stderr, r.stderr


def test_the_local_backend_never_imports_temporalio(ws: Workspace) -> None:
    import subprocess
    import sys

    ws.task(shell_task(2))
    code = ("import atexit, sys, runpy\n"
            "atexit.register(lambda: print('TEMPORALIO' if 'temporalio' in sys.modules else 'CLEAN'))\n"
            "sys.argv = ['kiro', 'loop', 'start', '--task', 'Specs/feature/tasks.md', '--task-id', 'loc']\n"
            "runpy.run_module('kiro', run_name='__main__')\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ws.root, env=ws.env(), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("CLEAN"), r.stdout
    assert ws.state("loc")["status"] == "completed"


def test_commands_not_built_on_this_backend_say_so(tws: Workspace) -> None:
    for args in (("loop", "watch", "--detach"), ("loop", "rollback", "--task-id", "x", "--to-step", "1")):
        r = tws.kiro(*args, timeout=60)
        assert r.returncode == 1 and "Traceback" not in r.stderr, (args, r.stderr)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "not built for backend: temporal" in lines[0], lines
    assert not (tws.root / "Logs" / "watch.out").exists()


def test_start_starts_the_workspace_worker_when_none_runs(tws: Workspace, project: Project, workers: Workers) -> None:
    import os
    import re
    import signal

    workers.start("w1")
    tws.task(shell_task(2, cmd='echo "step $KIRO_STEP_ID" >> work.txt'))
    r = tws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "auto", "--detach", timeout=120)
    out = tws.root / "Logs" / "temporal_worker.out"
    try:
        assert r.returncode == 0 and r.stdout.strip() == "auto", (r.stdout, r.stderr)
        tws.wait_for(lambda: tws.state("auto")["status"] == "completed", 60, "the detached loop to complete")
        assert project.branch_file("auto", "work.txt") == "step 1\nstep 2\n"
        assert "(workspace) ready" in out.read_text()
    finally:
        found = re.search(r"\(workspace\) ready: .* pid (\d+)", out.read_text() if out.exists() else "")
        if found:
            os.killpg(int(found.group(1)), signal.SIGTERM)


def test_a_kiro_spec_runs_in_place_and_the_first_start_keeps_kiros_folders_out_of_git(
        tws: Workspace, project: Project, workers: Workers) -> None:
    """`kiro loop start --spec` on the temporal backend, as locally: the spec's tasks.md gets box characters
    only, and the first loop made writes the `.git/info/exclude` block (kiro.git.ignore) and says so, though
    the workspace worker made `.state/` before it."""
    workers.start_workspace()
    workers.start("w1")
    spec = tws.root / ".kiro/specs/auth/tasks.md"
    spec.parent.mkdir(parents=True)
    spec.write_text(shell_task(2, cmd='echo "step $KIRO_STEP_ID" >> work.txt'))
    before = spec.read_text()
    exclude = tws.root / ".git/info/exclude"
    assert (tws.root / ".state").is_dir() and "# >>> kiro" not in exclude.read_text()
    r = tws.kiro("loop", "start", "--spec", "auth", "--task-id", "auth", timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "kept kiro's own folders out of git commits" in r.stdout + r.stderr
    text = exclude.read_text()
    assert text.count("# >>> kiro") == 1 and "/.state/" in text and "/Logs/" in text, text
    assert spec.read_text() == before.replace("[ ]", "[x]")  # in place, boxes only
    assert project.branch_file("auth", "work.txt") == "step 1\nstep 2\n"
