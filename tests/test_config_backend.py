"""`backend:` (SPEC §12): `local` (the default) and `temporal` (docs/scale-out.md) are accepted with their keys;
anything else is refused in one line naming the file, the line and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiro.errors import ConfigError
from kiro.store.config import Config, LocalBackend, TemporalBackend, resolve_config


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


def test_the_default_is_local(tmp_path: Path) -> None:
    assert Config().backend == LocalBackend()
    assert resolve_config(workspace_root=tmp_path, env={}).backend.kind == "local"


@pytest.mark.parametrize("text", ["backend: local\n", "backend: {kind: local}\n"])
def test_backend_local_is_accepted(tmp_path: Path, text: str) -> None:
    write_config(tmp_path, text)
    assert resolve_config(workspace_root=tmp_path, env={}).backend == LocalBackend()


def test_backend_temporal_with_its_keys(tmp_path: Path) -> None:
    write_config(tmp_path, "backend:\n  kind: temporal\n  address: 10.0.0.5:7233\n  namespace: team\n"
                           "  task_queue: gpu\n  heartbeat_seconds: 2\n")
    backend = resolve_config(workspace_root=tmp_path, env={}).backend
    assert backend == TemporalBackend(kind="temporal", address="10.0.0.5:7233", namespace="team", task_queue="gpu",
                                      heartbeat_seconds=2)


def test_backend_temporal_by_name_takes_the_defaults(tmp_path: Path) -> None:
    write_config(tmp_path, "backend: temporal\n")
    backend = resolve_config(workspace_root=tmp_path, env={}).backend
    assert isinstance(backend, TemporalBackend)
    assert (backend.address, backend.namespace, backend.task_queue) == ("127.0.0.1:7233", "default", "kiro")


def test_backend_from_the_environment(tmp_path: Path) -> None:
    env = {"KIRO_BACKEND__KIND": "temporal", "KIRO_BACKEND__ADDRESS": "h:7000"}
    backend = resolve_config(workspace_root=tmp_path, env=env).backend
    assert isinstance(backend, TemporalBackend) and backend.address == "h:7000"


@pytest.mark.parametrize("text, line, words", [
    ("backend: {kind: nomad}\n", 2, "'local', 'temporal'"),
    ("backend:\n  kind: temporal\n  adress: x\n", 4, "unknown key 'backend.adress'"),
    ("backend: {kind: local, address: x}\n", 2, "unknown key 'backend.address'"),
    ("backend: {kind: temporal, heartbeat_seconds: 0}\n", 2, "backend.heartbeat_seconds"),
    ("checkpoints: off\nbackend: temporal\n", 3, "the temporal backend needs git checkpoints"),
    ("merge: auto\nbackend: temporal\n", 3, "merge: auto is not built on it"),
])
def test_a_bad_backend_is_one_line_naming_file_and_line(tmp_path: Path, text: str, line: int, words: str) -> None:
    write_config(tmp_path, "max_parallel_loops: 2\n" + text)
    message = refusal(tmp_path)
    assert message.startswith(f"config/autonomous_loop.yaml:{line}: "), message
    assert words in message, message
