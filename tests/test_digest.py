"""The digest and the notifications that reach a phone (SPEC §14): `Logs/digest/<date>.md` written when
real loops end, `kiro loop digest`, the `kiro serve` page, and `notify:` URLs sent through Apprise to a
receiver on 127.0.0.1 (Apprise's `json://`, a tiny http.server in the test)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import FAST_CONFIG, Workspace, new_workspace, openai_config, shell_task
from tests.fake_openai import FakeOpenAI, call, usage
from tests.serve_helpers import start_server, stop_loops

FLAKY = 'if [ -f "tried_$KIRO_STEP_ID" ]; then exit 0; fi; touch "tried_$KIRO_STEP_ID"; exit 1'
SECTIONS = ("## In short", "## Done", "## Waiting for you", "## Cost and tokens by agent",
            "## Time slept on usage limits", "## Failures", "## Loops that ended")


class Receiver:
    """An HTTP server on 127.0.0.1 that keeps every JSON body posted to it (what Apprise's json:// sends)."""

    def __init__(self, on_message: Any = None) -> None:
        self.got: list[dict[str, Any]] = []
        self.on_message = on_message
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                message = json.loads(body)
                receiver.got.append(message)
                self.send_response(200)
                self.end_headers()
                if receiver.on_message is not None:
                    receiver.on_message(message)

            def log_message(self, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again: nothing listens there


def _today() -> str:
    return datetime.now().astimezone().date().isoformat()


def _three_loops(ws: Workspace) -> None:
    """A loop that completes, one that completes after retries, one that fails (its escalation waits in
    Needs_Action/)."""
    ws.task(shell_task(3, title="Plain"), "Specs/plain/tasks.md")
    ws.task(shell_task(2, cmd=FLAKY, title="Flaky"), "Specs/flaky/tasks.md")
    ws.task(shell_task(1, cmd="echo 'database is down' >&2; exit 1", title="Broken",
                       extra_frontmatter="failure_threshold: 2"), "Specs/broken/tasks.md")
    assert ws.kiro("loop", "start", "--task", "Specs/plain/tasks.md", "--task-id", "plain").returncode == 0
    assert ws.kiro("loop", "start", "--task", "Specs/flaky/tasks.md", "--task-id", "flaky").returncode == 0
    assert ws.kiro("loop", "start", "--task", "Specs/broken/tasks.md", "--task-id", "broken").returncode == 5


@pytest.fixture(scope="module")
def three_loops(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    """`_three_loops` run once, shared by the tests that only read its workspace (or serve it)."""
    ws = new_workspace(tmp_path_factory.mktemp("three") / "vault")
    _three_loops(ws)
    return ws


def test_loops_that_end_write_the_digest_and_its_figures_agree_with_stats_and_receipts(three_loops: Workspace) -> None:
    ws = three_loops
    path = ws.root / "Logs" / "digest" / f"{_today()}.md"
    text = path.read_text()
    print(text)
    for section in SECTIONS:
        assert f"\n{section}\n" in text, section

    stats = json.loads(ws.run("loop", "stats", "--json", "--since", _today()).stdout)
    digest = json.loads(ws.run("loop", "digest", "--json").stdout)
    assert digest["date"] == _today()
    assert len(digest["done"]) == stats["steps"]["completed"] == 5
    assert digest["steps"] == stats["steps"] and digest["usage"] == stats["usage"]
    assert digest["waiting_seconds"] == stats["waiting_seconds"]
    assert f"- 5 steps done ({stats['steps']['attempts']} attempts, {stats['steps']['failed']} failed)" in text

    # each step done is a row naming its receipt, with the receipt's figures
    for tid in ("plain", "flaky"):
        receipts = json.loads(ws.run("loop", "receipt", "--task-id", tid, "--json").stdout)
        for r in receipts:
            row = next(d for d in digest["done"] if d["task_id"] == tid and d["step_id"] == r["step_id"])
            assert row["attempts"] == r["receipt"]["attempts"] and row["by"] == r["receipt"]["executor"] == "shell"
            assert f"`kiro loop receipt --task-id {tid} --step {r['step_id']}`" in text
    assert next(d for d in digest["done"] if d["task_id"] == "flaky")["attempts"] == 2

    # what waits for a person, and the failures with their causes
    assert "[Needs_Action/escalation_broken.md](../../Needs_Action/escalation_broken.md)" in text
    assert digest["failures"]["count"] == stats["steps"]["failed"] + 1  # each failed attempt, and the loop
    assert "loop broken, step 1 attempt 2:" in text and "database is down" in text
    assert "loop broken: failed (failure_threshold)" in text

    # `kiro loop digest` prints the same digest (computed now: only its "written" time may differ)
    printed = ws.run("loop", "digest")
    assert printed.returncode == 0
    assert [ln for ln in printed.stdout.splitlines() if "written" not in ln] == \
        [ln for ln in text.splitlines() if "written" not in ln]
    other = ws.run("loop", "digest", "--date", "2020-01-01")
    assert other.returncode == 0 and "No step was done in this period." in other.stdout
    bad = ws.run("loop", "digest", "--date", "yesterday")
    assert bad.returncode == 1 and bad.stderr.strip() == "kiro: --date 'yesterday': use a date like 2026-11-28"


def test_bad_digest_settings_are_one_line_and_the_notify_url_is_not_echoed(ws: Workspace) -> None:
    ws.task(shell_task(1))
    secret = "Tk9sekr1tW0rd_abc123"
    for setting, says in ((f"notify: ['nonsense://{secret}']\n", "notify: item 1 is not a URL Apprise can send to"),
                          ("digest_at: '25:00'\n", "digest_at"),
                          ("notify_on: [everything]\n", "notify_on")):
        ws.write("config/autonomous_loop.yaml", FAST_CONFIG + setting)
        r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md")
        print(setting.strip(), "->", r.stderr.strip())
        assert r.returncode == 1 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1
        assert secret not in r.stderr + r.stdout and "Traceback" not in r.stderr
        assert not (ws.root / ".state" / "autonomous_loop_feature.json").exists()


DIGEST_MARGIN = 8  # seconds from the test's start of a loop to its digest_at


def _zone_at(seconds: int) -> tuple[dict[str, str], datetime]:
    """A time zone (TZ) in which the local time now is `seconds` past a minute (UTC shifted by under a minute),
    and that local time now, naive."""
    utc = datetime.now(UTC).replace(tzinfo=None)
    shift = (seconds - utc.second) % 60
    return {"TZ": f"<KIRO>-00:00:{shift:02d}"}, utc + timedelta(seconds=shift)


def test_notify_sends_the_digest_at_digest_at_and_the_loop_finished_with_the_digest(ws: Workspace) -> None:
    """digest_at is the next minute (always DIGEST_MARGIN s away, in a time zone made for it: kiro has that long
    to start its loop, whose digest clock then waits for that minute; a minute that comes before the loop runs
    is tomorrow's, and the step says so if it began too late); the step waits until the receiver has the daily
    digest (the receiver opens the step's gate), then the loop ends and its loop_finished notification carries
    the digest too. The wait for digest_at is inherent: whole minutes, the margin is the loop's start."""
    gate, late = ws.root / "gate", ws.root / "late"
    r = Receiver(on_message=lambda m: m["title"].startswith("kiro digest") and gate.write_text("open"))
    try:
        assert ws.kiro("--version").returncode == 0  # (the first kiro of a test process waits for its imports)
        zone, local = _zone_at(60 - DIGEST_MARGIN)
        at = local + timedelta(seconds=DIGEST_MARGIN)
        due = int(time.time() + (at.replace(microsecond=0) - local).total_seconds())  # digest_at, epoch seconds
        ws.write("config/autonomous_loop.yaml", FAST_CONFIG + f"digest_at: '{at:%H:%M}'\n"
                 f"notify: ['json://127.0.0.1:{r.port}/hook']\nstep_timeout_seconds: 300\n")
        wait = (f'[ "$(date +%s)" -lt {due} ] || {{ date +%s > "{late}"; exit 1; }}\n'  # the clock began after it
                f'for i in $(seq 1 3000); do [ -f "{gate}" ] && exit 0; sleep 0.05; done; exit 1')
        ws.task(shell_task(1, cmd=wait, title="Waits for the digest"))
        done = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "night", timeout=280,
                       env=ws.env(**zone))
        assert not late.exists(), f"the step began {int(late.read_text()) - due} s after digest_at: too loaded?"
        assert done.returncode == 0, done.stderr
        titles = [m["title"] for m in r.got]
        print(titles)
        today = at.date().isoformat()
        daily = next(m for m in r.got if m["title"] == f"kiro digest {today}")
        assert "## Done" in daily["message"] and "## Waiting for you" in daily["message"]
        assert (ws.root / "Logs" / "digest" / f"{today}.md").exists()
        finished = next(m for m in r.got if m["title"] == "kiro: loop night completed (all_steps_done)")
        # done after digest_at: in the next date's digest
        assert "| night | 1 | Step number 1 | shell | 1 |" in finished["message"]
        assert finished["type"] == "info"
        assert not [e for e in ws.events("night") if e["event"] == "notifier_failed"]
    finally:
        r.close()


def test_a_question_for_a_person_is_sent_as_human_requested_with_tokens_and_cost_in_the_digest(
        ws: Workspace, fake: FakeOpenAI, receiver: Receiver) -> None:
    """The openai executor (the scripted server on 127.0.0.1): step 1 done with tokens and a price, then the agent
    asks a person; notify_on names only human_requested, so that is the one message sent."""
    ws.task("- [ ] 1. Pick the port\n- [ ] 2. Pick the database\n")
    openai_config(ws, fake, llm="  prices: {fake-model: {input_per_1m: 1000, output_per_1m: 2000}}\n",
                  extra=f"notify: ['json://127.0.0.1:{receiver.port}/phone']\nnotify_on: [human_requested]\n")
    fake.reply(call("complete_step", {"summary": "port 8080"}), usage=usage(300, 40))
    fake.reply(call("request_human", {"question": "Postgres or SQLite for production?"}), usage=usage(200, 10))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "ai")
    assert r.returncode == 6, r.stdout + r.stderr
    assert [m["title"] for m in receiver.got] == ["kiro: loop ai paused (request_human)"]
    assert "Needs_Action/request_ai.md" in receiver.got[0]["message"]
    assert receiver.got[0]["type"] == "warning"

    st = ws.state("ai")
    digest = json.loads(ws.run("loop", "digest", "--json").stdout)
    assert digest["usage"]["total_tokens"] == st["usage"]["total_tokens"] == 550
    assert digest["usage"]["cost_usd"] == pytest.approx(st["usage"]["cost_usd"])
    receipt = st["completed_steps"][0]["receipt"]
    [row] = digest["done"]
    assert (row["tokens"], row["cost_usd"]) == (receipt["total_tokens"], receipt["cost_usd"]) == (340, 0.38)
    assert [w["path"] for w in digest["waiting"]] == ["Needs_Action/request_ai.md"]
    text = (ws.root / "Logs" / "digest" / f"{_today()}.md").read_text()
    assert "- [Needs_Action/request_ai.md](../../Needs_Action/request_ai.md)" in text
    assert "- 550 tokens, $0.6000" in text


def test_a_protected_path_change_waiting_for_approval_is_sent(ws: Workspace, receiver: Receiver) -> None:
    ws.write("tests/test_a.py", "def test_a():\n    assert 1 + 1 == 2\n")
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "protected_paths: ['tests/**']\n"
             f"notify: ['json://127.0.0.1:{receiver.port}/phone']\nnotify_on: [approval_waiting]\n")
    weaken = 'if [ -f tried ]; then exit 0; fi; touch tried; echo "def test_a(): pass" > tests/test_a.py'
    ws.task(shell_task(1, cmd=weaken))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "guarded")
    assert r.returncode == 0, r.stdout + r.stderr  # the honest retry completes
    [proposal] = [e["proposal"] for e in ws.events("guarded") if e["event"] == "protected_paths_changed"]
    assert [m["title"] for m in receiver.got] == ["kiro: loop guarded: step 1 changed protected paths"]
    assert proposal in receiver.got[0]["message"] and "changed tests/test_a.py" in receiver.got[0]["message"]
    text = (ws.root / "Logs" / "digest" / f"{_today()}.md").read_text()
    assert f"- [{proposal}](../../{proposal})" in text  # waiting for a person


