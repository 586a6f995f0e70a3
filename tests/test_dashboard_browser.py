"""The dashboard page in a real browser: Debian's chromium, headless, driven by Playwright (the system
browser, no `playwright install`). Every request that leaves the server's origin is blocked and
recorded: the page must need none. `.ci/run` installs chromium with apt.

Set KIRO_DASHBOARD_SCREENSHOT=docs/dashboard.png to save the screenshot the README shows.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Workspace, shell_task
from tests.serve_helpers import Served, start_server, stop_loops

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run",
         # the network is cut off: anything not on 127.0.0.1 goes to a proxy that does not exist
         "--proxy-server=http://127.0.0.1:9", "--proxy-bypass-list=127.0.0.1"]
GATED = 'while [ ! -f "gate_$KIRO_STEP_ID" ]; do sleep 0.02; done'

sync_api = pytest.importorskip("playwright.sync_api")

if not os.path.exists(CHROMIUM):
    if os.environ.get("CI"):
        raise RuntimeError("chromium is missing: .ci/run installs it with apt-get install chromium")
    pytest.skip("no chromium (apt-get install chromium)", allow_module_level=True)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One chromium for the module's tests (its start is most of a test's CPU): each test opens its pages in
    a context of its own (`new_page`), which shares no cookies, storage or routes with another's."""
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        yield b
        b.close()


@pytest.fixture
def served(ws: Workspace) -> Iterator[Served]:
    s = start_server(ws)
    yield s
    s.stop()
    stop_loops(ws.root)


