"""kiro.records: the state's and the config's typed records, without pydantic (issue #12).

The messages below are the ones kiro printed while the config was a set of pydantic models: each was
captured from that code (8f04b2d's kiro/config.py, pydantic 2) and is kept here as it was, so that a
person who mistypes a key reads the same line as before. The state's records keep what they do not
know, refuse what pydantic refused, and write what it wrote.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kiro.config import Config, _validation_error
from kiro.records import FieldError
from kiro.state import CompletedStep, LoopState, Transition

# (a merged config, the one line kiro says of it), as the pydantic models said it
REFUSED: list[tuple[dict[Any, Any], str]] = [
    ({'autonomous_loop': {'max_iterations': 'lots'}},
     "autonomous_loop.max_iterations: Input should be a valid integer (got 'lots')"),
    ({'autonomous_loop': {'max_iterations': 0}},
     "autonomous_loop.max_iterations: Input should be greater than or equal to 1 (got 0)"),
    ({'autonomous_loop': {'max_iterations': 5.5}},
     "autonomous_loop.max_iterations: Input should be a valid integer, got a number with a "
     "fractional part (got 5.5)"),
    ({'autonomous_loop': {'max_iterations': None}},
     "autonomous_loop.max_iterations: Input should be a valid integer (got None)"),
    ({'autonomous_loop': {'max_iterations': [1]}},
     "autonomous_loop.max_iterations: Input should be a valid integer (got [1])"),
    ({'autonomous_loop': {'timeout_seconds': 0}},
     "autonomous_loop.timeout_seconds: Input should be greater than 0 (got 0)"),
    ({'autonomous_loop': {'timeout_seconds': 'x'}},
     "autonomous_loop.timeout_seconds: Input should be a valid number (got 'x')"),
    ({'autonomous_loop': {'timeout_seconds': float("nan")}},
     "autonomous_loop.timeout_seconds: Input should be a finite number (got nan)"),
    ({'autonomous_loop': {'timeout_seconds': float("inf")}},
     "autonomous_loop.timeout_seconds: Input should be a finite number (got inf)"),
    ({'autonomous_loop': {'timeout_seconds': -1.5}},
     "autonomous_loop.timeout_seconds: Input should be greater than 0 (got -1.5)"),
    ({'autonomous_loop': {'save_state_every_iteration': False}},
     "autonomous_loop.save_state_every_iteration: false is not supported: kiro saves the state at "
     "every step boundary, which its crash safety depends on; set it to true or remove the key (got "
     "False)"),
    ({'autonomous_loop': {'check_done_folder': 2}},
     "autonomous_loop.check_done_folder: Input should be a valid boolean (got 2)"),
    ({'autonomous_loop': {'check_done_folder': 'maybe'}},
     "autonomous_loop.check_done_folder: Input should be a valid boolean (got 'maybe')"),
    ({'autonomous_loop': {'max_iteration': 5}},
     "unknown key 'autonomous_loop.max_iteration' (did you mean 'max_iterations'?)"),
    ({'autonomous_loop': {'max_iterations': 0, 'failure_threshold': 0}, 'executor': 'x'},
     "autonomous_loop.max_iterations: Input should be greater than or equal to 1 (got 0) (and 2 "
     "more: autonomous_loop.failure_threshold, executor)"),
    ({'autonomous_loop': 5},
     "autonomous_loop: should be a mapping of keys (got 5)"),
    ({'autonomous_loop': 'x'},
     "autonomous_loop: should be a mapping of keys (got 'x')"),
    ({'autonomous_loop': [1]},
     "autonomous_loop: should be a mapping of keys (got [1])"),
    ({'resource_limits': {'max_cpu_percent': 0}},
     "resource_limits.max_cpu_percent: Input should be greater than 0 (got 0)"),
    ({'resource_limits': {'zzz': 1}},
     "unknown key 'resource_limits.zzz' (valid keys here: max_memory_mb, max_cpu_percent, "
     "max_disk_writes_per_minute, max_api_calls_per_minute)"),
    ({'llm': {'model': 4}},
     "llm.model: Input should be a valid string (got 4)"),
    ({'llm': {'model': None}},
     "llm.model: Input should be a valid string (got None)"),
    ({'llm': {'wrap_up_threshold': 1.5}},
     "llm.wrap_up_threshold: Input should be less than or equal to 1 (got 1.5)"),
    ({'llm': {'wrap_up_threshold': 0}},
     "llm.wrap_up_threshold: Input should be greater than 0 (got 0)"),
    ({'llm': {'precheck': 'never'}},
     "llm.precheck: Input should be 'scheduled_runs' or 'every_iteration' (got 'never')"),
    ({'llm': {'prices': {'gpt': {'input_per_1m': 1}}}},
     "llm.prices.gpt.output_per_1m: required key missing"),
    ({'llm': {'prices': {'gpt': {'input_per_1m': 1, 'output_per_1m': -1}}}},
     "llm.prices.gpt.output_per_1m: Input should be greater than or equal to 0 (got -1)"),
    ({'llm': {'prices': {'gpt': 5}}},
     "llm.prices.gpt: should be a mapping of keys (got 5)"),
    ({'llm': {'prices': [1]}},
     "llm.prices: should be a mapping of keys (got [1])"),
    ({'llm': {'modle': 'x'}},
     "unknown key 'llm.modle' (did you mean 'model'?)"),
    ({'llm': {'base_url': 5}},
     "llm.base_url: Input should be a valid string (got 5)"),
    ({'tools': {'shell': {'enabled': True, 'allow': ['git status', 'python']}}},
     "tools.shell.allow: 'python': python is an interpreter: runs code from its arguments or from "
     "files the agent writes; remove it, or set tools.shell.trust_agent_code: true to accept that "
     "the agent runs code of its own (got ['git status', 'python'])"),
    ({'tools': {'shell': {'allow': 'git'}}},
     "tools.shell.allow: Input should be a valid list (got 'git')"),
    ({'tools': {'shell': {'allow': [1, 'ls']}}},
     "tools.shell.allow.0: Input should be a valid string (got 1)"),
    ({'tools': {'shell': {'allow': None}}},
     "tools.shell.allow: Input should be a valid list (got None)"),
    ({'tools': {'shell': {'max_output_chars': 5}}},
     "tools.shell.max_output_chars: Input should be greater than or equal to 100 (got 5)"),
    ({'tools': {'shell': {'allow': ['python'], 'trust_agent_code': 'x'}}},
     "tools.shell.trust_agent_code: Input should be a valid boolean (got 'x') (and 1 more: "
     "tools.shell.allow)"),
    ({'guardrails': {'active_hours': {'start': '9', 'end': '17:30'}}},
     "guardrails.active_hours.start: should be a 24-hour time like \"09:00\" (got '9')"),
    ({'guardrails': {'active_hours': {'start': '09:00'}}},
     "guardrails.active_hours.end: required key missing"),
    ({'guardrails': {'active_hours': 'x'}},
     "guardrails.active_hours: should be a mapping of keys (got 'x')"),
    ({'guardrails': {'loop_detection_repeats': 1}},
     "guardrails.loop_detection_repeats: Input should be greater than or equal to 2 (got 1)"),
    ({'guardrails': {'max_cost_usd': 0}},
     "guardrails.max_cost_usd: Input should be greater than 0 (got 0)"),
    ({'guardrails': {'active_hours': {'start': 900, 'end': '10:00'}}},
     "guardrails.active_hours.start: Input should be a valid string (got 900)"),
    ({'executor': 'bogus'},
     "executor: Input should be 'openai', 'command' or 'shell' (got 'bogus')"),
    ({'agent': 'gpt'},
     "agent: Input should be 'claude', 'codex', 'aider', 'gemini' or 'opencode' (got 'gpt')"),
    ({'agent_args': ['a', 1]},
     "agent_args.1: Input should be a valid string (got 1)"),
    ({'agent_args': 'x'},
     "agent_args: Input should be a valid list (got 'x')"),
    ({'command_success': 'x'},
     "command_success: Input should be 'checkbox' or 'exit_code' (got 'x')"),
    ({'step_timeout_seconds': 0},
     "step_timeout_seconds: Input should be greater than 0 (got 0)"),
    ({'project_dir': 5},
     "project_dir: Input should be a valid string (got 5)"),
    ({'max_parallel_loops': 0},
     "max_parallel_loops: Input should be greater than or equal to 1 (got 0)"),
    ({'on_event': {'done': 'x'}},
     "on_event: unknown event 'done': use one of completed, failed, paused, limit, finished (a "
     "loop's every event is in Logs/<task_id>.jsonl; `kiro loop logs --follow --json` streams them) "
     "(got {'done': 'x'})"),
    ({'on_event': {'completed': 5}},
     "on_event.completed: Input should be a valid string (got 5)"),
    ({'on_event': 'x'},
     "on_event: should be a mapping of keys (got 'x')"),
    ({'secret_env': 'A'},
     "secret_env: Input should be a valid list (got 'A')"),
    ({'checkpoints': 'maybe'},
     "checkpoints: Input should be 'git' or 'off' (got 'maybe')"),
    ({'isolation': 'x'},
     "isolation: Input should be 'none' or 'worktree' (got 'x')"),
    ({'backend': 'x'},
     "backend: Input tag 'x' found using 'kind' does not match any of the expected tags: 'local', "
     "'temporal' (got {'kind': 'x'})"),
    ({'backend': {'kind': 'temporal', 'adress': 'x'}},
     "unknown key 'backend.adress'"),
    ({'backend': {'kind': 'local', 'address': 'x'}},
     "unknown key 'backend.address'"),
    ({'backend': {}},
     "backend: Unable to extract tag using discriminator 'kind' (got {})"),
    ({'backend': 5},
     "backend: should be a mapping of keys (got 5)"),
    ({'backend': None},
     "backend: should be a mapping of keys (got None)"),
    ({'backend': {'kind': 'temporal', 'heartbeat_seconds': 100}},
     "backend.heartbeat_seconds: Input should be less than or equal to 60 (got 100)"),
    ({'backend': 'temporal', 'checkpoints': 'off'},
     "backend: the temporal backend needs git checkpoints (each step's work travels as a commit on "
     "branch kiro/<task_id>); remove checkpoints: off, or use backend: local (got 'temporal')"),
    ({'backend': 'temporal', 'merge': 'auto'},
     "backend: the temporal backend leaves branch kiro/<task_id> for review; merge: auto is not "
     "built on it (docs/scale-out.md §12); use merge: manual or backend: local (got 'temporal')"),
    ({'backend': {'kind': 5}},
     "backend: Input tag '5' found using 'kind' does not match any of the expected tags: 'local', "
     "'temporal' (got {'kind': 5})"),
    ({'nope': {'x': 1}},
     "unknown key 'nope' (valid keys here: autonomous_loop, resource_limits, executor, "
     "executor_command, agent, agent_args, command_success, step_timeout_seconds, "
     "step_idle_timeout_seconds, project_dir, verify, llm, tools, guardrails, approval, "
     "max_parallel_loops, ...)"),
    ({'zzz': 1, 'yyy': 2},
     "unknown key 'zzz' (valid keys here: autonomous_loop, resource_limits, executor, "
     "executor_command, agent, agent_args, command_success, step_timeout_seconds, "
     "step_idle_timeout_seconds, project_dir, verify, llm, tools, guardrails, approval, "
     "max_parallel_loops, ...) (and 1 more: yyy)"),
    ({'verify': ['a']},
     "verify: Input should be a valid string (got ['a'])"),
    ({5: 1},
     "5: Keys should be strings (got 5)"),
    ({'llm': {'prices': {'gpt': {'input_per_1m': '1', 'output_per_1m': 'x'}}}},
     "llm.prices.gpt.output_per_1m: Input should be a valid number (got 'x')"),
    ({'resource_limits': {'max_api_calls_per_minute': 0.5}},
     "resource_limits.max_api_calls_per_minute: Input should be a valid integer, got a number with a "
     "fractional part (got 0.5)"),
    ({'autonomous_loop': {'timeout_seconds': 'inf'}},
     "autonomous_loop.timeout_seconds: Input should be a finite number (got 'inf')"),
]


@pytest.mark.parametrize(("data", "message"), REFUSED, ids=[str(i) for i in range(len(REFUSED))])
def test_a_config_kiro_refuses_is_described_as_pydantic_described_it(data: dict[Any, Any], message: str) -> None:
    with pytest.raises(FieldError) as caught:
        Config.model_validate(data)
    assert str(_validation_error(caught.value, {})) == message


def test_what_pydantic_took_leniently_is_taken_the_same_way() -> None:
    cfg = Config.model_validate({
        "autonomous_loop": {"max_iterations": " 7 ", "failure_threshold": 5.0, "timeout_seconds": "1e3",
                            "check_done_folder": "off", "check_stop_hook": 1.0, "max_step_retries": "1_0"},
        "llm": {"api_key_env": b"KEY", "prices": None}, "tools": {"shell": None},
        "checkpoints": False, "backend": "local", "include_optional": "yes", "on_event": None,
    })
    loop = cfg.autonomous_loop
    assert (loop.max_iterations, loop.failure_threshold, loop.timeout_seconds) == (7, 5, 1000.0)
    assert (loop.check_done_folder, loop.check_stop_hook, loop.max_step_retries) == (False, True, 10)
    assert cfg.llm.api_key_env == "KEY" and cfg.llm.prices == {} and cfg.tools.shell.enabled is False
    assert cfg.checkpoints == "off" and cfg.backend.kind == "local" and cfg.include_optional is True
    assert cfg.on_event == {}
    # a number field's default is written with a point, as pydantic wrote it
    assert Config().model_dump(mode="json")["autonomous_loop"]["timeout_seconds"] == 3600.0
    assert isinstance(Config().model_dump(mode="json")["autonomous_loop"]["timeout_seconds"], float)


def test_the_state_keeps_what_it_does_not_know_and_writes_what_it_read() -> None:
    """A newer kiro's keys survive a round trip, at the top and inside; `from` stays `from`."""
    record = {
        "task_id": "t1", "task_path": "Specs/a/tasks.md", "status": "running", "newer": {"a": [1, 2]},
        "usage": {"api_calls": "3", "cached_tokens": 9},
        "history": [{"at": "2026-01-01T00:00:00+00:00", "from": "pending", "to": "running", "why": "x"}],
        "completed_steps": [{"step_id": "1", "description": "d", "completed_at": "2026-01-01T00:00:00+00:00",
                             "duration_seconds": 2, "attempts": "2"}],
    }
    state = LoopState.model_validate_json(json.dumps(record))
    assert state.usage.api_calls == 3 and state.completed_steps[0].attempts == 2
    assert state.model_extra == {"newer": {"a": [1, 2]}} and state.usage.model_extra == {"cached_tokens": 9}
    written = json.loads(state.dump_json())
    assert written["newer"] == {"a": [1, 2]} and written["usage"]["cached_tokens"] == 9
    assert written["history"][0] == {"at": "2026-01-01T00:00:00+00:00", "from": "pending", "to": "running",
                                     "reason": None, "why": "x"}
    assert written["completed_steps"][0]["duration_seconds"] == 2.0
    assert LoopState.model_validate(written) == state
    # what is written is a copy: changing it changes nothing in the state
    dumped = state.model_dump(mode="json", by_alias=True)
    dumped["newer"]["a"].append(3)
    assert state.model_extra["newer"] == {"a": [1, 2]}
    assert state.model_dump()["history"][0]["from_status"] == "pending"  # by name unless by_alias