def test_notify_on_limits_what_is_sent(ws: Workspace, receiver: Receiver) -> None:
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + f"notify: ['json://127.0.0.1:{receiver.port}/a']\n"
             "notify_on: [human_requested]\n")
    ws.task(shell_task(1))
    assert ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md").returncode == 0
    assert receiver.got == []  # loop_finished is not in notify_on
    assert (ws.root / "Logs" / "digest" / f"{_today()}.md").exists()  # the digest is written all the same


def test_a_dead_receiver_is_a_notifier_failed_event_and_its_token_is_nowhere(ws: Workspace, receiver: Receiver,
                                                                            capfd: pytest.CaptureFixture[str]) -> None:
    token, password = "Tk9sekr1tW0rd_abc123", "pAssw0rd-xyz987"
    dead = f"json://kiro:{password}@127.0.0.1:{_dead_port()}/hooks/{token}"
    live = f"json://127.0.0.1:{receiver.port}/hooks/{token}"
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + f"notify: ['{dead}', '{live}']\n")
    ws.task(shell_task(2, title="Still completes"))
    run = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "deaf")
    assert run.returncode == 0, run.stderr
    failed = [e for e in ws.events("deaf") if e["event"] == "notifier_failed"]
    print(failed)
    assert len(failed) == 1 and failed[0]["kind"] == "loop_finished"
    assert failed[0]["error"].startswith("notify URL 1: ")
    assert [m["title"] for m in receiver.got] == ["kiro: loop deaf completed (all_steps_done)"]  # the second URL

    shown = [run.stdout, run.stderr]
    for args in (("loop", "status"), ("loop", "status", "--json"), ("loop", "logs", "--task-id", "deaf"),
                 ("loop", "state", "--task-id", "deaf"), ("loop", "digest"), ("loop", "stats")):
        r = ws.run(*args)
        shown += [r.stdout, r.stderr]
    files = [p for p in ws.root.rglob("*") if p.is_file() and "config" not in p.parts]
    tried = {"console lines": "\n".join(shown),
             **{str(p.relative_to(ws.root)): p.read_text(errors="replace") for p in files}}
    held = [where for where, text in tried.items() if token not in text and password not in text]
    print(f"looked for the notify URLs' token and password in {len(tried)} places; {len(held)} held")
    assert len(held) == len(tried), sorted(set(tried) - set(held))
    # what was sent passed the redactor too: the URL's own token is cut from the message
    assert all(token not in json.dumps(m) for m in receiver.got)


