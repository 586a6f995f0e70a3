"""The billing source in plain sight (issue #29 item 3), with the REAL Claude Code and Codex CLIs on the
scripted servers of tests/fakes: the server sees which credential arrived (Claude's `x-api-key` or
`Authorization: Bearer`, Codex's bearer token), and kiro's start line, attempt log and `kiro agents`
say the same, naming variables and never showing a key.

Claude Code in `-p` mode bills ANTHROPIC_API_KEY before a logged-in subscription; Codex bills
CODEX_API_KEY before a ChatGPT login. kiro's default: a CLI that has a login does not get those
variables (said at start); `agent_env: {pass: [NAME]}` lets one through; with no login the key is
used (said at start).
"""

from __future__ import annotations

import base64
import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.agent_clis import CODEX_PRICE, PROMPT_RE, Claude, Codex, kiro_agents, listed_agents, serving, task_text
from tests.conftest import AGENTS_CACHE, FAST_CONFIG, Workspace, new_cli_home, new_workspace
from tests.fakes import Recorded
from tests.fakes import responses as fr

TASK = "Specs/feature/tasks.md"
API_KEY = "sk-ant-api03-kiro-billing-test-KEY"
LOGIN_TOKEN = "sk-ant-oat01-kiro-billing-test-LOGIN"


@pytest.fixture
def claude(cli_home: Path) -> Iterator[Claude]:
    yield from serving(Claude(cli_home))


def log_in(home: Path) -> None:
    """What `claude /login` leaves: a subscription's OAuth tokens in ~/.claude/.credentials.json."""
    creds = home / ".claude" / ".credentials.json"
    creds.parent.mkdir(parents=True, exist_ok=True)
    creds.write_text(json.dumps({"claudeAiOauth": {
        "accessToken": LOGIN_TOKEN, "refreshToken": "sk-ant-ort01-refresh",
        "expiresAt": int(time.time() * 1000) + 86_400_000, "scopes": ["user:inference", "user:profile"],
        "subscriptionType": "max"}}))


def run_claude(ws: Workspace, cli: Claude, extra: str = "", **env: str) -> tuple[int, str]:
    ws.task(task_text(1))
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "agent: claude\n" + extra)
    variables = {**cli.env(), **env}
    r = ws.kiro("loop", "start", "--task", TASK, env=ws.env(**variables, KIRO_RAISE_ERRORS="1"), timeout=240)
    return r.returncode, r.stdout + r.stderr


def credentials_seen(requests: list[Recorded]) -> set[str]:
    seen = set()
    for rec in requests:
        headers = {k.lower(): v for k, v in rec.headers.items()}
        if "x-api-key" in headers:
            seen.add(f"x-api-key {headers['x-api-key']}")
        if "authorization" in headers:
            seen.add(headers["authorization"])
    return seen


def everything_written(ws: Workspace) -> str:
    return "\n".join(p.read_text(errors="replace") for p in (ws.root / "Logs").rglob("*") if p.is_file()) + \
        "\n".join(p.read_text(errors="replace") for p in (ws.root / ".state").rglob("*.json") if p.is_file())


@dataclass
class LoginStart:
    """A two-step loop started with claude logged in and ANTHROPIC_API_KEY set, stopped after its first
    step (`--max-iterations 1`), and what it billed, said and wrote by then."""

    ws: Workspace
    claude: Claude
    env: dict[str, str]
    tid: str
    code: int
    out: str
    completed: list[str]  # the steps done
    billed: set[str]
    written: str


@pytest.fixture(scope="module")
def login_start(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoginStart]:
    """One claude run read by two tests: how a login and a key are billed, and (resumed) that a loop keeps
    the billing it started with."""
    home = new_cli_home()
    try:
        claude = Claude(home)
        if not claude.installed:
            pytest.skip(claude.skip_reason())
        claude.start()
        try:
            ws = new_workspace(tmp_path_factory.mktemp("billing") / "vault")
            log_in(Path(claude.env()["HOME"]))
            ws.task(task_text(2))
            ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "agent: claude\n")
            env = ws.env(**{**claude.env(), "ANTHROPIC_API_KEY": API_KEY}, KIRO_RAISE_ERRORS="1")
            r = ws.kiro("loop", "start", "--task", TASK, "--max-iterations", "1", env=env, timeout=240)
            assert claude.server is not None
            tid = ws.only_task_id()
            yield LoginStart(ws, claude, env, tid, r.returncode, r.stdout + r.stderr,
                             [c["step_id"] for c in ws.state(tid)["completed_steps"]],
                             credentials_seen(claude.server.requests), everything_written(ws))
        finally:
            claude.close()
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_claude_with_a_login_and_an_api_key_uses_the_login_and_says_so(login_start: LoginStart) -> None:
    run, out = login_start, login_start.out
    assert run.code == 4, out  # --max-iterations 1
    assert run.completed == ["1"], out
    assert run.billed == {f"Bearer {LOGIN_TOKEN}"}  # the key never went out
    assert "claude uses its login (~/.claude/.credentials.json); kiro keeps ANTHROPIC_API_KEY from it" in out, out
    assert "agent_env: {pass: [ANTHROPIC_API_KEY]}" in out
    assert "# credential: claude uses its login" in run.written
    assert API_KEY not in out and API_KEY not in run.written


