"""Stop reasons (issue #40 item 2): one enum, kiro.status.StopReason, whose members carry the status a
loop is left in, the exit code, the advice a person sees, the `kiro loop stats` bucket and the
Dashboard.md label. Every place that read a reason by its name reads the enum.

Part 1 runs on main's code as well (it imports no StopReason): a state file as an earlier kiro wrote it,
one per reason string, loads and shows the status, the resume command, the advice and the dashboard label
it showed before. On main four rows fail, where two places disagreed:
- `request_human`: Dashboard.md's labels were keyed `human_request`/`agent_request`, names no stop ever
  had, so a loop whose agent asked for help read "Request Human", not "Agent asked for help";
- `max_memory_mb`: the advice said "Raise `guardrails.max_memory_mb`", a key the config refuses (it is
  `resource_limits.max_memory_mb`);
- `max_limit_wait_seconds`: the advice said "Raise `guardrails.max_limit_wait_seconds`" (and
  KIRO_GUARDRAILS__...), a key the config refuses (it is the top-level `max_limit_wait_seconds`);
- `timeout_seconds`: `kiro loop status` suggested `resume --timeout SECONDS` while Dashboard.md and the
  intervention note suggested twice the loop's limit (`--timeout 7200`): the status summary lacked the limit.
Part 2 is about the enum itself.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from kiro.core import conditions
from kiro.status import Status
from kiro.store.config import Config
from kiro.store.state import LoopState
from kiro.store.statestore import StateStore
from kiro.store.workspace import Workspace
from kiro.views import dashboard, reports
from tests import conftest

RESUME = "kiro loop resume --task-id {tid}"
CONFIG = "in config/autonomous_loop.yaml"


def _raise(key: str, env: str | None) -> str:
    return f"Raise `{key}` {CONFIG}{f' (or {env})' if env else ''}, then resume: `{RESUME}`"


# (recorded status, stop_reason as the state file holds it) -> (`status`'s hint, the advice, the label)
OLD_STATES: list[tuple[str, str, str | None, str | None, str]] = [
    ("completed", "all_steps_done", None, None, ""),  # Dashboard.md's Completed section names no reason
    ("completed", "task_in_done", None, None, ""),
    ("paused", "stop_hook", RESUME, None, "Stop Hook"),
    ("paused", "needs_action", RESUME, None, "Task in Needs_Action"),
    ("paused", "request_human", RESUME, None, "Agent asked for help"),  # main: "Request Human"
    ("paused", "approval_pending", RESUME, None, "Approval Pending"),
    ("paused", "merge_conflict", RESUME, None, "Merge Conflict"),
    ("paused", "step_conflict", RESUME, None, "Step Conflict"),
    ("paused", "depends_waiting", RESUME, None, "Depends Waiting"),
    ("paused", "checkpoint", RESUME, None, "Checkpoint"),
    ("paused", "review_changes", RESUME, None, "Review Changes"),
    ("stopped", "signal", RESUME, None, "Stopped by signal"),
    ("stopped", "task_missing", RESUME, None, "Task file missing"),
    ("stopped", "interrupted", RESUME, None, "Interrupted"),
    ("stopped", "rolled_back", RESUME, None, "Rolled Back"),
    ("stopped", "restarted", RESUME, None, "Restarted"),
    ("stopped", "step_done", RESUME, None, "Step Done"),
    ("stopped", "step_missing", RESUME, None, "Step Missing"),
    ("stopped", "disk_full", RESUME, None, "Disk Full"),
    ("stopped", "executor_error", RESUME, None, "Executor error"),
    ("stopped", "error", RESUME, None, "Error"),
    ("stopped", "crash", RESUME, None, "kiro crashed"),
    ("max_iterations", "max_iterations", RESUME + " --max-iterations 20",
     f"Increase max iterations and resume: `{RESUME} --max-iterations 20`", "Max Iterations Reached"),
    ("timed_out", "timeout_seconds", RESUME + " --timeout 7200",  # main's `status`: `--timeout SECONDS`
     f"Raise the run-time limit and resume: `{RESUME} --timeout 7200`", "Time Limit Reached"),
    ("max_iterations", "max_total_tokens", RESUME,
     _raise("guardrails.max_total_tokens", "KIRO_GUARDRAILS__MAX_TOTAL_TOKENS"), "Max Total Tokens"),
    ("max_iterations", "max_cost_usd", RESUME,
     _raise("guardrails.max_cost_usd", "KIRO_GUARDRAILS__MAX_COST_USD"), "Max Cost Usd"),
    ("timed_out", "idle_timeout_seconds", RESUME,
     _raise("guardrails.idle_timeout_seconds", "KIRO_GUARDRAILS__IDLE_TIMEOUT_SECONDS"), "Idle Timeout Seconds"),
    ("max_iterations", "max_memory_mb", RESUME,  # main: `guardrails.max_memory_mb`
     _raise("resource_limits.max_memory_mb", "KIRO_RESOURCE_LIMITS__MAX_MEMORY_MB"), "Max Memory Mb"),
    ("timed_out", "max_limit_wait_seconds", RESUME,  # main: `guardrails.max_limit_wait_seconds`
     _raise("max_limit_wait_seconds", None), "Max Limit Wait Seconds"),
    ("failed", "failure_threshold", RESUME + " --reset-failures", None, "Threshold Exceeded"),
    ("failed", "max_step_retries", RESUME + " --reset-failures", None, "Step Retries Exhausted"),
    ("failed", "loop_detection_repeats", RESUME + " --reset-failures", None, "Loop Detection Repeats"),
    # a state written before `stop_reason` existed: the plain limit of its status
    ("max_iterations", "", RESUME + " --max-iterations 20",
     f"Increase max iterations and resume: `{RESUME} --max-iterations 20`", ""),
    ("failed", "", RESUME + " --reset-failures", None, ""),
]


def _old_state(store: StateStore, status: str, reason: str) -> str:
    """Write the state file as an earlier kiro did (its JSON, the reason as a plain string); its task id."""
    tid = f"{status}-{reason or 'none'}".replace("_", "-")
    raw = json.loads(LoopState(task_id=tid, task_path=f"Specs/{tid}/tasks.md", max_iterations=10,
                               timeout_seconds=3600).dump_json())
    raw.update(status=status, stop_reason=reason or None, iteration=10)
    raw.pop("stop_message", None)  # a field a summary of an earlier kiro lacks
    store.path(tid).write_text(json.dumps(raw), encoding="utf-8")
    return tid


def _dashboard_reason(board: str, tid: str) -> tuple[str, str | None]:
    """The label in a loop's `**Status**` line of Dashboard.md, and its `**Resume**` line."""
    part = board.split(f"### {tid}", 1)[1].split("###", 1)[0] if f"### {tid}" in board else board
    status = re.search(r"\*\*Status\*\*: [^(\n]*\((.*)\)", part)
    resume = re.search(r"\*\*Resume\*\*: (.*?)\s*$", part, re.M)
    return (status.group(1) if status else ""), (resume.group(1) if resume else None)


