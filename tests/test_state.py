"""The state's models (kiro.store.state): what a state file holds is read as kiro wrote it, a newer kiro's keys
survive a round trip, and a state kiro never writes is refused with where it is wrong."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from pydantic import ValidationError

from kiro.store.state import CompletedStep, LoopState, Transition
from kiro.store.statestore import _short


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
    assert json.dumps(written["completed_steps"][0]["duration_seconds"]) == "2.0"
    assert LoopState.model_validate(written) == state
    # what is written is a copy: changing it changes nothing in the state
    dumped = state.model_dump(mode="json", by_alias=True)
    dumped["newer"]["a"].append(3)
    assert state.model_extra["newer"] == {"a": [1, 2]}


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
    """What `kiro loop status` and a resume say of an unreadable state file: the first key, its error."""
    with pytest.raises(ValidationError) as caught:
        LoopState.model_validate({"task_id": "t1", "task_path": "Specs/a/tasks.md", **change})
    assert _short(caught.value).startswith(where)


def test_a_state_nested_deeper_than_json_can_read_is_refused_not_a_crash() -> None:
    for raw in ("[" * 100_000 + "]" * 100_000, b'{"task_id": "t1", "task_path": "x", "iteration": NaN', "[1]"):
        with pytest.raises(ValidationError) as caught:
            LoopState.model_validate_json(raw)
        assert _short(caught.value)


def test_a_constructor_checks_what_it_is_given() -> None:
    step = CompletedStep(step_id="1", description="d", completed_at="2026-01-01T00:00:00+00:00",
                         duration_seconds=1, iteration=None)
    assert step.duration_seconds == 1.0 and isinstance(step.duration_seconds, float)
    with pytest.raises(ValidationError, match="not an ISO 8601 time"):
        CompletedStep(step_id="1", description="d", completed_at="tomorrow", duration_seconds=1)
    assert Transition(at="x", from_status="a", to="b").model_dump(by_alias=True)["from"] == "a"
