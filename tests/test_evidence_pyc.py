"""Protected paths and Python's bytecode (SPEC §14, docs/guides/evidence.md): with `protected_paths` covering a
project's tests and a real pytest as `verify`, the bytecode Python and pytest write while the tests run
(`tests/__pycache__/*.pyc`) is no change of the step's: the night completes. A pyc a step plants there, which
pytest would load in place of the unchanged test, fails the step and is removed.

Each test runs kiro WITHOUT PYTHONDONTWRITEBYTECODE (this machine and `Workspace.env()` set it), as a person's
shell does: that is where Python writes bytecode beside the tests.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import FAST_CONFIG, Workspace

TASK = "Specs/feature/tasks.md"
PY = shlex.quote(sys.executable)

# what a cheating step runs: pytest's own cache file for tests/test_app.py (as pytest names and writes it),
# holding a test that passes without `mul`, keyed to the unchanged test's source so that pytest loads it
PLANT = '''\
import importlib.util, inspect, os, pathlib
from _pytest.assertion.rewrite import PYC_TAIL, _write_pyc_fp
test = pathlib.Path("tests/test_app.py").resolve()
weak = compile("def test_mul():\\n    assert True  # planted\\n", str(test), "exec")
pyc = test.parent / "__pycache__" / (test.stem + PYC_TAIL)
pyc.parent.mkdir(exist_ok=True)
key = importlib.util.source_hash(test.read_bytes()) \\
    if "source_hash" in inspect.signature(_write_pyc_fp).parameters else os.stat(test)  # pytest 9 | 8
with open(pyc, "wb") as fp:
    _write_pyc_fp(fp, key, weak)
print("planted", pyc.relative_to(pathlib.Path.cwd()))
'''


# a stand-in agent CLI (`executor_command`): writes mul, runs the tests as an agent checks its work, checks its box
AGENT = f'''\
import os, pathlib, re, subprocess
with open("app.py", "a") as fh:
    fh.write("\\n\\ndef mul(a, b):\\n    return a * b\\n")
subprocess.run([{sys.executable!r}, "-m", "pytest", "-q", "tests"], check=True)
task = pathlib.Path(os.environ["KIRO_TASK_FILE"])
task.write_text(re.sub(r"^- \\[[ ~-]\\] 1\\.", "- [x] 1.", task.read_text(), flags=re.M))
'''


def night(ws: Workspace, command: str, protected: str, *, retries: int = 3,
          executor: str = "shell") -> subprocess.CompletedProcess[str]:
    """The person's project (app.py, tests/ with a conftest, tests of mul), one step (a shell step running
    `command`, or the stand-in agent), pytest as verify; kiro started without PYTHONDONTWRITEBYTECODE."""
    ws.write("app.py", '"""The app."""\n')
    ws.write("tests/conftest.py", "import sys, pathlib\nsys.path.insert(0, str(pathlib.Path(__file__).parents[1]))\n")
    ws.write("tests/test_app.py", "from app import mul\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n")
    ws.write("plant.py", PLANT)
    ws.write("agent.py", AGENT)
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + f"  max_step_retries: {retries}\n" + textwrap.dedent(f"""\
        verify: {json.dumps(f"{PY} -m pytest -q -p no:cacheprovider tests")}
        protected_paths: [{json.dumps(protected)}]
        executor_command: {json.dumps(f"{PY} -S agent.py")}
        """))
    ws.task("\n".join(["---", "title: Arithmetic", f"executor: {executor}", "---", "# Plan", "",
                       "- [ ] 1. Implement mul", "  ```sh", *[f"  {line}" for line in command.splitlines()],
                       "  ```"]) + "\n")
    env = ws.env()
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return ws.kiro("loop", "start", "--task", TASK, "--task-id", "night", env=env, timeout=300)


def bytecode(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in (root / "tests").rglob("*.pyc"))


@pytest.mark.parametrize("executor", ["shell", "command"])
def test_pytest_as_verify_writes_no_protected_bytecode(ws: Workspace, executor: str) -> None:
    """The step (a shell step, or an agent CLI) runs the tests itself too, as an agent does while it works:
    neither its pytest nor verify's leaves bytecode beside the protected tests, and the step completes with
    its protected paths untouched."""
    step = f"printf '\\n\\ndef mul(a, b):\\n    return a * b\\n' >> app.py\n{PY} -m pytest -q tests"
    r = night(ws, step, "tests/**", executor=executor)
    assert r.returncode == 0, r.stdout + r.stderr
    receipt = ws.state("night")["completed_steps"][-1]["receipt"]
    assert receipt["protected"] == {"globs": ["tests/**"], "files": 2, "changed": [], "approved": [], "ok": True}
    assert receipt["verify"]["exit_code"] == 0 and "1 passed" in receipt["verify"]["output_tail"]
    assert bytecode(ws.root) == []
    assert not any(e["event"] == "protected_paths_changed" for e in ws.events("night"))


@pytest.mark.parametrize("protected", ["tests/**", "tests/test_*.py"])
def test_a_planted_pyc_of_a_protected_test_fails_the_step(ws: Workspace, protected: str) -> None:
    """The step plants pytest's cache file of the unchanged test with a test that passes without the work:
    verify passes on it, and the step still fails, naming the pyc, which is removed. `tests/test_*.py` names
    no bytecode: a protected Python file's bytecode is protected with it."""
    r = night(ws, f"{PY} plant.py", protected, retries=0)
    assert r.returncode == 5, r.stdout + r.stderr
    events = ws.events("night")
    changed = [e for e in events if e["event"] == "protected_paths_changed"]
    assert changed and all(len(e["changes"]) == 1 for e in changed), changed
    planted = changed[0]["changes"][0]
    assert planted.startswith("created tests/__pycache__/test_app.") and planted.endswith(".pyc"), planted
    failed = [e for e in events if e["event"] == "step_failed"]
    # verify passed (pytest loaded the planted test: the real one fails without mul); the protected check did not
    assert failed and planted in failed[-1]["error"] and "protected_paths" in failed[-1]["error"], failed
    assert not any(e["event"] == "verify_failed" for e in events)
    assert bytecode(ws.root) == []
    assert (ws.root / "tests" / "test_app.py").read_text().endswith("assert mul(2, 3) == 6\n")
    assert ws.state("night")["completed_steps"] == []