def test_an_old_state_with_each_reason_loads_and_shows_the_same(ws: conftest.Workspace) -> None:
    store = StateStore(Workspace(ws.root))
    tids = {(status, reason): _old_state(store, status, reason) for status, reason, *_ in OLD_STATES}
    r = ws.run("loop", "status", "--json")  # how a person reads them: every state file, one command
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    rows = {row["task_id"]: row for row in json.loads(r.stdout)}
    held, wrong = 0, []
    for status, reason, hint, advice, label in OLD_STATES:
        tid = tids[status, reason]
        state = store.load(tid).state
        row = rows[tid]
        hint = hint and hint.format(tid=tid)
        advice = advice and advice.format(tid=tid)
        board = dashboard.markdown([dashboard.Entry(state, Status(status), alive=False)])
        shown_label, resume = _dashboard_reason(board, tid)
        seen = {"loads": (str(state.status), state.stop_reason), "status": row["status"], "hint": row["hint"],
                "label": shown_label if label else label}
        want = {"loads": (status, reason or None), "status": status, "hint": hint, "label": label}
        if advice is not None:  # the advice: on the intervention note, and on Dashboard.md for a config key
            note = reports.intervention_request(state, reason=reason or status, detail="reached")
            seen["advice"] = advice if f"- [ ] {advice}\n" in note else note.split("## Options\n")[1][:200]
            want["advice"] = advice
            if "Raise `" in advice:
                seen["dashboard advice"], want["dashboard advice"] = resume, advice
        elif status != "completed":
            seen["dashboard resume"], want["dashboard resume"] = resume, f"`{hint}`"
        ok = seen == want
        held += ok
        print(f"{'held ' if ok else 'WRONG'} {status:15} {reason or '(none)':24} {seen if not ok else ''}")
        if not ok:
            wrong.append((status, reason, {k: (seen[k], want[k]) for k in want if seen.get(k) != want[k]}))
    print(f"{held} of {len(OLD_STATES)} old states show what they showed")
    assert not wrong, wrong


def test_each_key_an_advice_names_is_one_the_config_takes() -> None:
    """The intervention note of a loop stopped at a limit names the key to raise: setting that key must be
    accepted (the config refuses keys it does not know)."""
    refused = []
    for status, reason, _hint, _advice, _label in OLD_STATES:
        if status not in ("max_iterations", "timed_out") or not reason:
            continue
        st = LoopState(task_id="t", task_path="Specs/t.md", max_iterations=10, timeout_seconds=3600)
        st.transition(status)
        st.stop_reason = reason
        key = re.search(r"- \[ \] Raise `([a-z_.]+)`", reports.intervention_request(st, reason=reason, detail="x"))
        if key is None:
            continue
        *sections, name = key.group(1).split(".")
        data: dict[str, Any] = {name: 1}
        for section in reversed(sections):
            data = {section: data}
        try:
            Config.model_validate(data)
        except ValueError as exc:
            refused.append((reason, key.group(1)))
            print(f"{reason}: `{key.group(1)}` REFUSED: {str(exc).splitlines()[0]}")
        else:
            print(f"{reason}: `{key.group(1)}` accepted")
    assert not refused, refused


