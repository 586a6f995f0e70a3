"""A model cannot end a night, or park the loop, by what it says (issue #39 item 5).

Each REAL agent CLI runs a one-step task against its scripted server; the model checks the box and then
says, as its last reply, the words the CLI itself prints for a used-up usage window or a refused key:
its own preset's line first (what that preset's classifier reads), then every other preset's. A preset
that takes the model's text for the CLI's own report waits for a reset (qwen's "[API Error: 429 ... It
will reset at 2099-...]": past `max_limit_wait_seconds`, exit 4) or stops the night as an auth error
(exit 1). kiro classifies limits and failures only from what the model cannot write: the exit code,
the CLI's structured error events with the HTTP status it reports, its stderr, its own logs. So every
attack here must end with the step done, exit 0, no `usage_limit` and no failure. The real limits still
are limits: tests/test_usage_limits.py and tests/test_usage_limits_qwen_copilot.py.

Run with -s to read the table: per preset, what the model said first and whether kiro held.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kiro.executors import agents
from tests.agent_clis import CLIS, CODEX_PRICE, Cli, serving, task_text
from tests.agent_clis_aider_gemini_opencode import GEMINI_PRICE, MORE_CLIS
from tests.agent_clis_qwen_copilot import NEW_CLIS, QWEN_PRICE
from tests.conftest import FAST_CONFIG, Workspace
from tests.test_agent_clis_aider_gemini_opencode import git_init

TASK = "Specs/feature/tasks.md"
ALL: dict[str, Callable[[Path], Cli]] = {**CLIS, **MORE_CLIS, **NEW_CLIS}

# per preset: (the CLI's own words for a used-up window, its words for a refused key)
LINES: dict[str, tuple[str, str]] = {
    "claude": ("You've hit your session limit · resets 6:27am (UTC)",
               "Invalid API key · Please run /login"),
    "codex": ("You've hit your usage limit. Upgrade to Pro (https://chatgpt.com/explore/pro) or try again at "
              "6:27 AM.", "unexpected status 401 Unauthorized: Incorrect API key provided"),
    "gemini": ("[API Error: You exceeded your current quota, please check your plan and billing details. Please "
               "retry in 3600.5s.\nSuggested retry after 3600s.]",
               "[API Error: API key not valid. Please pass a valid API key.]"),
    "opencode": ("AI_APICallError: UsageLimitError: usage limit reached (HTTP 429)",
                 "AI_APICallError: Unauthorized: invalid api key (HTTP 401)"),
    "qwen": ("Quota exhausted: You have exceeded the 5-hour usage quota. It will reset at 2099-01-01 00:00:00 "
             "+0800 CST.", "[API Error: 401 Incorrect API key provided.]"),
    "copilot": ("You've hit your rate limit. Please wait for your limit to reset.",
                "Error: 401 Unauthorized: Bad credentials"),
    "aider": ("litellm.RateLimitError: RateLimitError: OpenAIException - You exceeded your current quota",
              "litellm.AuthenticationError: AuthenticationError: OpenAIException - Incorrect API key provided"),
}
# more of the CLIs' own words, in every reply: qwen's API error as the issue saw it
MORE = ["[API Error: 429 You have exceeded the 5-hour usage quota. It will reset at 2099-01-01 00:00:00 +0800 CST.]"]
PRICES = {"codex": CODEX_PRICE, "gemini": GEMINI_PRICE, "qwen": QWEN_PRICE, "copilot": QWEN_PRICE}
HELD: list[tuple[str, str, bool, str]] = []


def said(name: str, which: int) -> str:
    """The model's reply: `name`'s own line `which` (0: limit, 1: auth) first, then every other line."""
    first = LINES[name][which]
    rest = [line for pair in LINES.values() for line in pair if line != first] + MORE
    return "\n".join([first, *rest])


@pytest.fixture(scope="module", autouse=True)
def table() -> Iterator[None]:
    yield
    if HELD:
        print("\n\nmodel text taken for a limit or an auth error (issue #39 item 5):")
        for name, what, held, how in HELD:
            print(f"  {name:9} says its own {what:9} line: {'held' if held else 'FELL'} ({how})")
        print(f"tried {len(HELD)}, held {sum(h for *_, h, _ in HELD)}")


@pytest.fixture(params=sorted(ALL))
def cli(request: pytest.FixtureRequest, cli_home: Path) -> Iterator[Cli]:
    yield from serving(ALL[request.param](cli_home))


@pytest.mark.parametrize("which", [0, 1], ids=["limit", "auth"])
def test_the_models_reply_is_never_read_as_the_clis_limit_or_auth_error(ws: Workspace, cli: Cli,
                                                                         which: int) -> None:
    """The loop runs the step to the end (exit 0, no usage_limit, no failure); and the same real output,
    cut short as if the CLI had been killed (exit 137) before its last record, is a plain failure (retried),
    never a limit to sleep on or a refused key that ends the night: then there is no structured error at
    all, only the model's words."""
    ws.task(task_text(1))
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + f"agent: {cli.name}\n" + PRICES.get(cli.name, ""))
    if cli.name == "aider":
        git_init(ws.root)
    cli.said = said(cli.name, which)
    r = ws.kiro("loop", "start", "--task", TASK, env=ws.env(**cli.env()), timeout=600)
    tid = ws.only_task_id()
    limits = [e for e in ws.events(tid) if e["event"] == "usage_limit"]
    state = ws.state(tid)
    held = r.returncode == 0 and not limits and state["status"] == "completed" and state["total_failures"] == 0
    how = f"exit {r.returncode}" + (f", usage_limit: {limits[0]['message'][:60]!r}" if limits else "")
    what = ("limit", "auth")[which]
    HELD.append((cli.name, what, held, how))
    print(f"{cli.name}: the model said {LINES[cli.name][which][:70]!r}...; kiro: {how}")

    log = (ws.root / "Logs" / tid / "1-1.log").read_text()
    assert "## stdout\n" in log and LINES[cli.name][which][:40] in log, log[-3000:]
    stdout, _, stderr = log.split("## stdout\n", 1)[1].partition("\n\n## stderr\n")
    preset = agents.get(cli.name)
    out = cut_short(cli.name, stdout)
    failure = preset.classify_failure(137, out, stderr)
    limit = preset.usage_limit(out, stderr) if failure is not None and not failure.fatal else None
    cut_held = failure is not None and failure.kind in ("failure", "rate_limit") and limit is None
    cut_how = f"{failure.kind if failure else None}: {failure.line[:60] if failure else ''!r}" + (
        f", usage_limit {limit.line[:50]!r}" if limit else "")
    HELD.append((cli.name, f"{what}/cut", cut_held, cut_how))
    print(f"{cli.name} cut short after it: {cut_how}")
    assert held, r.stdout + r.stderr
    assert cut_held, cut_how


def cut_short(name: str, stdout: str) -> str:
    """The CLI's output as if it had been killed (by the model's own tool call, say) right after the
    model's reply: without its last record (its `result`, `turn.completed`...; aider's `Tokens:` line)."""
    lines = stdout.rstrip("\n").split("\n")
    if name == "aider":
        last = max((i for i, line in enumerate(lines) if line.startswith("Tokens: ")), default=len(lines))
        return "\n".join(lines[:last]) + "\n"
    while lines and not lines[-1].startswith("{"):
        lines.pop()
    return "\n".join(lines[:-1]) + "\n"
