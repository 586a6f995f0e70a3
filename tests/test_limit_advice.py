"""The advice after a loop ran out of something names the limit that hit (issue "What a new user hit",
item 2): a night that ended on `timeout_seconds` is told `--timeout`, not `--max-iterations`; a
guardrail budget is a config key to raise. The default run-time limit is a night (12 h)."""

from __future__ import annotations

import pytest

from kiro.status import Status
from kiro.store.config import Config
from kiro.store.state import LoopState
from kiro.views import dashboard, reports


def _stopped(status: str, reason: str) -> LoopState:
    st = LoopState(task_id="night", task_path="Specs/night/tasks.md", max_iterations=100, timeout_seconds=43200)
    st.transition(status)
    st.stop_reason = reason
    return st


@pytest.mark.parametrize(("status", "reason", "names", "not_names"), [
    ("timed_out", "timeout_seconds", "kiro loop resume --task-id night --timeout 86400", "--max-iterations"),
    ("max_iterations", "max_iterations", "kiro loop resume --task-id night --max-iterations 200", "--timeout"),
    ("max_iterations", "max_cost_usd", "`guardrails.max_cost_usd`", "--max-iterations"),
    ("max_iterations", "max_total_tokens", "`guardrails.max_total_tokens`", "--max-iterations"),
    ("timed_out", "idle_timeout_seconds", "`guardrails.idle_timeout_seconds`", "--timeout"),
])
def test_the_intervention_note_and_the_dashboard_name_the_limit_that_hit(status: str, reason: str, names: str,
                                                                         not_names: str) -> None:
    st = _stopped(status, reason)
    note = reports.intervention_request(st, reason=reason, detail=f"{reason} reached")
    board = dashboard.markdown([dashboard.Entry(st, Status(status), alive=False)])
    for text in (note, board):
        assert names in text
        assert not_names not in text


def test_the_default_run_time_limit_is_a_night() -> None:
    assert Config().autonomous_loop.timeout_seconds == 12 * 3600
    assert Config().autonomous_loop.max_iterations == 100