# -- part 2: the enum ----------------------------------------------------------------------------

from kiro.status import StopReason  # noqa: E402  (part 1 runs on main, which has none)

# SPEC §6: 0 done, 3 paused/stopped, 4 a limit, 5 failed, 6 a person is needed, 1 kiro could not go on
EXIT = {0: {"all_steps_done", "task_in_done", "step_done"},
        1: {"step_missing", "disk_full", "executor_error", "error", "crash"},
        3: {"stop_hook", "signal", "task_missing", "interrupted", "rolled_back", "restarted"},
        4: {"max_iterations", "timeout_seconds", "max_total_tokens", "max_cost_usd", "idle_timeout_seconds",
            "max_memory_mb", "max_limit_wait_seconds"},
        5: {"failure_threshold", "max_step_retries", "loop_detection_repeats"},
        6: {"needs_action", "request_human", "approval_pending", "merge_conflict", "step_conflict",
            "depends_waiting", "checkpoint", "review_changes"}}
# `kiro loop stats` "Time spent waiting": the line each wait counts in (the table views/stats.py held)
BUCKETS = {"backoff": "backoff", "token_budget_per_hour": "budgets", "max_total_tokens": "budgets",
           "max_cost_usd": "budgets", "active_hours": "hours", "max_api_calls_per_minute": "rate_limits",
           "max_actions_per_minute": "rate_limits", "max_cpu_percent": "rate_limits",
           "max_disk_writes_per_minute": "rate_limits", "usage_limit": "usage_limits"}


def test_every_reason_has_the_exit_code_of_spec_section_6() -> None:
    stops = {str(r): r.exit_code for r in StopReason if r.exit_code is not None}
    assert stops == {name: code for code, names in EXIT.items() for name in names}
    for r in StopReason:
        if r.exit_code is None:
            assert r.status == Status.SLEEPING, r  # a wait: the loop goes on by itself
        elif r.exit_code in (3, 4, 5):
            assert r.exit_code == r.status.exit_code, r  # the status's own code


def test_every_stop_a_condition_makes_carries_its_reasons_status_and_exit_code(tmp_path: Path) -> None:
    ws = Workspace(tmp_path)
    st = LoopState(task_id="t", task_path="Specs/t.md", iteration=5, max_iterations=5, consecutive_failures=3)
    stops = [conditions.completed("done"), conditions.stop_hook(tmp_path / ".hooks" / "x", ws),
             conditions.stopped("signal", "stopped"), conditions.max_iterations(st), conditions.timed_out(10, 11),
             conditions.failure_threshold(st), conditions.step_retries("1.1", 3, 2), conditions.step_done("1", "t"),
             conditions.needs_action("moved"), conditions.needs_action("asked", "request_human")]
    stops += [conditions.guardrail(limit, 1, 2, "hit") for limit in (  # the hard guardrails, and an executor's
        "max_total_tokens", "max_cost_usd", "idle_timeout_seconds", "max_memory_mb", "max_limit_wait_seconds",
        "loop_detection_repeats")]
    for stop in stops:
        assert isinstance(stop.reason, StopReason)
        assert (stop.status, stop.exit_code) == (stop.reason.status, stop.reason.exit_code), stop
    # before the enum, a guardrail's status was guessed from its name (`endswith("seconds")`)
    assert conditions.guardrail("max_limit_wait_seconds", 1, 2, "x").status == Status.TIMED_OUT
    assert conditions.guardrail("loop_detection_repeats", 1, 2, "x").exit_code == 5


def test_a_stop_must_name_a_member() -> None:
    """Adding a stop condition is one member of StopReason: a stop naming anything else is a bug, raised."""
    with pytest.raises(ValueError, match="not a StopReason"):
        conditions.needs_action("x", "no_such_reason")
    # an attempt cut short by a name kiro does not know (an executor's own) is `interrupted`
    assert conditions.stopped("cancelled", "x").reason is StopReason.INTERRUPTED


def test_the_stats_bucket_of_each_wait_is_the_one_stats_counted_it_in() -> None:
    assert {str(r): r.bucket for r in StopReason if r.bucket != "other" and str(r) in BUCKETS} == BUCKETS
    assert {str(r) for r in StopReason if r.bucket != "other"} - set(BUCKETS) == {"max_limit_wait_seconds"}


def test_the_state_flags_of_the_seed_follow_the_reason() -> None:
    flags = {str(r): r.state_flag for r in StopReason if r.exit_code is not None}
    assert flags["stop_hook"] == "stop_hook_triggered" and flags["needs_action"] == "manual_intervention"
    assert flags["max_iterations"] == "max_iterations_reached" and flags["max_total_tokens"] is None
    assert flags["loop_detection_repeats"] == "failure_threshold_exceeded"
    assert flags["task_in_done"] == flags["all_steps_done"] == "task_in_done"
    assert flags["signal"] is None