@pytest.mark.parametrize(("change", "where"), [
    ({"iteration": "one"}, "iteration: Input should be a valid integer, unable to parse string as an integer"),
    ({"metrics": {"success_rate": math.nan}}, "metrics.success_rate: Input should be a finite number"),
    ({"status": "interrupted"}, "status: Value error, <Status.INTERRUPTED: 'interrupted'> is shown by"),
    ({"task_id": "../x"}, "task_id: Value error, '../x' is not a plain task id"),
    ({"completed_steps": [{"step_id": "1"}]}, "completed_steps.0.description: Field required; and 2 more"),
    ({"git": {"isolation": "x"}}, "git.isolation: Input should be 'none' or 'worktree'"),
    ({"steps": {"2": {"next_retry_at": "2999-01-01T00:00:00+00:00"}}}, "steps.2.next_retry_at: Value error, "),
])
def test_a_state_kiro_never_writes_is_refused_with_where(change: dict[str, Any], where: str) -> None:
    with pytest.raises(FieldError) as caught:
        LoopState.model_validate({"task_id": "t1", "task_path": "Specs/a/tasks.md", **change})
    assert str(caught.value).startswith(where)


def test_a_state_nested_deeper_than_json_can_read_is_a_field_error_not_a_crash() -> None:
    with pytest.raises(FieldError, match="nested too deeply"):
        LoopState.model_validate_json("[" * 100_000 + "]" * 100_000)
    with pytest.raises(FieldError, match="Invalid JSON"):
        LoopState.model_validate_json(b'{"task_id": "t1", "task_path": "x", "iteration": NaN')
    with pytest.raises(FieldError, match="a valid dictionary or instance of LoopState"):
        LoopState.model_validate_json("[1]")