def test_agent_env_pass_bills_the_key_and_says_so(ws: Workspace, claude: Claude) -> None:
    log_in(Path(claude.env()["HOME"]))
    code, out = run_claude(ws, claude, "agent_env:\n  pass: [ANTHROPIC_API_KEY]\n", ANTHROPIC_API_KEY=API_KEY)
    assert code == 0, out
    assert claude.server is not None
    assert credentials_seen(claude.server.requests) == {f"x-api-key {API_KEY}"}
    assert "claude bills the API key in ANTHROPIC_API_KEY" in out, out
    assert API_KEY not in out and API_KEY not in everything_written(ws)


def test_with_only_an_api_key_claude_bills_it_and_says_so(ws: Workspace, claude: Claude) -> None:
    code, out = run_claude(ws, claude, ANTHROPIC_API_KEY=API_KEY)
    assert code == 0, out
    assert claude.server is not None
    assert credentials_seen(claude.server.requests) == {f"x-api-key {API_KEY}"}
    assert "claude bills the API key in ANTHROPIC_API_KEY" in out and "keeps" not in out, out


def test_agent_env_drop_in_task_frontmatter_keeps_a_variable_from_the_cli(ws: Workspace, claude: Claude) -> None:
    """`drop` from the task's frontmatter: with no login left, claude has no credential and says so."""
    ws.task(task_text(1).replace("title: Greeting\n", "title: Greeting\nagent_env:\n  drop: [ANTHROPIC_API_KEY]\n"))
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "agent: claude\n")
    env = ws.env(**{**claude.env(), "ANTHROPIC_API_KEY": API_KEY}, KIRO_RAISE_ERRORS="1")
    r = ws.kiro("loop", "start", "--task", TASK, env=env, timeout=240)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "claude has no credential kiro can see (set ANTHROPIC_API_KEY or log it in)" in out, out
    assert "not passed to it (agent_env.drop): ANTHROPIC_API_KEY" in out, out
    assert claude.server is not None
    assert not credentials_seen(claude.server.requests)  # nothing was billed
    assert API_KEY not in out


def test_kiro_agents_names_the_credential_and_never_shows_it(ws: Workspace, claude: Claude) -> None:
    log_in(Path(claude.env()["HOME"]))
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "agent: claude\n")
    env = ws.env(**{**claude.env(), "ANTHROPIC_API_KEY": API_KEY, **AGENTS_CACHE})
    rows, err = listed_agents(ws, env)
    row = rows["claude"]
    assert row["credential"] == "login" and row["kept_from_agent"] == ["ANTHROPIC_API_KEY"], row
    text = kiro_agents(ws, env, "claude")
    assert "credential: claude uses its login (~/.claude/.credentials.json)" in text.stdout, text.stdout
    listed = json.dumps(list(rows.values()))
    assert API_KEY not in listed + err + text.stdout + text.stderr and LOGIN_TOKEN not in listed + text.stdout


# -- codex: a ChatGPT login in $CODEX_HOME/auth.json, and CODEX_API_KEY ---------------------------------


