"""`verify` after a step (kiro.executors.verify): one function runs it for both backends (the temporal worker's
side is in tests/temporal/test_temporal_loop.py). What a person sees of it: a verify that hangs is cut at
`step_timeout_seconds` and fails the attempt (event `verify_failed`, the error in the state); the step's receipt
keeps the command, exit code, output tail and how long verify ran."""

from __future__ import annotations

from tests.conftest import FAST_CONFIG, Workspace, shell_task

# Step 2's first attempt leaves HANG: verify then sleeps past step_timeout_seconds; its second attempt removes it.
STEP = ('echo "step $KIRO_STEP_ID" >> work.txt; if [ "$KIRO_STEP_ID" = 2 ]; then '
        'if [ -e hung.once ]; then rm -f HANG; else touch hung.once HANG; fi; fi')
VERIFY = 'if [ -e HANG ]; then sleep 600; fi; echo "verified step $KIRO_STEP_ID"'


def test_a_hung_verify_is_cut_and_each_receipt_keeps_the_verify_run(ws: Workspace) -> None:
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "  max_step_retries: 4\nstep_timeout_seconds: 5\n"
             f"verify: '{VERIFY}'\n")
    ws.task(shell_task(2, cmd=STEP))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "v", timeout=240)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    events = ws.events("v")
    cut = [e for e in events if e["event"] == "verify_failed"]
    print(f"verify_failed: {[(e['step_id'], e['output'][:40]) for e in cut]}")
    assert [(e["step_id"], e["command"]) for e in cut] == [("2", VERIFY)], cut
    assert cut[0]["output"].startswith("(timed out after 5 s)"), cut
    failed = [e for e in events if e["event"] == "step_failed"]
    assert len(failed) == 1 and failed[0]["error"].startswith(f"verify `{VERIFY}` failed:\n"), failed
    st = ws.state("v")
    assert st["status"] == "completed" and [c["step_id"] for c in st["completed_steps"]] == ["1", "2"]
    for n, c in enumerate(st["completed_steps"], 1):
        v = c["receipt"]["verify"]
        assert v["command"] == VERIFY and v["exit_code"] == 0 and v["output_tail"].strip() == f"verified step {n}"
        assert 0 <= v["seconds"] < 5, v
    assert st["completed_steps"][1]["receipt"]["attempts"] == 2