def test_a_constructor_checks_what_it_is_given() -> None:
    step = CompletedStep(step_id="1", description="d", completed_at="2026-01-01T00:00:00+00:00",
                         duration_seconds=1, iteration=None)
    assert step.duration_seconds == 1.0 and isinstance(step.duration_seconds, float)
    with pytest.raises(FieldError, match="completed_at: Value error, not an ISO 8601 time"):
        CompletedStep(step_id="1", description="d", completed_at="tomorrow", duration_seconds=1)
    assert Transition(at="x", from_status="a", to="b").model_dump(by_alias=True)["from"] == "a"


def test_a_loop_starts_and_runs_where_pydantic_cannot_be_imported(tmp_path: Path) -> None:
    """The run path needs no pydantic: with an importable `pydantic` that fails on import first on
    the path, `kiro loop start` of a shell task runs it to the end."""
    shadow = tmp_path / "shadow" / "pydantic"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('pydantic imported on the run path')\n")
    root = tmp_path / "vault"
    (root / "Specs/a").mkdir(parents=True)
    (root / "Specs/a/tasks.md").write_text("---\ntitle: T\nexecutor: shell\n---\n- [ ] 1. One\n  ```sh\n  true\n"
                                           "  ```\n- [ ] 2. Two\n  ```sh\n  true\n  ```\n")
    (root / "config").mkdir()
    (root / "config/autonomous_loop.yaml").write_text("autonomous_loop:\n  max_iterations: 5\nllm:\n  model: m\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow.parent), *sys.path]), "KIRO_WORKSPACE": str(root)}
    r = subprocess.run([sys.executable, "-m", "kiro", "loop", "start", "--task", "Specs/a/tasks.md"], cwd=root,
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (root / "Done/a/tasks.md").read_text().count("- [x]") == 2