def chatgpt_login(home: Path) -> str:
    """What `codex login` leaves for a ChatGPT account: its tokens in auth.json (a JWT codex reads)."""
    def part(data: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")

    claims = {"email": "person@example.com", "exp": 4102444800,
              "https://api.openai.com/auth": {"chatgpt_plan_type": "pro", "chatgpt_account_id": "acct-1"}}
    token = f"{part({'alg': 'none'})}.{part(claims)}.signature"
    (home / "auth.json").write_text(json.dumps({"OPENAI_API_KEY": None, "last_refresh": "2026-11-27T00:00:00Z",
                                                "tokens": {"id_token": token, "access_token": token,
                                                           "refresh_token": "rt", "account_id": "acct-1"}}))
    return token


@pytest.fixture
def codex(cli_home: Path) -> Iterator[Codex]:
    cli = Codex(cli_home)
    if not cli.installed:
        pytest.skip(cli.skip_reason())
    server = cli.start()
    answer = cli.brain

    def brain(rec: Recorded) -> fr.Reply | Any:  # a call that is not the step's turn gets a plain answer
        return answer(rec) if PROMPT_RE.search(fr.user_text(rec.body)) else fr.Reply([fr.message("ok")])

    assert isinstance(server, fr.FakeResponses)
    server.brain = brain
    home = cli.codex_home  # the built-in openai provider, its endpoints moved to the fake
    (home / "config.toml").write_text(f'model = "{fr.MODEL}"\nopenai_base_url = "{server.url}/v1"\n'
                                      f'chatgpt_base_url = "{server.url}/backend-api/"\n')
    yield cli
    cli.close()


@pytest.mark.parametrize("passed", [False, True], ids=["default", "agent_env-pass"])
def test_codex_with_a_chatgpt_login_and_codex_api_key(ws: Workspace, codex: Codex, passed: bool) -> None:
    home = Path(codex.env()["CODEX_HOME"])
    token = chatgpt_login(home)
    ws.task(task_text(1))
    # with a ChatGPT login codex sends its requests zstd-compressed, which the fake does not read: the step
    # counts by exit code, and what is asserted is the credential each request carried
    extra = "command_success: exit_code\n" + ("agent_env:\n  pass: [CODEX_API_KEY]\n" if passed else "")
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "agent: codex\n" + CODEX_PRICE + extra)
    env = ws.env(**{**codex.env(), "CODEX_API_KEY": "sk-codex-billing-test-KEY"}, KIRO_RAISE_ERRORS="1")
    env.pop("OPENAI_API_KEY", None)
    r = ws.kiro("loop", "start", "--task", TASK, env=env, timeout=240)
    out = r.stdout + r.stderr
    assert codex.server is not None
    assert r.returncode == 0, out
    seen = credentials_seen(codex.server.requests)
    if passed:
        assert seen == {"Bearer sk-codex-billing-test-KEY"}, seen
        assert "codex bills the API key in CODEX_API_KEY" in out, out
    else:
        assert seen == {f"Bearer {token}"}, seen
        assert "codex uses its login (ChatGPT login in " in out and "kiro keeps CODEX_API_KEY from it" in out, out
    assert "sk-codex-billing-test-KEY" not in out


def test_a_loop_keeps_the_billing_it_started_with_whoever_resumes_it(login_start: LoginStart) -> None:
    """Issue #38 item 3: a loop started on claude's login, resumed where claude would bill the API key instead
    (a `kiro serve` started in another shell, with no login in its HOME): refused, saying why, from the CLI
    and from the server alike; the dashboard's row names the billing; resumed where the login is, it goes on
    on the login."""
    from tests.serve_helpers import start_server

    ws, claude, env, tid = login_start.ws, login_start.claude, login_start.env, login_start.tid
    home = Path(claude.env()["HOME"])
    assert login_start.code == 4, login_start.out
    login = "claude uses its login (~/.claude/.credentials.json)"
    assert claude.server is not None
    billed = login_start.billed
    assert billed == {f"Bearer {LOGIN_TOKEN}"}, billed

    creds = home / ".claude" / ".credentials.json"
    saved = creds.read_text()
    creds.unlink()  # here claude has no login: it would bill ANTHROPIC_API_KEY
    r = ws.kiro("loop", "resume", "--task-id", tid, "--max-iterations", "10", env=env, timeout=240)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert f"started as `{login}`, and resumed here it would run as `claude bills the API key in " \
           f"ANTHROPIC_API_KEY`" in out, out
    assert credentials_seen(claude.server.requests) == billed  # the refused resume billed nothing
    assert ws.state(tid)["billing"] == login
    served = start_server(ws, extra_env={k: v for k, v in env.items() if k in claude.env()})
    try:
        answer = served.post(f"/api/loops/{tid}/resume")
        assert answer.status_code == 409 and f"started as `{login}`" in answer.json()["error"], answer.text
        row = {r["task_id"]: r for r in served.get("/api/loops").json()}[tid]
        assert row["billing"] == login, row
    finally:
        served.stop()
    assert credentials_seen(claude.server.requests) == billed  # nothing was billed by the refused resumes

    creds.write_text(saved)
    r = ws.kiro("loop", "resume", "--task-id", tid, "--max-iterations", "10", env=env, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert credentials_seen(claude.server.requests) == {f"Bearer {LOGIN_TOKEN}"}
