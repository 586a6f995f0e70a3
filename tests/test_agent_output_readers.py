"""The aider, gemini and opencode presets' readers, on output the real CLIs printed (captured from
aider 0.86, Gemini CLI 0.61 and opencode 1.18 against the fakes in tests/fakes): tokens and cost
into `usage`, and each CLI's own failure line and its kind. The end-to-end runs of the real CLIs are
in tests/test_agent_clis_aider_gemini_opencode.py; these are the cases too slow or too rare to provoke there.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kiro.errors import ExecutorError
from kiro.executors.agents import Invocation, get
from kiro.executors.agents.aider import AiderPreset
from kiro.executors.agents.gemini import GeminiPreset
from kiro.executors.agents.opencode import OpencodePreset
from kiro.store.config import Config

PRICES = Config.model_validate({"llm": {"prices": {"gemini-2.5-flash": {"input_per_1m": 2, "output_per_1m": 10},
                                                   "fake-coder": {"input_per_1m": 1, "output_per_1m": 4}}}})

AIDER_OUT = """\
Aider v0.86.2
Model: openai/fake-coder with diff edit format
Git repo: .git with 3 files
Repo-map: using 1024 tokens, auto refresh
Added Specs/feature/tasks.md to the chat.

I will check the step's box.

Specs/feature/tasks.md
```
<<<<<<< SEARCH
- [-] 1. Write part 1
=======
- [x] 1. Write part 1
>>>>>>> REPLACE
```