def test_dashboard_lists_loops_updates_live_and_its_stop_button_pauses_the_loop(
        ws: Workspace, served: Served, browser: Any) -> None:
    # three loops in three states: completed, failed, and one running in another kiro process
    ws.task(shell_task(3, title="Email templates"), "Specs/email/tasks.md")
    assert ws.kiro("loop", "start", "--task", "Specs/email/tasks.md", "--task-id", "email_templates").returncode == 0
    ws.task(shell_task(2, cmd="echo 'connection refused' >&2; exit 1", title="Database migration",
                       extra_frontmatter="failure_threshold: 2"), "Specs/db/tasks.md")
    assert ws.kiro("loop", "start", "--task", "Specs/db/tasks.md", "--task-id", "database_migration").returncode == 5
    # an agent CLI that fails at once: the card says why, in the CLI's words, with the log's path whole
    ws.task("---\ntitle: Agent notes\nexecutor: command\nfailure_threshold: 1\n---\n- [ ] 1. Write notes\n",
            "Specs/notes/tasks.md")
    agent = "sh -c 'echo \"error: model gpt-9 not found\" >&2; exit 1'"
    assert ws.kiro("loop", "start", "--task", "Specs/notes/tasks.md", "--task-id", "agent_notes",
                   env=ws.env(KIRO_EXECUTOR_COMMAND=agent)).returncode == 5
    ws.task(shell_task(4, cmd=GATED, title="Auth feature"), "Specs/auth/tasks.md")
    (ws.root / "gate_1").touch()
    loop = ws.spawn("loop", "start", "--task", "Specs/auth/tasks.md", "--task-id", "auth_feature")
    ws.wait_for(lambda: [e for e in ws.events("auth_feature") if e["event"] == "step_completed"], what="step 1")

    # bypass_csp: Playwright evaluates its wait conditions as strings, which the page's CSP forbids
    page = browser.new_page(viewport={"width": 1440, "height": 900}, bypass_csp=True)
    outside: list[str] = []
    errors: list[str] = []

    def gate(route: Any) -> None:
        if route.request.url.startswith(served.base):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    page.route("**/*", gate)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{served.base}/?token={served.token}")

    card = "article.card[data-task-id='auth_feature']"
    page.wait_for_selector(card)
    page.wait_for_selector("#live.on")  # the EventSource is connected
    assert set(page.eval_on_selector_all("article.card", "els => els.map(e => e.dataset.taskId)")) == {
        "auth_feature", "email_templates", "database_migration", "agent_notes"}
    assert page.inner_text(f"{card} [data-role=status]").lower() == "running"
    assert page.inner_text(f"{card} [data-role=steps]") == "1/4"
    assert page.inner_text("article.card[data-task-id='database_migration'] [data-role=status]").lower() == "failed"
    # how a failed loop ended is on its card, not only in `kiro loop logs`
    assert "connection refused" in page.inner_text("article.card[data-task-id='database_migration'] [data-role=cause]")
    notes = "article.card[data-task-id='agent_notes']"
    cause = page.inner_text(f"{notes} [data-role=cause]")
    assert "error: model gpt-9 not found" in cause and "Logs/agent_notes/1-1.log" in cause, cause
    assert "token=" not in page.url, "the token is taken out of the address bar"

    # a step completes in the other process: the card follows, with no reload
    (ws.root / "gate_2").touch()
    page.wait_for_function(f"document.querySelector(\"{card} [data-role=steps]\").textContent === '2/4'")
    page.wait_for_function("Array.from(document.querySelectorAll('#feed li')).some(li => "
                           "li.textContent.includes('step_completed') && li.textContent.includes('2 in '))")
    shot = os.environ.get("KIRO_DASHBOARD_SCREENSHOT")
    if shot:
        Path(shot).parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=shot, full_page=False)

    # the stop button: the loop pauses at its next safe point and its process exits 3
    page.click(f"{card} button[data-act=stop]")
    try:
        ws.wait_for(lambda: (ws.root / ".hooks" / "stop_autonomous_loop_auth_feature.md").exists(), what="stop hook")
    except AssertionError:
        raise AssertionError(f"no stop hook; the page said: {page.inner_text('#toast')!r}") from None
    (ws.root / "gate_3").touch()  # the running step ends
    assert loop.wait(60) == 3, ws.output(loop)
    page.wait_for_function(
        f"document.querySelector(\"{card} [data-role=status]\").textContent.toLowerCase() === 'paused'")
    assert page.is_enabled(f"{card} button[data-act=resume]")
    assert ws.state("auth_feature")["status"] == "paused"

    # a shell loop runs its steps' own commands: no agent would read a message, so the button says so
    assert not page.is_enabled(f"{card} button[data-act=message]")
    assert "no agent reads messages" in (page.get_attribute(f"{card} button[data-act=message]", "title") or "")
    # an agent's loop: the message form queues a message in the loop's inbox
    page.click(f"{notes} button[data-act=message]")
    page.fill(f"{notes} form.msg textarea", "Use bcrypt for the passwords")
    page.click(f"{notes} form.msg button[type=submit]")
    page.wait_for_selector("#toast .toast:has-text('message queued')")
    inbox = (ws.root / ".state" / "inbox" / "agent_notes.jsonl").read_text()
    assert "Use bcrypt for the passwords" in inbox

    # resume: the loop goes on in the background and completes; the card follows
    (ws.root / "gate_4").touch()
    page.click(f"{card} button[data-act=resume]")
    page.wait_for_function(
        f"document.querySelector(\"{card} [data-role=status]\").textContent.toLowerCase() === 'completed'",
        timeout=60_000)
    assert page.inner_text(f"{card} [data-role=steps]") == "4/4"

    assert outside == [], f"the page asked for something outside the server: {outside}"
    assert errors == [], errors
    page.close()


