"""An agent preset from another package (issue #40, item 2): a `kiro-agent-echo` package that registers
one preset as an entry point of group `kiro.agents` (kiro.plugins.AGENTS) is, with no file of kiro's
touched, accepted by `--agent` and `agent:`, listed by `kiro agents`, named in the error a wrong name
gets and in `kiro config schema`, and runs a step.

The package is installed as Python finds one: its module and a `kiro_agent_echo-0.1.dist-info` folder
(METADATA, entry_points.txt) in a folder on sys.path (PYTHONPATH), read by importlib.metadata as for a
pip-installed package. kiro runs in its own process (`python -m kiro`), not the tests' fork server,
whose sys.path is set at its start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import Workspace

REPO = Path(__file__).resolve().parents[1]

# The whole package: a preset whose program is a script that leaves a file per step in the project.
MODULE = '''\
"""kiro-agent-echo: a kiro agent preset, registered by this package's entry point (kiro.agents)."""

import sys
from pathlib import Path

from kiro.executors.agents import Preset

AGENT = Path(__file__).with_name("echo_agent.py")


class EchoPreset(Preset):
    name = "echo"
    program = "echo-agent"
    install = "pip install kiro-agent-echo"

    def template(self) -> list[str]:
        return [sys.executable, str(AGENT), "{project_dir}", "{step_id}", *self.config.agent_args]
'''
AGENT = '''\
import sys
from pathlib import Path

Path(sys.argv[1], f"echo_{sys.argv[2]}.txt").write_text("hello")
print(f"echo: did step {sys.argv[2]}")
'''
PACKAGE = {
    "kiro_agent_echo.py": MODULE,
    "echo_agent.py": AGENT,
    "kiro_agent_echo-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: kiro-agent-echo\nVersion: 0.1\n",
    "kiro_agent_echo-0.1.dist-info/entry_points.txt": "[kiro.agents]\necho = kiro_agent_echo:EchoPreset\n",
}


def install(folder: Path) -> list[str]:
    """Write the package into `folder`; its files, with their line counts, as a diff stat would show them."""
    touched = []
    for rel, text in PACKAGE.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        touched.append(f" {rel} | {len(text.splitlines())} +")
    return touched


def kiro(ws: Workspace, *args: str, plugin: Path | None) -> subprocess.CompletedProcess[str]:
    env = ws.env()
    paths = [str(plugin)] if plugin is not None else []
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return subprocess.run([sys.executable, "-m", "kiro", *args], cwd=ws.root, env=env, capture_output=True,
                          text=True, timeout=300)


def repo_status() -> str:
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout


@pytest.fixture
def plugin(tmp_path: Path) -> Path:
    folder = tmp_path / "site"
    before = repo_status()
    touched = install(folder)
    print("adding the preset `echo`: files touched (all in its own package, none of kiro's):")
    print("\n".join(touched))
    print(f" {len(touched)} files changed, {sum(int(t.split('|')[1].split()[0]) for t in touched)} insertions(+)")
    assert repo_status() == before  # kiro's tree: nothing changed
    return folder


def test_an_installed_package_adds_a_preset_everywhere_names_are_read(ws: Workspace, plugin: Path) -> None:
    listed = kiro(ws, "agents", "--json", plugin=plugin)
    assert listed.returncode == 0, listed.stderr
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert "echo" in rows and "claude" in rows, sorted(rows)
    print(f"kiro agents: echo listed, program {rows['echo']['program']!r}, command {rows['echo']['command']!r}")

    schema = kiro(ws, "config", "schema", plugin=plugin)
    assert schema.returncode == 0, schema.stderr
    agent = json.loads(schema.stdout)["properties"]["agent"]["anyOf"][0]
    assert "echo" in agent["enum"] and "claude" in agent["enum"]
    print(f"kiro config schema: agent enum {agent['enum']}")

    ws.task("---\nexecutor: command\n---\n- [ ] 1. Say hello\n- [ ] 2. Say goodbye\n", "Specs/x/tasks.md")
    wrong = kiro(ws, "loop", "start", "--task", "Specs/x/tasks.md", "--agent", "ehco", plugin=plugin)
    assert wrong.returncode == 1 and "Traceback" not in wrong.stderr, wrong.stderr
    assert "'echo'" in wrong.stderr and "'claude'" in wrong.stderr, wrong.stderr
    print(f"--agent ehco: {wrong.stderr.strip()}")

    ws.write("config/autonomous_loop.yaml", ws.root.joinpath("config/autonomous_loop.yaml").read_text()
             + "sandbox: off\ncommand_success: exit_code\n")
    ran = kiro(ws, "loop", "start", "--task", "Specs/x/tasks.md", "--agent", "echo", plugin=plugin)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert sorted(p.name for p in ws.root.glob("echo_*.txt")) == ["echo_1.txt", "echo_2.txt"], ran.stdout
    print("--agent echo: the loop ran both steps through the package's preset")

    ws.write("config/autonomous_loop.yaml", "agent: echo\n")
    shown = kiro(ws, "config", "show", "--json", plugin=plugin)
    assert shown.returncode == 0, shown.stderr
    assert {row["key"]: row["value"] for row in json.loads(shown.stdout)}["agent"] == "echo"


def test_without_the_package_the_name_is_refused(ws: Workspace, plugin: Path) -> None:
    """What makes `echo` a name is the installed package's entry point, nothing of kiro's."""
    listed = kiro(ws, "agents", "--json", plugin=None)
    assert "echo" not in {row["name"] for row in json.loads(listed.stdout)}
    ws.write("config/autonomous_loop.yaml", "agent: echo\n")
    refused = kiro(ws, "config", "show", "--json", plugin=None)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert "(got 'echo')" in refused.stderr and "'claude'" in refused.stderr, refused.stderr
    print(f"without the package: {refused.stderr.strip()}")


def test_a_preset_in_kiro_itself_is_one_entry_point_and_one_module() -> None:
    """kiro's own presets are registered the same way: the names the config accepts are exactly
    pyproject.toml's entry points (no second list kept equal by hand)."""
    import tomllib

    from kiro.plugins import AGENTS

    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]["kiro.agents"]
    assert set(declared) <= set(AGENTS.names())
    for target in declared.values():
        module = target.split(":")[0]
        assert (REPO / (module.replace(".", os.sep) + ".py")).exists(), target
    shipped = textwrap.dedent((REPO / "kiro" / "default_config.yaml").read_text())
    assert "claude-acp |" not in shipped  # the comment does not repeat the names