Tokens: 2.4k sent, 37 received. Cost: $0.0052 message, $0.0052 session.
Applied edit to Specs/feature/tasks.md
"""


def test_aider_tokens_and_cost_lines_are_summed() -> None:
    second = "Tokens: 12k sent, 1.1k cache write, 900 cache hit, 1.5k received. Cost: $0.04 message, $0.0452 session.\n"
    usage = AiderPreset().parse_usage(AIDER_OUT + second)
    assert usage is not None
    assert usage.prompt_tokens == 2400 + 12000 + 1100 + 900
    assert usage.completion_tokens == 37 + 1500
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.api_calls == 2
    assert usage.cost_usd == pytest.approx(0.0052 + 0.04)


def test_aider_without_a_price_is_priced_by_kiros_llm_prices(monkeypatch: pytest.MonkeyPatch) -> None:
    out = "Tokens: 1.0k sent, 500 received.\n"
    monkeypatch.setenv("AIDER_MODEL", "openai/fake-coder")  # no --model on the command line
    usage = AiderPreset(PRICES).parse_usage(out)
    assert usage is not None and usage.total_tokens == 1500
    assert usage.cost_usd == pytest.approx((1000 * 1 + 500 * 4) / 1e6)
    assert AiderPreset().parse_usage("Aider v0.86.2\nnothing else\n") is None


def test_aider_api_errors_printed_with_exit_0_are_failures_of_the_right_kind() -> None:
    auth = ("Added tasks.md to the chat.\n\nlitellm.AuthenticationError: AuthenticationError: OpenAIException - "
            "Incorrect \nAPI key provided: sk-***.\nThe API provider is not able to authenticate you. Check your "
            "API key.\n")
    failure = AiderPreset().classify_failure(0, auth, "Warning: Input is not a terminal (fd=0).\n")
    assert failure is not None and failure.kind == "auth_error" and failure.fatal
    assert failure.line.startswith("litellm.AuthenticationError") and "API key provided" in failure.line
    rate = "litellm.RateLimitError: RateLimitError: OpenAIException - slow down\nRetrying in 0.2 seconds...\n"
    failure = AiderPreset().classify_failure(0, rate, "")
    assert failure is not None and failure.kind == "usage_limit" and not failure.fatal  # after its own retries
    assert AiderPreset().classify_failure(0, AIDER_OUT, "Warning: Input is not a terminal (fd=0).\n") is None
    # a 500 that aider retried, then an answer: not a failure
    retried = ("Added tasks.md to the chat.\n\nlitellm.InternalServerError: InternalServerError: OpenAIException - "
               "boom\nRetrying in 0.2 seconds...\n" + AIDER_OUT.split("Added Specs/feature/tasks.md to the chat.\n")[1])
    assert AiderPreset().classify_failure(0, retried, "") is None


def test_aider_argument_errors_are_usage_errors_with_argparses_line() -> None:
    err = "usage: aider [-h] [--model MODEL]\n             [FILE ...]\naider: error: unrecognized arguments: --bogus\n"
    failure = AiderPreset().classify_failure(2, "", err)
    assert failure is not None and failure.kind == "usage_error"
    assert failure.line == "aider: error: unrecognized arguments: --bogus"


def test_aider_summary_is_what_it_said_not_its_banner() -> None:
    summary = AiderPreset().summary(AIDER_OUT, "", "prompt")
    assert "I will check the step's box." in summary and "Aider v0.86.2" not in summary
    assert "Tokens:" not in summary


def test_aider_is_refused_outside_a_git_repository_unless_told_no_git(tmp_path: Path) -> None:
    inv = Invocation(prompt_file=tmp_path / "p.md", task_file=tmp_path / "Specs/t/tasks.md", step_id="1",
                     project_dir=tmp_path)
    with pytest.raises(ExecutorError, match="git init"):
        AiderPreset().argv(inv)
    argv = AiderPreset(Config.model_validate({"agent_args": ["--no-git"]})).argv(inv)
    assert argv[-1] == "--no-git" and argv[argv.index("--file") + 1] == str(inv.task_file)
    (tmp_path / ".git").mkdir()
    argv = AiderPreset().argv(inv)
    assert "--no-git" not in argv and argv[argv.index("--message-file") + 1] == str(inv.prompt_file)


GEMINI_OUT = "\n".join(json.dumps(e) for e in [
    {"type": "init", "session_id": "s", "model": "gemini-2.5-flash"},
    {"type": "message", "role": "user", "content": "check box 1"},
    {"type": "tool_use", "tool_name": "replace", "tool_id": "r1", "parameters": {}},
    {"type": "tool_result", "tool_id": "r1", "status": "success"},
    {"type": "message", "role": "assistant", "content": "Checked ", "delta": True},
    {"type": "message", "role": "assistant", "content": "the box.", "delta": True},
    {"type": "result", "status": "success", "stats": {
        "total_tokens": 240, "input_tokens": 200, "output_tokens": 40, "cached": 0, "input": 200,
        "duration_ms": 845, "tool_calls": 1, "models": {"gemini-2.5-flash": {
            "total_tokens": 240, "input_tokens": 200, "output_tokens": 40, "cached": 0, "input": 200}}}},
]) + "\n"


def test_gemini_result_stats_become_usage_priced_by_llm_prices() -> None:
    usage = GeminiPreset(PRICES).parse_usage(GEMINI_OUT)
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (200, 40, 240)
    assert usage.api_calls == 2  # the first turn, and the one answering the tool result
    assert usage.cost_usd == pytest.approx((200 * 2 + 40 * 10) / 1e6)
    assert GeminiPreset().parse_usage(GEMINI_OUT).cost_usd == 0  # type: ignore[union-attr]
    assert GeminiPreset().summary(GEMINI_OUT, "", "p") == "Checked the box."


def test_gemini_failures_by_its_result_event_exit_code_and_usage_text() -> None:
    bad_key = json.dumps({"type": "result", "status": "error", "error": {"type": "unknown", "message": (
        '[API Error: {"error":{"code":400,"message":"API key not valid. Please pass a valid API key.",'
        '"status":"INVALID_ARGUMENT"}}]')}, "stats": {"total_tokens": 0}})
    failure = GeminiPreset().classify_failure(1, bad_key, "Error when talking to Gemini API ...\n")
    assert failure is not None and failure.kind == "auth_error" and "API key not valid" in failure.line
    # a base URL but no auth type in settings.json: nothing on stdout, exit 41
    stderr = "YOLO mode is enabled. All tool calls will be automatically approved.\nInvalid auth method selected.\n"
    failure = GeminiPreset().classify_failure(41, "", stderr)
    assert failure is not None and failure.kind == "auth_error" and failure.line == "Invalid auth method selected."
    quota = json.dumps({"type": "result", "status": "error", "error": {"type": "unknown", "message": (
        "[API Error: You exceeded your current quota (RESOURCE_EXHAUSTED)]")}})
    failure = GeminiPreset().classify_failure(1, quota, "")
    assert failure is not None and failure.kind == "rate_limit"
    usage = "Usage: gemini [options] [command]\n\nOptions:\n  -m, --model  Model\n\nUnknown arguments: bogus, b\n"
    failure = GeminiPreset().classify_failure(1, "", usage)
    assert failure is not None and failure.kind == "usage_error" and failure.line == "Unknown arguments: bogus, b"
    assert GeminiPreset().classify_failure(0, GEMINI_OUT, "YOLO mode is enabled.\n") is None
    warning = json.dumps({"type": "error", "severity": "warning", "message": "Loop detection is off"}) + "\n"
    assert GeminiPreset().classify_failure(0, warning + GEMINI_OUT, "") is None
    assert GeminiPreset().summary(warning + GEMINI_OUT, "", "p") == "Checked the box."


def _oc(kind: str, **part: object) -> str:
    return json.dumps({"type": kind, "timestamp": 1, "sessionID": "ses", "part": part})


OPENCODE_OUT = "\n".join([
    _oc("step_start", type="step-start"),
    _oc("tool_use", type="tool", tool="edit", state={"status": "completed"}),
    _oc("step_finish", type="step-finish", reason="tool-calls", cost=0.0004,
        tokens={"total": 120, "input": 100, "output": 20, "reasoning": 0, "cache": {"write": 0, "read": 0}}),
    _oc("text", type="text", text="Checked the box."),
    _oc("step_finish", type="step-finish", reason="stop", cost=0.0004,
        tokens={"total": 180, "input": 100, "output": 20, "reasoning": 10, "cache": {"write": 0, "read": 50}}),
]) + "\n"


def test_opencode_step_finish_tokens_and_cost_are_summed() -> None:
    usage = OpencodePreset().parse_usage(OPENCODE_OUT)
    assert usage is not None
    assert usage.prompt_tokens == 100 + 150 and usage.completion_tokens == 20 + 30
    assert usage.total_tokens == 300 and usage.api_calls == 2
    assert usage.cost_usd == pytest.approx(0.0008)
    assert OpencodePreset().summary(OPENCODE_OUT, "", "p") == "Checked the box."


def test_opencode_failures_from_its_error_event_and_its_bare_usage_text() -> None:
    err = json.dumps({"type": "error", "timestamp": 1, "sessionID": "s", "error": {"name": "APIError", "data": {
        "message": "Incorrect API key provided: sk-***.", "statusCode": 401, "isRetryable": False}}})
    failure = OpencodePreset().classify_failure(1, err, "")
    assert failure is not None and failure.kind == "auth_error"
    assert failure.line == "APIError: Incorrect API key provided: sk-***. (HTTP 401)"
    busy = json.dumps({"type": "error", "timestamp": 1, "sessionID": "s", "error": {"name": "APIError", "data": {
        "message": "Rate limit reached for requests", "statusCode": 429, "isRetryable": True}}})
    failure = OpencodePreset().classify_failure(1, busy, "")
    assert failure is not None and failure.kind == "rate_limit" and not failure.fatal
    usage_text = "opencode run [message..]\n\nrun opencode with a message\n\nPositionals:\n  message\n"
    failure = OpencodePreset().classify_failure(1, "", usage_text)
    assert failure is not None and failure.kind == "usage_error" and "opencode run [message..]" in failure.line
    assert OpencodePreset().classify_failure(0, OPENCODE_OUT, "") is None
    # an error it got past (a later model step finished): not a failure
    assert OpencodePreset().classify_failure(0, busy + "\n" + OPENCODE_OUT, "") is None
    assert OpencodePreset().summary(busy + "\n" + OPENCODE_OUT, "", "p") == "Checked the box."


@pytest.mark.parametrize("name", ["aider", "gemini", "opencode"])
def test_each_preset_has_an_idle_timeout_and_an_install_line(name: str) -> None:
    preset = get(name)
    assert preset.idle_timeout_seconds and preset.install and preset.program == name
    assert preset.command_line().startswith(f"{name} ")