def test_a_loop_sleeping_through_an_agents_usage_limit_says_whose_limit_and_when_it_resumes(
        ws: Workspace, served: Served, browser: Any, cli_home: Path) -> None:
    """The real claude on a subscription whose window is used up (tests/test_usage_limits.py): the card
    says what `status` and Dashboard.md say, "claude limit, resumes HH:MM UTC", and the feed the reset."""
    from tests.agent_clis import task_text
    from tests.test_usage_limits import TASK, configure, env_of, limit_window, start

    cli = start("claude", cli_home)
    try:
        ws.task(task_text(1))
        configure(ws, cli)
        limit_window(cli, 3600)
        loop = ws.spawn("loop", "start", "--task", TASK, "--task-id", "limited", env=ws.env(**env_of(cli)))
        try:
            ws.wait_for(lambda: ws.state("limited")["status"] == "sleeping", timeout=120, what="the loop to sleep")
            note = ws.state("limited")["sleep_note"]
            page = browser.new_page(bypass_csp=True)
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"{served.base}/?token={served.token}")
            card = "article.card[data-task-id='limited']"
            page.wait_for_selector(f"{card} [data-role=sleep]")
            shown = page.inner_text(f"{card} [data-role=sleep]")
            feed = page.inner_text("#feed")
            print("the card says:", shown)
            assert note.startswith("claude limit, resumes ") and shown == f"Sleeping: {note}", (shown, note)
            assert "usage_limit" in feed and "claude: " in feed and "resets " in feed, feed
            # issue #38 items 10 and 16: nothing finished yet is "–", not "0%"; an event's name never runs into
            # its text (guardrail_triggered is wider than the name column)
            assert page.inner_text(f"{card} [data-role=success]") == "–"
            overlaps = page.eval_on_selector_all(f"{card} .events li", """lis => lis.map(li => {
                const e = li.querySelector('.e'), d = li.querySelector('.d').getBoundingClientRect();
                const text = document.createRange();  // where the name's letters end, not its box
                text.selectNodeContents(e);
                return [e.textContent, Math.round(text.getBoundingClientRect().right - d.left)]; })""")
            print("event name vs text (px of overlap):", overlaps)
            assert any(name == "guardrail_triggered" for name, _ in overlaps), overlaps
            assert all(px <= 0 for _, px in overlaps), overlaps
            assert errors == [], errors
            page.close()
            ws.write(".hooks/stop_autonomous_loop_limited.md", "enough\n")
            assert loop.wait(60) == 3, ws.output(loop)
        finally:
            if loop.poll() is None:
                loop.kill()
    finally:
        cli.close()


def test_the_first_page_shows_the_loops_before_any_script_runs_and_a_review_note_opens_on_a_click(
        ws: Workspace, served: Served, browser: Any, tmp_path: Path) -> None:
    """Issue #38 item 16: a headless screenshot of the dashboard showed "Loading…" (the cards were made by the
    page's script only), and the review note a paused loop waits on could not be read there."""
    ws.task(shell_task(3, title="Billing <export>", extra_frontmatter="pause_every: 1"), "Specs/bill/tasks.md")
    r = ws.kiro("loop", "start", "--task", "Specs/bill/tasks.md", "--task-id", "bill")
    assert r.returncode == 6, r.stdout + r.stderr  # paused at its review point
    note = ws.root / "Needs_Action" / "review_bill.md"
    with note.open("a") as f:  # a person's line in the note: shown as text, never as markup
        f.write("\nA person wrote: <img src=x onerror=alert(1)> looks fine\n")

    # (b) no script at all: the server's HTML holds the cards
    still = browser.new_page(viewport={"width": 1280, "height": 800}, java_script_enabled=False)
    still.goto(f"{served.base}/?token={served.token}")
    shot = tmp_path / "first-page.png"
    still.screenshot(path=str(shot))
    card = "article.card[data-task-id='bill']"
    shown = still.inner_text("#loops")
    print("the page before any script ran shows:", shown.replace("\n", " | "), f"({shot.stat().st_size} bytes png)")
    assert still.is_visible(f"{card} .title") and still.inner_text(f"{card} .title") == "Billing <export>"
    assert "Loading" not in shown and still.inner_text(f"{card} [data-role=status]").lower() == "paused"
    still.close()

    # (a) with its script: the card's button shows the note's text
    page = browser.new_page(bypass_csp=True)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{served.base}/?token={served.token}")
    page.wait_for_selector("#live.on")
    page.click(f"{card} button[data-act=note]")
    page.wait_for_selector(f"{card} pre.note.open")
    text = page.inner_text(f"{card} pre.note")
    print("the note on the card:", text[:200].replace("\n", " | "))
    assert text.startswith("Needs_Action/review_bill.md") and note.read_text().strip() in text, text
    assert "<img src=x onerror=alert(1)>" in text and page.query_selector(f"{card} pre.note img") is None
    page.click(f"{card} button[data-act=note]")  # and folds away again
    page.wait_for_selector(f"{card} pre.note.open", state="detached")
    assert errors == [], errors
    page.close()

    # the note's route is behind the server's gate like every other
    import httpx

    assert httpx.get(f"{served.base}/api/loops/bill/note").status_code == 401  # no token
    assert served.get("/api/loops/bill/note", headers={"Host": "evil.example"}).status_code == 403
    assert served.get("/api/loops/bill/note").json()["path"] == "Needs_Action/review_bill.md"
    assert served.get("/api/loops/nobody/note").status_code == 404
    assert served.get("/api/loops/..%2Fx/note").status_code in (400, 404)