def test_the_serve_digest_page_needs_the_token_and_shows_the_digest(three_loops: Workspace) -> None:
    ws = three_loops
    served = start_server(ws)
    try:
        page = served.get("/digest")
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert f"<h1>kiro digest {_today()}</h1>" in page.text
        assert "<td>plain</td>" in page.text and "<code>Needs_Action/escalation_broken.md</code>" in page.text
        data = served.get("/api/digest").json()
        cli = json.loads(ws.run("loop", "digest", "--json").stdout)
        assert [(d["task_id"], d["step_id"]) for d in data["done"]] == [(d["task_id"], d["step_id"])
                                                                        for d in cli["done"]]
        old = served.get("/digest", params={"date": "2020-01-01"})
        assert "No step was done in this period." in old.text
        assert served.get("/api/digest", params={"date": "soon"}).status_code == 400
        with httpx.Client(base_url=served.base) as anon:
            assert anon.get("/digest").status_code == 401
            assert anon.get("/api/digest").status_code == 401
            assert anon.get("/digest", headers={**served.auth, "Host": "evil.example"}).status_code == 403
        assert 'id="digest-link"' in served.get("/").text
    finally:
        served.stop()
        stop_loops(ws.root)


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="no chromium (apt-get install chromium)")
def test_the_dashboards_digest_link_opens_the_digest_in_a_browser(three_loops: Workspace) -> None:
    """Set KIRO_DIGEST_SCREENSHOT=docs/digest.png to save the screenshot the docs show."""
    sync_api = pytest.importorskip("playwright.sync_api")
    from tests.test_dashboard_browser import FLAGS

    ws = three_loops
    (ws.root / "Pending_Approval").mkdir()
    waiting = ws.root / "Pending_Approval" / "steps_plain_1.md"
    waiting.write_text("# proposed steps\n")
    served = start_server(ws)
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
            page = browser.new_page(viewport={"width": 1200, "height": 1400})
            page.goto(f"{served.base}/?token={served.token}")
            page.click("#digest-link")
            page.wait_for_selector("h1")
            assert page.inner_text("h1") == f"kiro digest {_today()}"
            assert "token=" not in page.url  # the token left the address bar
            assert "Pending_Approval/steps_plain_1.md" in page.inner_text("main")
            shot = os.environ.get("KIRO_DIGEST_SCREENSHOT")
            if shot:
                page.screenshot(path=str(Path(shot).resolve()), full_page=True)
            browser.close()
    finally:
        served.stop()
        stop_loops(ws.root)
        shutil.rmtree(waiting.parent)  # the other tests of `three_loops` read what waits for a person


