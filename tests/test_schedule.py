"""Recurring tasks (SPEC §11 "Schedules"): `schedule:` as cron or `{every: ...}`, runs under `watch` and
`start`, a report per run, `stateful` recall of earlier runs' summaries, catch-up after downtime,
active hours, `status` showing the next run, and one clear line for a bad value.

End to end against the scripted OpenAI-compatible server (tests/fake_openai.py); every wait is for
a condition, with a generous timeout, never a fixed sleep followed by an assertion."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kiro.core import schedule
from kiro.errors import UserError
from kiro.store.config import ActiveHours
from tests.conftest import Workspace, openai_config, shell_task
from tests.fake_openai import FakeOpenAI

TWO_STEPS = """\
---
title: Nightly inbox check
schedule: {every: 2s}
---
# Plan
- [ ] 1. Read the inbox
- [ ] 2. Write the digest
"""


def _events(ws: Workspace, task_id: str, kind: str) -> list[dict[str, Any]]:
    try:
        return [e for e in ws.events(task_id) if e["event"] == kind]
    except FileNotFoundError:
        return []


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


# -- parsing and fire times (in process) ---------------------------------------------------------


def test_cron_next_run_is_the_next_matching_local_time() -> None:
    s = schedule.parse("0 9 * * *")
    assert s.kind == "cron" and s.describe() == "cron 0 9 * * *" and s.stateful
    local = datetime(2026, 3, 10, 15, 30).astimezone()
    nxt = s.next_after(local)
    assert (nxt.year, nxt.month, nxt.day, nxt.hour, nxt.minute) == (2026, 3, 11, 9, 0)
    early = datetime(2026, 3, 10, 8, 59).astimezone()
    assert schedule.parse({"cron": "0 9 * * *"}).next_after(early).day == 10
    # a new cron loop waits for its first fire; a new `every` loop runs at once
    assert schedule.first_fire(s, local) == nxt
    every = schedule.parse({"every": "30m"})
    assert every.seconds == 1800 and schedule.first_fire(every, local) == local
    assert every.next_after(local) == local + timedelta(minutes=30)
    assert schedule.parse({"every": "1.5h"}).seconds == 5400 and schedule.parse({"every": "1d"}).seconds == 86400
    assert schedule.parse("@daily").next_after(local).hour == 0
    assert schedule.parse({"every": "2s"}, stateful=False).stateful is False


def test_missed_fires_make_one_catch_up_run() -> None:
    s = schedule.parse("0 * * * *")  # hourly
    started = datetime(2026, 3, 10, 9, 0, tzinfo=UTC)
    # the run ended before the next fire: the next run is at that fire, standing for one fire
    due, fires = schedule.next_fire(s, started, started + timedelta(minutes=5))
    assert due == started + timedelta(hours=1) and fires == 1
    # kiro was down from 09:05 to 12:30: 10:00, 11:00 and 12:00 were missed -> one run now, for 3 fires
    now = started + timedelta(hours=3, minutes=30)
    due, fires = schedule.next_fire(s, started, now)
    assert due == now and fires == 3
    e = schedule.parse({"every": "10m"})
    assert schedule.next_fire(e, started, started + timedelta(minutes=45)) == (started + timedelta(minutes=45), 4)


def test_a_fire_outside_active_hours_waits_for_the_window() -> None:
    hours = ActiveHours(start="09:00", end="17:00")
    inside = datetime(2026, 3, 10, 10, 0).astimezone()
    assert schedule.hold_for_active_hours(inside, hours) == inside
    night = datetime(2026, 3, 10, 22, 15).astimezone()
    held = schedule.hold_for_active_hours(night, hours).astimezone()
    assert (held.day, held.hour, held.minute) == (11, 9, 0)
    assert schedule.hold_for_active_hours(night, None) == night
    own = schedule.parse({"every": "1h", "active_hours": {"start": "22:00", "end": "06:00"}})
    assert own.active_hours == schedule.Window("22:00", "06:00") and own.seconds == 3600
    held = schedule.hold_for_active_hours(inside, own.active_hours).astimezone()  # 10:00 -> 22:00 that day
    assert (held.day, held.hour) == (10, 22)


BAD = [
    ('"0 9 * *"', "not a 5-field cron expression"),
    ('"61 * * * *"', "not a valid cron expression"),
    ('"0 9 * * * *"', "not a 5-field cron expression"),
    ("12:30", "is a number"),
    ("{every: 5}", "needs a unit"),
    ("{every: soon}", "not an interval like 30s"),
    ("{every: 0s}", "shorter than 1 s"),
    ("{every: 2s, cron: '0 9 * * *'}", "exactly one of 'every' or 'cron'"),
    ("{at: '09:00'}", "unknown key(s) at"),
    ("[0, 9]", "neither a cron string nor a mapping"),
    ("{every: 1h, active_hours: {start: 9am, end: '17:00'}}", "active_hours.start '9am' is not a time like 09:00"),
    ("{every: 1h, active_hours: '09:00-17:00'}", "schedule.active_hours '09:00-17:00' is not a window"),
]


def test_bad_schedules_are_one_clear_line_and_exit_1(ws: Workspace) -> None:
    """Each bad value: exit 1, one line on stderr naming the file, its line and the fix, no traceback,
    nothing started, the task file untouched. Prints what was tried and how many held."""
    held = 0
    for value, words in BAD:
        ws.task(shell_task(1, extra_frontmatter=f"schedule: {value}"))
        before = (ws.root / "Specs/feature/tasks.md").read_bytes()
        r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "bad")
        err = r.stderr.strip()
        ok = (r.returncode == 1 and len(err.splitlines()) == 1 and "Traceback" not in err
              and "Specs/feature/tasks.md:4:" in err and "schedule" in err and words in err
              and not list((ws.root / ".state").glob("autonomous_loop_*.json"))
              and (ws.root / "Specs/feature/tasks.md").read_bytes() == before)
        held += ok
        print(f"{'held' if ok else 'FAILED'}  schedule: {value:<34} exit {r.returncode}: {err}")
    print(f"{held} of {len(BAD)} bad schedule values held")
    assert held == len(BAD)


def test_stateful_must_be_true_or_false(ws: Workspace) -> None:
    ws.task(shell_task(1, extra_frontmatter="schedule: {every: 1h}\nstateful: sometimes"))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md")
    assert r.returncode == 1 and "tasks.md:5: frontmatter key 'stateful' must be true or false" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    with pytest.raises(UserError):
        schedule.parse({"every": "1h"}, stateful="yes")


def test_a_bad_stateful_without_a_schedule_is_refused_too(ws: Workspace) -> None:
    """`stateful:` alone is checked at the start as well (kiro.core.looprun.names_schedule: a task that names
    neither key skips the schedule's code)."""
    ws.task(shell_task(1, extra_frontmatter="stateful: sometimes"))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md")
    assert r.returncode == 1 and "tasks.md:4: frontmatter key 'stateful' must be true or false" in r.stderr
    assert not (ws.root / "side_effects.log").exists()


def test_watch_skips_a_task_with_a_bad_schedule_and_says_so(ws: Workspace) -> None:
    ws.task(shell_task(1, extra_frontmatter='schedule: "every day"'))
    proc = ws.spawn("loop", "watch")
    try:
        ws.wait_for(lambda: "could not start Specs/feature/tasks.md" in ws.output(proc), timeout=60,
                    what="watch's warning")
        assert "not a 5-field cron expression" in ws.output(proc)
        assert not list((ws.root / ".state").glob("autonomous_loop_*.json"))
    finally:
        _stop(proc)


# -- end to end ------------------------------------------------------------------------------


class Agent:
    """Answers like a model: each step request gets `complete_step`; each tool-less request (kiro's
    forced run summary) gets a summary naming its run. When the summary of run `done_after` is asked
    for, it first moves the task file to Done/ (a person ending the schedule), so the loop ends
    while it waits for run `done_after + 1`: the number of runs never depends on timing."""

    def __init__(self, ws: Workspace, done_after: int) -> None:
        self.ws = ws
        self.done_after = done_after
        self.summaries = 0
        self.lock = threading.Lock()
        self.step_requests: list[tuple[int, str]] = []  # (run, the request's messages as text)

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            text = json.dumps(body["messages"])
            if "tools" not in body:
                self.summaries += 1
                n = self.summaries
                if n == self.done_after:
                    src = self.ws.root / "Specs/nightly"
                    (self.ws.root / "Done").mkdir(exist_ok=True)
                    os.replace(src, self.ws.root / "Done/nightly")
                return {"content": f"SUMMARY-OF-RUN-{n}: the inbox had {n * 3} new mails; deferred the spam."}
            self.step_requests.append((self.summaries + 1, text))
            if len(self.step_requests) == 1:  # run 1: the agent notes something for later runs
                return {"tool_calls": [{"name": "memory_save", "arguments": {
                    "content": "AGENT-NOTE: the mailbox lives at imap.example.org", "type": "fact"}}]}
            return {"tool_calls": [{"name": "complete_step", "arguments": {"summary": f"step done in run "
                                                                                      f"{self.summaries + 1}"}}]}


def test_every_2s_under_watch_runs_three_times_with_recall_and_ends_in_done(ws: Workspace) -> None:
    with FakeOpenAI() as fake:
        agent = Agent(ws, done_after=3)
        fake.responder = agent
        openai_config(ws, fake)
        proc = ws.spawn("loop", "watch")
        try:
            ws.task(TWO_STEPS, "Specs/nightly/tasks.md")
            tid = ws.wait_for(lambda: ws.only_task_id(), timeout=60, what="the loop")
            ws.wait_for(lambda: _events(ws, tid, "loop_finished"), timeout=120, what="the schedule to end")
            assert proc.poll() is None  # watch goes on
        finally:
            _stop(proc)

    fired = _events(ws, tid, "schedule_fired")
    assert [e["run"] for e in fired] == [1, 2, 3]
    assert all(e["schedule"] == "every 2s" and not e["catch_up"] for e in fired)
    assert [e["run"] for e in _events(ws, tid, "run_finished")] == [1, 2, 3]
    finished = _events(ws, tid, "loop_finished")[-1]
    assert finished["status"] == "completed" and finished["reason"] == "task_in_done"

    # each run's first prompt carries what the earlier runs' summaries said; later prompts do not
    by_run: dict[int, list[str]] = {}
    for run, text in agent.step_requests:
        by_run.setdefault(run, []).append(text)
    assert sorted(by_run) == [1, 2, 3] and [len(by_run[n]) for n in (1, 2, 3)] == [3, 2, 2]
    first1, first2, first3 = by_run[1][0], by_run[2][0], by_run[3][0]
    assert "SUMMARY-OF-RUN" not in first1 and "Earlier runs" not in first1
    assert "SUMMARY-OF-RUN-1" in first2 and "SUMMARY-OF-RUN-2" not in first2
    assert "SUMMARY-OF-RUN-1" in first3 and "SUMMARY-OF-RUN-2" in first3
    assert "## Earlier runs of this scheduled task" in first3 and f"schedule:{tid}" in first3
    assert "AGENT-NOTE" in first2 and "AGENT-NOTE" in first3  # what the agent saved is carried too
    assert all("SUMMARY-OF-RUN" not in later for v in by_run.values() for later in v[1:])

    # a report per run; the state says how many runs and when; the file stayed in Specs/ between runs
    for n in (1, 2, 3):
        report = (ws.root / f"Logs/completion_reports/{tid}_run{n}.md").read_text()
        assert "type: run_report" in report and f"run: {n}" in report and f"SUMMARY-OF-RUN-{n}" in report
        assert "written by the agent" in report
    assert not (ws.root / f"Logs/completion_reports/{tid}_run4.md").exists()
    st = ws.state(tid)
    assert st["runs"] == 3 and st["last_run_at"] and st["next_run_at"] is None and st["status"] == "completed"
    assert st["schedule"]["expression"] == "every 2s"
    assert st["usage"]["api_calls"] == 10  # 2 steps + 1 summary per run, and the memory_save turn
    done = (ws.root / "Done/nightly/tasks.md").read_text()
    assert done.count("- [x]") == 2 and "schedule: {every: 2s}" in done

    # `kiro loop history` lists the runs
    hist = json.loads(ws.run("loop", "history", "--task-id", tid, "--json").stdout)
    runs = [(r["event"], r["run"]) for r in hist if r["kind"] == "run" and "run" in r]
    assert runs == [("scheduled", 1), ("run_finished", 1), ("scheduled", 2), ("run_finished", 2),
                    ("scheduled", 3), ("run_finished", 3)]

    # the summaries are memories tagged schedule:<task_id>
    with sqlite3.connect(ws.root / ".state/memory.db") as db:
        rows = db.execute("SELECT type, content FROM memories WHERE source = ? ORDER BY id",
                          (f"schedule:{tid}",)).fetchall()
    summaries = [c.split(": ", 1)[1][:16] for t, c in rows if t == "run_summary"]
    assert summaries == ["SUMMARY-OF-RUN-1", "SUMMARY-OF-RUN-2", "SUMMARY-OF-RUN-3"]
    assert [c for t, c in rows if t == "fact"] == ["AGENT-NOTE: the mailbox lives at imap.example.org"]


def test_stateful_false_carries_nothing_forward(ws: Workspace) -> None:
    with FakeOpenAI() as fake:
        agent = Agent(ws, done_after=99)
        fake.responder = agent
        openai_config(ws, fake)
        ws.task(TWO_STEPS.replace("schedule: {every: 2s}", "schedule: {every: 1s}\nstateful: false"),
                "Specs/nightly/tasks.md")
        proc = ws.spawn("loop", "start", "--task", "Specs/nightly/tasks.md", "--task-id", "nostate")
        try:
            ws.wait_for(lambda: len(_events(ws, "nostate", "run_finished")) >= 2, timeout=120, what="two runs")
            os.replace(ws.root / "Specs/nightly", ws.root / "Done/nightly")
            assert proc.wait(timeout=60) == 0
        finally:
            _stop(proc)
    assert agent.summaries == 0  # no forced summary call
    assert all("Earlier runs" not in text for _, text in agent.step_requests)
    report = (ws.root / "Logs/completion_reports/nostate_run2.md").read_text()
    assert "made by kiro from the steps" in report


def test_start_stays_between_runs_and_a_killed_loop_catches_up_once(ws: Workspace) -> None:
    ws.task(shell_task(2, extra_frontmatter="schedule: {every: 2s}"))
    proc = ws.spawn("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "cu")
    try:
        ws.wait_for(lambda: _events(ws, "cu", "run_finished"), timeout=60, what="run 1")
        st = ws.wait_for(lambda: (lambda s: s if s["status"] == "sleeping" else None)(ws.state("cu")),
                         timeout=60, what="the wait for run 2")
        assert proc.poll() is None  # `start` stays in the foreground between runs
        assert st["runs"] >= 1 and st["next_run_at"] and st["sleep_until"]
        proc.send_signal(signal.SIGKILL)  # kiro goes down between runs
        proc.wait(timeout=30)
    finally:
        _stop(proc)
    runs_before = ws.state("cu")["runs"]
    due = datetime.fromisoformat(ws.state("cu")["next_run_at"])
    # downtime: wait until at least two more fires (every 2s) have passed
    ws.wait_for(lambda: datetime.now(UTC) > due + timedelta(seconds=2.5), timeout=30, what="downtime")
    status = ws.run("loop", "status", "--task-id", "cu", "--json")
    assert json.loads(status.stdout)["status"] == "interrupted"
    proc = ws.spawn("loop", "resume", "--task-id", "cu")
    try:
        fired = ws.wait_for(lambda: [e for e in _events(ws, "cu", "schedule_fired") if e["run"] == runs_before + 1],
                            timeout=60, what="the catch-up run")
        assert fired[0]["catch_up"] is True and fired[0]["missed"] >= 1
        ws.wait_for(lambda: [e for e in _events(ws, "cu", "run_finished") if e["run"] == runs_before + 1],
                    timeout=60, what="the catch-up run to finish")
        os.replace(ws.root / "Specs/feature", ws.root / "Done/feature")
        assert proc.wait(timeout=60) == 0
    finally:
        _stop(proc)
    # one catch-up run for all the missed fires: one schedule_fired between the resume and the next run
    after_resume = [e for e in _events(ws, "cu", "schedule_fired") if e["run"] > runs_before]
    assert after_resume[0]["run"] == runs_before + 1 and all(not e["catch_up"] for e in after_resume[1:])


@pytest.mark.parametrize("where", ["config", "task"])
def test_outside_active_hours_the_run_waits_and_status_shows_the_next_run(ws: Workspace, where: str) -> None:
    now = datetime.now().astimezone()
    start, end = now + timedelta(hours=2), now + timedelta(hours=3)
    window = f"{{start: \"{start:%H:%M}\", end: \"{end:%H:%M}\"}}"
    if where == "config":  # guardrails.active_hours, for every loop
        ws.write("config/autonomous_loop.yaml",
                 f"autonomous_loop:\n  backoff_base_seconds: 0.01\nguardrails:\n  active_hours: {window}\n")
        ws.task(shell_task(1, extra_frontmatter="schedule: {every: 1s}"))
    else:  # the task's own window for starting runs
        ws.task(shell_task(1, extra_frontmatter=f"schedule: {{every: 1s, active_hours: {window}}}"))
    proc = ws.spawn("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "ah")
    try:
        st = ws.wait_for(lambda: (lambda s: s if s["status"] == "sleeping" else None)(ws.state("ah")),
                         timeout=60, what="the wait for active hours")
        opening = datetime.fromisoformat(st["next_run_at"]).astimezone()
        assert (opening.hour, opening.minute) == (start.hour, start.minute)
        assert st["runs"] == 0 and not (ws.root / "side_effects.log").exists()  # nothing ran
        row = json.loads(ws.run("loop", "status", "--task-id", "ah", "--json").stdout)
        assert row["schedule"] == "every 1s" and row["next_run_at"] == st["next_run_at"]
        assert row["next_run"].startswith("in 1h") or row["next_run"].startswith("in 2h")
        table = ws.run("loop", "status").stdout
        assert "next run in" in table
        detail = ws.run("loop", "status", "--task-id", "ah").stdout
        assert "Next run" in detail and "every 1s" in detail
        progress = ws.run("loop", "progress", "--task-id", "ah")
        assert "next run in" in progress.stdout and "0 run(s)" in progress.stdout
        r = ws.run("loop", "stop", "--task-id", "ah")
        assert r.returncode == 0
        assert proc.wait(timeout=60) == 3  # a stop hook ends the wait at once
    finally:
        _stop(proc)


def test_a_cron_loop_waits_for_its_first_fire(ws: Workspace, tmp_path: Path) -> None:
    ws.task(shell_task(1, extra_frontmatter='schedule: "0 3 1 1 *"'))  # 03:00 on January 1st
    proc = ws.spawn("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "cr")
    try:
        st = ws.wait_for(lambda: (lambda s: s if s["status"] == "sleeping" else None)(ws.state("cr")),
                         timeout=60, what="the wait for the first fire")
        nxt = datetime.fromisoformat(st["next_run_at"]).astimezone()
        assert (nxt.month, nxt.day, nxt.hour, nxt.minute) == (1, 1, 3, 0)
        assert st["schedule"]["expression"] == "cron 0 3 1 1 *" and st["runs"] == 0
        os.replace(ws.root / "Specs/feature", ws.root / "Done/feature")  # moving it to Done/ ends the schedule
        assert proc.wait(timeout=60) == 0
    finally:
        _stop(proc)
    assert not (ws.root / "side_effects.log").exists()
    assert ws.state("cr")["status"] == "completed"


def test_waiting_scheduled_loops_give_their_watch_slot_to_others(ws: Workspace) -> None:
    """With max_parallel_loops 1, two tasks every 1s both keep running: a loop waiting for its next
    run does not hold the only place."""
    ws.task(shell_task(1, cmd='echo a >> a.log', extra_frontmatter="schedule: {every: 1s}"), "Specs/a/tasks.md")
    ws.task(shell_task(1, cmd='echo b >> b.log', extra_frontmatter="schedule: {every: 1s}"), "Specs/b/tasks.md")
    proc = ws.spawn("loop", "watch", "--max-parallel", "1")
    try:
        def runs(name: str) -> int:
            p = ws.root / f"{name}.log"
            return len(p.read_text().split()) if p.exists() else 0

        ws.wait_for(lambda: runs("a") >= 2 and runs("b") >= 2, timeout=120, what="both tasks to run twice")
    finally:
        _stop(proc)


def test_removing_the_schedule_line_makes_the_current_run_the_last(ws: Workspace) -> None:
    path = ws.task(shell_task(1, cmd='sleep 0.3; echo "$KIRO_STEP_ID" >> side_effects.log',
                              extra_frontmatter="schedule: {every: 1s}"))
    proc = ws.spawn("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "rm")
    try:
        ws.wait_for(lambda: _events(ws, "rm", "run_finished"), timeout=60, what="run 1")
        path.write_text(path.read_text().replace("schedule: {every: 1s}\n", ""))  # a person edits the file
        assert proc.wait(timeout=60) == 0
    finally:
        _stop(proc)
    assert (ws.root / "Done/feature/tasks.md").exists()  # completed like any task, moved to Done/
    st = ws.state("rm")
    assert st["status"] == "completed" and st["next_run_at"] is None
    assert any("`schedule:` was removed" in e["message"] for e in _events(ws, "rm", "warning"))


def test_max_iterations_and_timeout_count_per_run(ws: Workspace) -> None:
    """Four runs of two steps each: 8 iterations and more than 3 s of loop life, with max_iterations 3
    and timeout_seconds 3 per run. A nightly job must not stop for good after a few nights."""
    ws.task(shell_task(2, extra_frontmatter="schedule: {every: 1s}\nmax_iterations: 3\ntimeout_seconds: 3"))
    proc = ws.spawn("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "lim")
    try:
        ws.wait_for(lambda: len(_events(ws, "lim", "run_finished")) >= 4, timeout=120, what="four runs")
        os.replace(ws.root / "Specs/feature", ws.root / "Done/feature")
        assert proc.wait(timeout=60) == 0, ws.output(proc)
    finally:
        _stop(proc)
    st = ws.state("lim")
    assert st["iteration"] >= 8 and st["status"] == "completed" and st["stop_reason"] == "task_in_done"
    assert not (ws.root / "Needs_Action/intervention_lim.md").exists()


def test_a_restarted_watch_takes_the_schedule_up_again(ws: Workspace) -> None:
    """The machine reboots (watch is killed between runs); a new `kiro loop watch` adopts the loop and
    its schedule goes on: the missed fires make one catch-up run, under the same task id."""
    ws.task(shell_task(1, extra_frontmatter="schedule: {every: 2s}"), "Specs/job/tasks.md")
    proc = ws.spawn("loop", "watch")
    try:
        tid = ws.wait_for(lambda: ws.only_task_id(), timeout=60, what="the loop")
        ws.wait_for(lambda: ws.state(tid)["status"] == "sleeping" and ws.state(tid)["runs"] >= 1, timeout=60,
                    what="the wait after run 1")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        _stop(proc)
    runs = ws.state(tid)["runs"]
    due = datetime.fromisoformat(ws.state(tid)["next_run_at"])
    ws.wait_for(lambda: datetime.now(UTC) > due + timedelta(seconds=2.5), timeout=30, what="downtime")
    proc = ws.spawn("loop", "watch")
    try:
        fired = ws.wait_for(lambda: [e for e in _events(ws, tid, "schedule_fired") if e["run"] == runs + 1],
                            timeout=90, what="the schedule to go on")
        assert fired[0]["catch_up"] is True and fired[0]["missed"] >= 1
        ws.wait_for(lambda: [e for e in _events(ws, tid, "run_finished") if e["run"] == runs + 1], timeout=60,
                    what="the catch-up run to finish")
    finally:
        _stop(proc)
    assert ws.only_task_id() == tid  # the same loop, not a new one


def test_a_run_killed_mid_step_resumes_without_rerunning_and_recalls_again(ws: Workspace) -> None:
    """kill -9 during run 2's second step: `resume` continues run 2 at that step (step 1 is not done
    again), its prompt carries run 1's summary again, and the schedule goes on."""

    class SlowAgent(Agent):
        def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
            reply = super().__call__(body)
            with self.lock:
                if "tools" in body and len(self.step_requests) == 5 and not getattr(self, "slowed", False):
                    self.slowed = True  # run 2, step 2: the model takes long; kiro is killed meanwhile
                    return {**reply, "delay": 60}
            return reply

    with FakeOpenAI() as fake:
        agent = SlowAgent(ws, done_after=2)
        fake.responder = agent
        openai_config(ws, fake)
        ws.task(TWO_STEPS.replace("{every: 2s}", "{every: 1s}"), "Specs/nightly/tasks.md")
        proc = ws.spawn("loop", "start", "--task", "Specs/nightly/tasks.md", "--task-id", "kill")
        try:
            ws.wait_for(lambda: getattr(agent, "slowed", False), timeout=60, what="run 2's slow step")
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            _stop(proc)
        assert ws.state("kill")["runs"] == 2
        r = ws.kiro("loop", "resume", "--task-id", "kill", timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
    by_run: dict[int, list[str]] = {}
    for run, text in agent.step_requests:
        by_run.setdefault(run, []).append(text)
    # run 1: memory_save + 2 steps; run 2: step 1, step 2 (killed), step 2 again after the resume
    assert [len(by_run[1]), len(by_run[2])] == [3, 3]
    def step_of(text: str) -> str:
        return text.split("# Current step: ", 1)[1].split(" ", 1)[0]

    assert [step_of(t) for t in by_run[2]] == ["1", "2", "2"]
    assert "SUMMARY-OF-RUN-1" in by_run[2][2]
    done = [c["step_id"] for c in ws.state("kill")["completed_steps"]]
    assert done == ["1", "2", "1", "2"]  # nothing completed twice within a run
    assert [e["run"] for e in _events(ws, "kill", "run_finished")] == [1, 2]


def test_a_secret_in_the_title_reaches_neither_the_run_summary_prompt_nor_its_memory(ws: Workspace) -> None:
    """The forced run summary's prompt quotes the task's title and steps: a known secret there is cut
    before the request leaves, as in every step's prompt."""
    secret = "tok-" + "5" * 28
    bodies: list[str] = []
    with FakeOpenAI() as fake:
        agent = Agent(ws, done_after=1)

        def record(body: dict[str, Any]) -> dict[str, Any]:
            bodies.append(json.dumps(body))
            return agent(body)

        fake.responder = record
        openai_config(ws, fake)
        ws.task(TWO_STEPS.replace("title: Nightly inbox check", f"title: Nightly check with {secret}"),
                "Specs/nightly/tasks.md")
        proc = ws.spawn("loop", "start", "--task", "Specs/nightly/tasks.md", "--task-id", "keyed",
                        env=ws.env(ACME_MAIL_TOKEN=secret))
        try:
            assert proc.wait(timeout=120) == 0
        finally:
            _stop(proc)
    summary_requests = [b for b in bodies if '"tools"' not in b]
    assert len(summary_requests) == 1 and "Nightly check with [REDACTED]" in summary_requests[0]
    assert not [b for b in bodies if secret in b]
    assert secret.encode() not in (ws.root / ".state/memory.db").read_bytes()
