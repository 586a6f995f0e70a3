"""`backend:` (SPEC §12): `local` is what kiro runs and is accepted; temporal is designed in docs/scale-out.md
and not built: kiro refuses it by name, in one line that says so, and never accepts a backend it would ignore."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiro.config import resolve_config
from kiro.errors import ConfigError
from tests.conftest import FAST_CONFIG, Workspace, shell_task

DESIGNED = "backend: temporal is designed in docs/scale-out.md, not built yet"


def refusal(root: Path, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        resolve_config(workspace_root=root, env=env or {})
    message = str(info.value)
    assert "\n" not in message, message
    return message


def write_config(root: Path, text: str) -> None:
    path = root / "config" / "autonomous_loop.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


@pytest.mark.parametrize("text", [
    "backend:\n  kind: temporal\n  address: 127.0.0.1:7233\n  namespace: default\n  task_queue: kiro\n",
    "backend: temporal\n",
    "backend: {kind: nomad}\n",
])
def test_temporal_backend_is_refused_naming_the_design(tmp_path: Path, text: str) -> None:
    write_config(tmp_path, "max_parallel_loops: 2\n" + text)
    message = refusal(tmp_path)
    assert message.startswith("config/autonomous_loop.yaml:2: " + DESIGNED), message
    assert "unknown key" not in message


@pytest.mark.parametrize("text", ["backend: local\n", "backend: {kind: local}\n"])
def test_backend_local_is_accepted_as_the_default_it_is(tmp_path: Path, text: str) -> None:
    write_config(tmp_path, text)
    resolve_config(workspace_root=tmp_path, env={})  # no error: SPEC §12's default, which kiro runs


def test_backend_local_with_other_keys_is_refused(tmp_path: Path) -> None:
    write_config(tmp_path, "backend: {kind: local, address: x}\n")
    message = refusal(tmp_path)
    assert message.startswith("config/autonomous_loop.yaml:1: backend: {kind: local} takes no other keys"), message


def test_backend_from_the_environment_is_refused_the_same_way(tmp_path: Path) -> None:
    message = refusal(tmp_path, env={"KIRO_BACKEND__KIND": "temporal"})
    assert message.startswith("environment KIRO_BACKEND__KIND: " + DESIGNED), message


def test_start_with_a_backend_is_one_line_and_creates_no_loop(ws: Workspace) -> None:
    ws.task(shell_task(2))
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "backend:\n  kind: temporal\n  address: 127.0.0.1:7233\n")
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "t1")
    assert "Traceback" not in r.stdout + r.stderr
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and DESIGNED in lines[0] and "config/autonomous_loop.yaml:4" in lines[0], r.stderr
    assert not (ws.root / ".state" / "autonomous_loop_t1.json").exists()
    assert "[ ]" in (ws.root / "Specs/feature/tasks.md").read_text()