def test_a_digests_date_names_the_24_hours_up_to_digest_at() -> None:
    from datetime import date

    from kiro.views.digest import day_of, next_time, period

    def local(*a: int) -> datetime:
        return datetime(*a).astimezone()  # type: ignore[arg-type]

    assert period(date(2026, 11, 29), "07:00") == (local(2026, 11, 28, 7, 0), local(2026, 11, 29, 7, 0))
    assert period(date(2026, 11, 29), None) == (local(2026, 11, 29), local(2026, 11, 30))
    assert day_of(local(2026, 11, 28, 14, 0), "07:00") == date(2026, 11, 29)  # read the next morning
    assert day_of(local(2026, 11, 29, 6, 59), "07:00") == date(2026, 11, 29)
    assert day_of(local(2026, 11, 29, 7, 0), "07:00") == date(2026, 11, 30)
    assert day_of(local(2026, 11, 28, 23, 59), None) == date(2026, 11, 28)
    assert next_time(local(2026, 11, 28, 7, 0), "07:00") == local(2026, 11, 29, 7, 0)
    assert next_time(local(2026, 11, 28, 6, 0), "07:00") == local(2026, 11, 28, 7, 0)


def test_a_digest_that_cannot_be_written_is_a_warning_and_the_loop_still_completes(ws: Workspace) -> None:
    ws.write("Logs/digest", "a file where the folder would go\n")
    ws.task(shell_task(1))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "blocked")
    assert r.returncode == 0, r.stdout + r.stderr
    warnings = [e["message"] for e in ws.events("blocked") if e["event"] == "warning"]
    assert any(w.startswith("could not write the digest: ") for w in warnings), warnings
    assert (ws.root / "Logs" / "digest").read_text() == "a file where the folder would go\n"


