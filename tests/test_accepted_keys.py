"""No key is accepted and then ignored (issue 7 item 16): a key kiro cannot honour is refused with one
line naming the file, key and fix; a key the SPEC lists but kiro does not act on yet gets one warning
line on stderr when the loop starts; the SPEC's accepted no-ops (`stop --save-state`, `state --json`)
say so."""

from __future__ import annotations

import json
import re

import pytest

from kiro.store.config import default_config_yaml
from tests.conftest import FAST_CONFIG, Workspace, shell_task


def _help(ws: Workspace, command: str) -> str:
    out = ws.kiro("loop", command, "--help", env=ws.env(COLUMNS="300")).stdout
    return " ".join(out.replace("│", " ").split())


def _start(ws: Workspace) -> object:
    return ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "k")


@pytest.mark.parametrize("yaml, key, fix", [
    ("  save_state_every_iteration: false\n", "autonomous_loop.save_state_every_iteration",
     "set it to true"),
    ("on_event:\n  step_completed: echo hi\n", "on_event", "completed, failed, paused, limit, finished"),
])
def test_a_key_kiro_cannot_honour_is_refused(ws: Workspace, yaml: str, key: str, fix: str) -> None:
    ws.task(shell_task(1))
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + yaml)
    r = _start(ws)
    assert r.returncode == 1  # type: ignore[attr-defined]
    err = r.stderr.strip()  # type: ignore[attr-defined]
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("error: config/autonomous_loop.yaml:") or "config/autonomous_loop.yaml:" in err
    assert key in err and fix in err
    assert not list((ws.root / ".state").glob("autonomous_loop_*.json"))  # nothing started


def test_the_shipped_config_starts_without_warnings(ws: Workspace) -> None:
    ws.write("config/autonomous_loop.yaml",
             re.sub(r"backoff_base_seconds: [0-9.]+", "backoff_base_seconds: 0.01", default_config_yaml()))
    ws.task(shell_task(1))
    r = _start(ws)
    assert r.returncode == 0, r.stderr  # type: ignore[attr-defined]
    assert "warning" not in r.stderr.lower()  # type: ignore[attr-defined]


def test_the_specs_accepted_no_ops_say_so(ws: Workspace) -> None:
    ws.task(shell_task(1))
    assert _start(ws).returncode == 0  # type: ignore[attr-defined]
    plain, with_flag = ws.run("loop", "state", "--task-id", "k"), ws.run("loop", "state", "--task-id", "k", "--json")
    assert json.loads(plain.stdout) == json.loads(with_flag.stdout)
    assert "always printed as JSON" in _help(ws, "state")
    r = ws.run("loop", "stop", "--task-id", "k", "--save-state")
    assert r.returncode == 0, r.stderr
    assert "the state is always saved" in _help(ws, "stop")