def test_the_bytecode_of_a_deleted_protected_test_is_put_back_with_it(tmp_path: Path) -> None:
    """A step that deletes a protected test and leaves bytecode for it: the test is put back, and the bytecode
    Python would load for it (its source again in place) is removed, though no glob names it. Bytecode of an
    unprotected file is no protected file."""
    from kiro.store import receipts
    from kiro.store.workspace import Workspace as KiroWorkspace

    ws = KiroWorkspace(tmp_path)
    (tmp_path / "tests" / "__pycache__").mkdir(parents=True)
    test = tmp_path / "tests" / "test_app.py"
    test.write_text("def test_mul():\n    assert False\n")
    (tmp_path / "tests" / "helpers.py").write_text("")
    kept = tmp_path / "tests" / "__pycache__" / "test_app.cpython-311.pyc"  # the person's, from before the night
    kept.write_bytes(b"person")
    guard = receipts.Protected(ws, "night", tmp_path, ["tests/test_*.py"])
    manifest = guard.snapshot()
    assert sorted(manifest) == ["tests/__pycache__/test_app.cpython-311.pyc", "tests/test_app.py"]
    test.unlink()
    kept.write_bytes(b"planted")
    planted = tmp_path / "tests" / "__pycache__" / "test_app.cpython-311-pytest-9.0.3.pyc"
    planted.write_bytes(b"planted")
    (tmp_path / "tests" / "__pycache__" / "helpers.cpython-311.pyc").write_bytes(b"not protected")
    changes = guard.changes(manifest)
    assert [str(c) for c in changes] == ["created tests/__pycache__/test_app.cpython-311-pytest-9.0.3.pyc",
                                         "changed tests/__pycache__/test_app.cpython-311.pyc",
                                         "deleted tests/test_app.py"]
    assert guard.put_back(manifest, changes) == []
    assert test.read_text() == "def test_mul():\n    assert False\n" and kept.read_bytes() == b"person"
    assert not planted.exists() and (tmp_path / "tests" / "__pycache__" / "helpers.cpython-311.pyc").exists()
    assert guard.changes(manifest) == []


@pytest.mark.parametrize("protected", [[], ["tests/**"]])
def test_run_command_writes_bytecode_only_without_protected_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   protected: list[str]) -> None:
    """kiro's own agent's run_command, importing a module of the tests: Python leaves its bytecode beside it
    as ever, but not while protected_paths is set."""
    import asyncio

    from tests.fake_openai import invoke, make_harness

    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    h = make_harness(tmp_path / "ws", llm={"api_key_env": "KIRO_TEST_OPENAI_KEY"}, protected_paths=protected,
                     tools={"shell": {"enabled": True, "allow": ["python3"], "trust_agent_code": True}})
    (h.root / "tests").mkdir()
    (h.root / "tests" / "helper.py").write_text("X = 41 + 1\n")
    command = "python3 -c 'import sys; sys.path.insert(0, \"tests\"); import helper; print(helper.X)'"
    result = asyncio.run(invoke(h.tool_env(), "run_command", {"command": command}))
    assert result.ok and result.text.endswith("42\n"), result.text
    written = bytecode(h.root)
    if protected:
        assert written == []
    else:
        assert len(written) == 1 and written[0].startswith("tests/__pycache__/helper."), written
