"""`kiro agents` asks each agent CLI for its version once, all at once, and keeps the answers in the
user's cache under the executable's path and modification time: on a busy machine eleven node CLIs
asked one after another with a short timeout lost their versions (issue 40). A probe that timed out is
kept as such (every later `kiro agents` waited for it again), and `kiro agents NAME` asks NAME's CLI only.

The CLIs here are scripts named as the presets' programs, first on PATH: each notes that it was asked,
and answers only once every other CLI has been asked too (so asked one after another, the first would
wait for the others forever and answer nothing).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from kiro.executors.agents import available
from kiro.executors.agents import versions as probes
from tests.conftest import Workspace

PROGRAMS = sorted({cls(None).program for cls in available()} - {""})
SECRET = "sk-live-0123456789abcdefghijklmnop"

FAKE = """#!/bin/bash
# {name}: a fake agent CLI that only answers --version, once all {count} CLIs were asked
[ "$1" = --version ] || exit 2
echo {name} >> "{calls}"
touch "{started}/{name}"
for _ in $(seq 1 600); do
  [ "$(ls "{started}" | wc -l)" -ge {count} ] && {{ echo "{name} {version}"; exit 0; }}
  sleep 0.1
done
echo "{name}: asked alone" >&2
exit 1
"""


def fake_clis(root: Path, count: int = len(PROGRAMS)) -> Path:
    bin_dir = root / "bin"
    bin_dir.mkdir(exist_ok=True)
    (root / "started").mkdir(exist_ok=True)
    for name in PROGRAMS:
        write_fake(root, name, "9.9.9", count)
    return bin_dir


def write_fake(root: Path, name: str, version: str, count: int, shell: str = "/bin/bash") -> None:
    path = root / "bin" / name
    path.write_text(FAKE.format(name=name, version=version, count=count, calls=root / "calls.log",
                                started=root / "started").replace("/bin/bash", shell, 1))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def calls(root: Path) -> list[str]:
    log = root / "calls.log"
    return log.read_text().split() if log.exists() else []


def versions(ws: Workspace, env: dict[str, str]) -> dict[str, str | None]:
    r = ws.run("agents", "--json", env=env)
    assert r.returncode == 0, r.stderr
    return {row["program"]: row["version"] for row in json.loads(r.stdout) if row["program"]}


def test_kiro_agents_asks_each_cli_once_at_once_and_keeps_the_answer_until_the_cli_changes(
        ws: Workspace, tmp_path: Path) -> None:
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    bin_dir = fake_clis(fakes)
    cache = tmp_path / "cache"
    env = ws.env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", XDG_CACHE_HOME=str(cache))

    first = versions(ws, env)
    assert first == {name: f"{name} 9.9.9" for name in PROGRAMS}  # every one answered: they were asked side by side
    assert sorted(calls(fakes)) == PROGRAMS  # once each, gemini and gemini-acp's one program too
    print(f"first `kiro agents`: {len(PROGRAMS)} CLIs asked at once, {len(first)} versions")

    assert versions(ws, env) == first
    assert sorted(calls(fakes)) == PROGRAMS  # the second asked none: the cache answered
    kept = json.loads((cache / "kiro" / "agent-versions.json").read_text())
    assert sorted(kept["versions"].values()) == sorted(first.values())

    # gemini upgraded in place (a new file, a new mtime): asked again, alone; the others still kept
    write_fake(fakes, "gemini", "10.0.0", count=1)
    st = (bin_dir / "gemini").stat()
    os.utime(bin_dir / "gemini", ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
    third = versions(ws, env)
    assert third == {**first, "gemini": "gemini 10.0.0"}
    assert sorted(calls(fakes)) == sorted([*PROGRAMS, "gemini"])
    print("after gemini's upgrade: 1 CLI asked again, the rest from the cache")


def test_a_cli_that_could_not_say_is_asked_again_and_no_secret_reaches_the_cache(ws: Workspace, tmp_path: Path) -> None:
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    bin_dir = fake_clis(fakes, count=len(PROGRAMS) - 1)  # all but codex, which cannot start
    write_fake(fakes, "claude", f"1.0 {SECRET}", count=len(PROGRAMS) - 1)
    write_fake(fakes, "codex", "9.9.9", count=1, shell=str(fakes / "later" / "bash"))  # its interpreter: not yet
    cache = tmp_path / "cache"
    env = ws.env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", XDG_CACHE_HOME=str(cache),
                 ANTHROPIC_API_KEY=SECRET)
    first = versions(ws, env)
    assert first["codex"] is None and first["qwen"] == "qwen 9.9.9"
    text = (cache / "kiro" / "agent-versions.json").read_text()
    assert SECRET not in text and "claude 1.0" in text
    assert SECRET not in json.dumps(first)
    asked = calls(fakes)
    assert "codex" not in asked and len(asked) == len(PROGRAMS) - 1

    (fakes / "later").mkdir()
    (fakes / "later" / "bash").symlink_to("/bin/bash")  # codex can start now, its file unchanged
    second = versions(ws, env)
    assert second == {**first, "codex": "codex 9.9.9"}
    assert calls(fakes) == [*asked, "codex"]  # codex asked again (nothing was kept of it), the others not
    print("a CLI that could not start: no version kept, asked again next time; the secret in a version line: cut")


HANGS = """#!/bin/bash
# {name}: a fake agent CLI whose --version never answers (a node CLI on a machine too busy to start it)
echo {name} >> "{calls}"
exec sleep 600
"""


def test_a_timed_out_probe_is_kept_said_and_asked_again_after_an_upgrade_and_a_name_asks_only_its_cli(
        ws: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gemini's --version hangs: `kiro agents gemini` asks gemini alone (no other CLI's probe), waits
    PROBE_TIMEOUT (1 s here), and says the version is unknown because the probe timed out. The next
    `kiro agents` asks it no more (a busy machine waited again each time, issue 40) and says the same; the
    other CLIs answer. Once gemini is upgraded (a new file), it is asked again and its version shown."""
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    bin_dir = fake_clis(fakes, count=1)  # each answers at once
    gemini = bin_dir / "gemini"
    gemini.write_text(HANGS.format(name="gemini", calls=fakes / "calls.log"))
    cache = tmp_path / "cache"
    env = ws.env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", XDG_CACHE_HOME=str(cache))
    monkeypatch.setattr(probes, "PROBE_TIMEOUT", 1.0)

    one = ws.run("agents", "gemini", env=env)
    assert one.returncode == 0, one.stderr
    print("kiro agents gemini:", one.stdout.splitlines()[1])
    assert calls(fakes) == ["gemini"]  # gemini's CLI alone was asked
    assert "gemini: installed, version unknown: `gemini --version` timed out" in one.stdout, one.stdout
    kept = json.loads((cache / "kiro" / "agent-versions.json").read_text())
    assert [json.loads(key)[0] for key in kept["timed_out"]] == [str(gemini)], kept

    monkeypatch.setattr(probes, "PROBE_TIMEOUT", 120.0)  # would hang two minutes if asked again
    rows = {row["program"]: row for row in json.loads(ws.run("agents", "--json", env=env).stdout) if row["program"]}
    assert calls(fakes).count("gemini") == 1, calls(fakes)  # not asked again
    assert sorted(calls(fakes)) == PROGRAMS  # the others were asked, once
    assert rows["gemini"]["version"] is None and rows["gemini"]["version_timed_out"] is True, rows["gemini"]
    assert rows["qwen"]["version"] == "qwen 9.9.9" and rows["qwen"]["version_timed_out"] is False, rows["qwen"]
    table = ws.run("agents", env=env).stdout
    print("kiro agents:", [line for line in table.splitlines() if "gemini" in line])
    shown = next(line for line in table.splitlines() if line.split()[0] == "gemini")
    assert shown.split()[1:5] == ["version", "unknown", "(--version", "timed"], table
    assert calls(fakes).count("gemini") == 1 and len(calls(fakes)) == len(PROGRAMS)  # all from the cache now

    write_fake(fakes, "gemini", "10.0.0", count=1)  # upgraded: a new file, a new mtime
    st = gemini.stat()
    os.utime(gemini, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
    again = ws.run("agents", "gemini", "--json", env=env)
    assert [row["version"] for row in json.loads(again.stdout)] == ["gemini 10.0.0"], again.stdout
    assert calls(fakes).count("gemini") == 2 and len(calls(fakes)) == len(PROGRAMS) + 1  # gemini alone, again
    assert json.loads((cache / "kiro" / "agent-versions.json").read_text())["timed_out"] == []
