"""What a new user meets before any loop runs (issue #32 items 10 and 11): every `--help` page shows a flag
as a flag and a value by its name, shell completion installs and completes kiro's commands in a real bash,
and the installed distribution that provides the `kiro` command is `kiro-loop`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kiro.cli import app
from tests.conftest import Workspace

COMMANDS = [(), ("loop",), ("loop", "start"), ("loop", "resume"), ("loop", "status"), ("loop", "state"),
            ("loop", "progress"), ("loop", "rollback"), ("loop", "logs"), ("loop", "stop"), ("loop", "stats"),
            ("loop", "tell"), ("loop", "history"), ("loop", "watch"), ("init",), ("serve",), ("agents",),
            ("config",), ("config", "schema"), ("config", "show"), ("worker",)]
BASH = shutil.which("bash")
needs_bash = pytest.mark.skipif(BASH is None, reason="bash is not installed")


def help_of(command: tuple[str, ...]) -> str:
    r = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    return r.output


def test_every_help_page_shows_flags_as_flags_and_no_python_types() -> None:
    bad = {" ".join(c) or "kiro": [line.strip() for line in help_of(c).splitlines()
                                   if "<bool>" in line or "<list[" in line] for c in COMMANDS}
    print(f"looked at {len(COMMANDS)} --help pages")
    assert {k: v for k, v in bad.items() if v} == {}


def test_a_flag_is_shown_alone_and_task_takes_a_path() -> None:
    words = {line.split("--", 1)[1].split()[0]: line.split("--", 1)[1].split()[1:4]
             for line in help_of(("loop", "start")).splitlines() if "│" in line and " --" in line}
    assert words["detach"][0] == "Run"  # the help text follows the flag: no type column
    assert words["quiet"][:2] == ["-q", "Print"] and words["verbose"][:2] == ["-v", "Also"]
    assert words["help"][:2] == ["-h", "Show"]
    assert words["task"][:3] == ["-t", "PATH", "The"]  # repeatable, one path each time: not `<list[str]>`
    assert words["max-iterations"][0] == "<int>"  # an option that takes a value still says which


def kiro_bin() -> Path:
    found = Path(sys.executable).parent / "kiro"
    if not found.exists():
        pytest.skip(f"no kiro console script beside {sys.executable} (pip install -e . first)")
    return found


def bash(script: str, home: Path) -> subprocess.CompletedProcess[str]:
    assert BASH is not None
    env = {**os.environ, "HOME": str(home), "PATH": f"{kiro_bin().parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("KIRO_RAISE_ERRORS", None)
    return subprocess.run([BASH, "-c", script], env=env, capture_output=True, text=True, timeout=120)


COMPLETE = 'COMP_WORDS=(kiro loop st); COMP_CWORD=2; _kiro_completion kiro; printf "%s\\n" "${COMPREPLY[@]}"'


@needs_bash
def test_show_completion_prints_a_bash_script_that_completes_kiros_commands(tmp_path: Path) -> None:
    r = bash("kiro --show-completion", tmp_path)  # the shell is found from the process tree: bash here
    assert r.returncode == 0, r.stderr
    assert "complete -o default -F _kiro_completion kiro" in r.stdout and "_KIRO_COMPLETE=complete_bash" in r.stdout
    (tmp_path / "kiro.sh").write_text(r.stdout)
    done = bash(f"source {tmp_path / 'kiro.sh'}; {COMPLETE}", tmp_path)
    assert done.stdout.split() == ["start", "status", "state", "stop", "stats"], done.stdout + done.stderr


@needs_bash
def test_install_completion_writes_the_script_for_the_next_bash(tmp_path: Path) -> None:
    r = bash("kiro --install-completion", tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "bash completion installed in" in r.stdout
    script = tmp_path / ".bash_completions" / "kiro.sh"
    assert script.is_file() and str(script) in (tmp_path / ".bashrc").read_text()
    done = bash(f"source ~/.bashrc; {COMPLETE}", tmp_path)
    assert "status" in done.stdout.split(), done.stdout + done.stderr


def test_the_kiro_command_comes_from_the_kiro_loop_distribution() -> None:
    (script,) = metadata.entry_points(group="console_scripts", name="kiro")
    assert script.value == "kiro.cli:main"
    assert script.dist is not None and script.dist.name == "kiro-loop"
    assert metadata.version("kiro-loop") == __import__("kiro").__version__


# -- the CLI in the test's process (tests/cli_inprocess.py) -------------------------------------------

SAME_BOTH_WAYS = [("loop", "status"), ("loop", "state", "--task-id", "nosuch"), ("loop", "status", "--bogus"),
                  ("loop", "stop", "--help")]


def test_a_command_run_in_process_is_what_the_process_prints(ws: Workspace) -> None:
    """`ws.run` (in this process) and `ws.kiro` (a process of its own) give the same exit code, stdout and
    stderr: an empty table, a refusal (exit 1, one line), a usage error, a help page at a set width."""
    env = ws.env(COLUMNS="200")
    for args in SAME_BOTH_WAYS:
        here, there = ws.run(*args, env=env), ws.kiro(*args, env=env)
        assert (here.returncode, here.stdout, here.stderr) == (there.returncode, there.stdout, there.stderr), args
    print(f"{len(SAME_BOTH_WAYS)} command lines: the same exit code, stdout and stderr both ways")


def test_a_command_run_in_process_leaves_the_test_process_as_it_found_it(ws: Workspace, tmp_path: Path) -> None:
    """The environment, the working directory, argv and the SIGINT handler are the test's again after a
    run; a command that needs a process of its own (a loop, a watch, a detach) is refused, not run here."""
    import signal

    before = (dict(os.environ), os.getcwd(), list(sys.argv), signal.getsignal(signal.SIGINT))
    r = ws.run("loop", "status", "--json", cwd=tmp_path, env=ws.env(KIRO_WORKSPACE=str(ws.root), ONLY_HERE="1"))
    assert (r.returncode, r.stdout.strip()) == (0, "[]"), r.stderr
    assert (dict(os.environ), os.getcwd(), list(sys.argv), signal.getsignal(signal.SIGINT)) == before
    for args in (("loop", "start", "--task", "x.md"), ("loop", "status", "--watch"), ("loop", "logs", "-f"),
                 ("loop", "resume", "--all", "--detach"), ("serve",)):
        with pytest.raises(AssertionError, match="needs a process of its own"):
            ws.run(*args)


def test_a_command_run_in_process_knows_the_secrets_of_its_own_environment(ws: Workspace) -> None:
    """A process of its own makes its redactor from its own environment; in the test's process, the first
    command run there once made it for every later one: a secret in a later command's environment was
    printed as it is (`loop status KEY` echoed the key), as no process of its own would print it."""
    secret = "acme-planted-" + "8" * 16
    assert ws.run("loop", "status").returncode == 0  # the first command of this process, no secret around
    here = ws.run("loop", "status", secret, env=ws.env(ACME_DEPLOY_TOKEN=secret))
    print("in process:", here.stderr.strip())
    assert here.returncode == 1 and secret not in here.stderr and "[REDACTED]" in here.stderr, here.stderr