def test_a_long_history_costs_the_digest_the_events_of_its_day_with_the_same_figures(
        ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    """A loop's end computes the day's digest over every log of the workspace (and `stats --since` reads them
    too): a log is bisected on its events' times, so three days of history before today cost a few lines, and
    the figures are those of reading every line (an 80 MB log: 4.2 s of CPU a digest before, 0.3 s after)."""
    from kiro import jsonl
    from kiro.store import logread

    now = datetime.now().astimezone()
    old = now - timedelta(days=3)
    history = [{"ts": (old + timedelta(seconds=i)).isoformat(), "event": "step_failed", "task_id": "old",
                "step_id": "1", "attempt": i, "error": "long ago"} for i in range(30_000)]
    day = [{"ts": now.isoformat(), "event": "step_failed", "task_id": "old", "step_id": "2", "attempt": 1,
            "error": "today's failure"},
           {"ts": now.isoformat(), "event": "loop_finished", "task_id": "old", "status": "failed",
            "reason": "failure_threshold", "message": "too many failures", "exit_code": 5}]
    (ws.root / "Logs").mkdir(exist_ok=True)
    (ws.root / "Logs" / "old.jsonl").write_text("".join(json.dumps(e) + "\n" for e in history + day))
    parsed: list[int] = []
    record = jsonl.record

    def counted(line: bytes | str) -> dict[str, Any] | None:
        parsed.append(1)
        return record(line)

    def digest_and_stats() -> tuple[dict[str, Any], str]:
        parsed.clear()
        done = ws.run("loop", "digest", "--json")
        assert done.returncode == 0, done.stderr
        stats = ws.run("loop", "stats", "--since", now.date().isoformat())
        assert stats.returncode == 0, stats.stderr
        return {k: v for k, v in json.loads(done.stdout).items() if k != "written_at"}, stats.stdout

    monkeypatch.setattr(jsonl, "record", counted)
    bisected = digest_and_stats()
    lines = len(parsed)
    monkeypatch.setattr(logread, "SINCE_WHOLE_BYTES", 1 << 40, raising=False)  # every log read whole
    whole = digest_and_stats()
    assert bisected == whole
    assert bisected[0]["failures"]["count"] == 2, bisected[0]["failures"]  # today's step and the loop's end
    assert [f["cause"] for f in bisected[0]["failures"]["latest"]][:1] == ["today's failure"]
    assert len(parsed) > 2 * 30_000 and lines < 2_000, (lines, len(parsed))


def test_the_digest_reads_each_log_once(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    """The digest's figures (kiro.views.stats) and its own lists (failures, usage limits, loops ended) come from
    one reading of each event log: a day of 2,000 events is parsed 2,000 times, not twice that."""
    from kiro import jsonl

    now = datetime.now().astimezone()
    events = [{"ts": now.isoformat(), "event": "step_failed", "task_id": "busy", "step_id": "1", "attempt": i,
               "error": f"failure {i}"} for i in range(2_000)]
    (ws.root / "Logs").mkdir(exist_ok=True)
    (ws.root / "Logs" / "busy.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    parsed: list[int] = []
    record = jsonl.record

    def counted(line: bytes | str) -> dict[str, Any] | None:
        parsed.append(1)
        return record(line)

    monkeypatch.setattr(jsonl, "record", counted)
    done = ws.run("loop", "digest", "--json")
    assert done.returncode == 0, done.stderr
    digest = json.loads(done.stdout)
    assert digest["failures"]["count"] == 2_000 and digest["steps"]["failed"] == 2_000, digest["failures"]
    assert digest["failures"]["latest"][-1]["cause"] == "failure 1999"
    assert 2_000 <= len(parsed) < 2 * 2_000, len(parsed)


def test_the_digest_of_many_ended_loops_keeps_their_steps_not_their_whole_states(tmp_path: Path) -> None:
    """A thousand loops of one process that end together compute the day's digest from every state file: it
    held each loop's whole state at once (every completed step, its receipt, the step records), the peak of
    the run (issue #41: <= 250 MB at 1,000 loops x 10 steps). Now each state gives its steps of the day as it
    is read and keeps only what the figures read. 100 states of 40 steps, tracemalloc's peak (bytes, not a
    time): 11.5 MB before, 4.3 MB after; the digest lists every step, its figures as before."""
    import gc
    import tracemalloc

    from kiro import timeutil
    from kiro.store.receipts import Receipt
    from kiro.store.state import CompletedStep, LoopState
    from kiro.store.statestore import StateStore
    from kiro.store.workspace import Workspace as KiroWorkspace
    from kiro.views import digest, stats

    (tmp_path / ".state").mkdir()
    store = StateStore(KiroWorkspace(tmp_path))
    now = timeutil.iso()
    for n in range(100):
        state = LoopState(task_id=f"task_20261130_{n:06d}", task_path=f"Specs/t{n}/tasks.md", status="completed",
                          executor="openai", max_iterations=100, title=f"loop {n}", iteration=40, started_at=now)
        for i in range(40):
            step = CompletedStep(step_id=str(i), description=f"Step {i} of loop {n}", completed_at=now,
                                 duration_seconds=0.012, iteration=i + 1, summary=f"step {i} done " + "x" * 200)
            step.receipt = Receipt(step_id=str(i), title=f"Step {i}", executor="openai", model="bench", attempts=1,
                                   started_at=now, finished_at=now, duration_seconds=0.012, prompt_tokens=50,
                                   completion_tokens=5, total_tokens=55, cost_usd=0.001, verify=None,
                                   checkpoint=None, checkpoint_note="no changes", diff_stat=None, protected=None,
                                   recovered=False)
            state.completed_steps.append(step)
        store.save(state)
    day = digest.day_of(datetime.now().astimezone(), None)
    digest.compute(store, day, None)  # the models built, the modules imported: not in the figure
    gc.collect()
    tracemalloc.start()
    try:
        figures = digest.compute(store, day, None)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(figures["done"]) == 4_000 and figures["done"][0]["tokens"] == 55
    assert figures["usage"] == stats.compute(store, *digest.period(day, None))["usage"]
    assert peak < 6_000_000, peak
