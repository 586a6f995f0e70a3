"""The allow-list's idea of a command's words is bash's (issue #39 item 6).

kiro checks an agent's command against `tools.shell.allow` in three places: its own run_command, Codex's
PreToolUse hook (codex-acp) and an ACP agent's `execute` permission; the last two are run by the agent's
own shell afterwards. All three use one reading, `kiro.processes.shellwords.shell_words`: literal words
only. Each hostile line below is run by REAL bash in a scratch git repository first, to show what it would
do there (a CANARY file written, a program run besides the allowed one), then given to kiro's check and to
the real hook command line as Codex runs it. Every one must be refused. Commands kiro does accept are
read by bash into exactly the words kiro checked.

Run with -s for the table: tried, what bash would have done, held.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiro.executors import agents
from kiro.executors.agents.codex_acp import codex_config
from kiro.executors.tools.errors import ToolError
from kiro.executors.tools.shell import permitted
from kiro.processes.shellwords import shell_words
from kiro.store.config import ShellToolSettings
from tests.agent_clis import CLIS, Cli, serving, task_text
from tests.conftest import FAST_CONFIG, Workspace

SETTINGS = ShellToolSettings(enabled=True, allow=["git grep", "echo"])
# (what it tries, the command line); each would write CANARY (or run a second program) if bash ran it
HOSTILE: list[tuple[str, str]] = [
    ("brace expansion into git grep -O (the issue's)", 'git grep {"-Oid>CANARY;true",--} needle'),
    ("brace expansion, unquoted comma list", "git grep {-Otouch\\ CANARY,--} needle"),
    ("brace sequence", "echo {1..3} && touch CANARY"),
    ("a glob onto a file the agent named -O<program>", "git grep -?* needle"),
    ("a character-class glob onto it", "git grep [-]* needle"),
    ("ANSI-C quoting", "git grep $'-Otouch CANARY' needle"),
    ("command substitution", "echo $(touch CANARY)"),
    ("backquotes", "echo `touch CANARY`"),
    ("a variable", "git grep $HOME needle"),
    ("arithmetic expansion", "echo $((1+1))"),
    ("process substitution", "git grep -f <(touch CANARY) needle"),
    ("a here-string", "git grep -f - needle <<< x"),
    ("a redirection", "echo hi > CANARY"),
    ("a redirection glued to a word", "echo hi>CANARY"),
    ("an fd redirection", "echo hi 2>CANARY"),
    ("a newline", "echo hi\ntouch CANARY"),
    ("a carriage return and newline", "echo hi\r\ntouch CANARY"),
    ("an escaped newline", "echo hi \\\ntouch CANARY"),
    ("a semicolon", "echo hi; touch CANARY"),
    ("&&", "echo hi && touch CANARY"),
    ("||", "git grep nothing-here || touch CANARY"),
    ("a background &", "echo hi & touch CANARY"),
    ("a pipe", "echo hi | tee CANARY"),
    ("a subshell", "(echo hi; touch CANARY)"),
    ("a group", "{ echo hi; touch CANARY; }"),
    ("a tilde", "git grep needle ~"),
    ("a comment hiding the rest", "echo hi #; not seen"),
    ("history-style !", "echo hi !touch"),
    ("an expansion inside double quotes", 'echo "$(touch CANARY)"'),
    ("an escape inside double quotes", 'echo "a\\"; touch CANARY; echo "'),
    ("an env prefix", "GIT_PAGER=touch git grep needle"),
    ("an env prefix +=", "PATH+=:. echo hi"),
    ("`command` wrapper", "command touch CANARY"),
    ("`exec` wrapper", "exec touch CANARY"),
    ("`builtin` wrapper", "builtin eval touch CANARY"),
    ("a quoted program name glued to an allowed one", "'git' grep{,} needle"),
    ("-- as -e's argument, then -O", "git grep -e -- '-Otouch CANARY;true' -e needle"),
    ("an unterminated quote", "echo 'hi"),
]
# commands kiro accepts: bash must read the same words
BENIGN = ["git grep needle", "git grep -n 'two words' -- src", 'echo "a b" c', "echo a=b --x=y:z,w@1%2+3",
          "git grep -e 'x\\y' ''", "echo \"it's\" 'say \"hi\"'"]


def words_by_bash(command: str) -> list[str]:
    out = subprocess.run(["bash", "-c", f"printf '%s\\0' {command}"], capture_output=True, text=True, timeout=30,
                         check=True).stdout
    return out.split("\0")[:-1]


def what_bash_does(command: str, folder: Path) -> str:
    """Run `command` with real bash in a scratch repository (git and echo as they are; nothing else
    the line names exists outside it) and say what happened."""
    folder.mkdir()
    for args in (["init", "-q"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty",
                                  "-m", "x"]):
        subprocess.run(["git", *args], cwd=folder, check=True, capture_output=True)
    (folder / "a.txt").write_text("needle\n")
    (folder / "-Otouch CANARY;true").write_text("")  # a file an agent could have made earlier
    subprocess.run(["git", "add", "a.txt"], cwd=folder, check=True, capture_output=True)
    env = {"PATH": os.environ["PATH"], "HOME": str(folder), "GIT_PAGER": "cat", "PAGER": "cat"}
    subprocess.run(["bash", "-c", command], cwd=folder, env=env, capture_output=True, timeout=30,
                   stdin=subprocess.DEVNULL)
    return "CANARY written" if (folder / "CANARY").exists() else "no CANARY"


def check(command: str) -> str | None:
    try:
        permitted(command, SETTINGS)
    except ToolError as exc:
        return str(exc)
    return None


def hook(command: str) -> subprocess.CompletedProcess[str]:
    config = codex_config(SETTINGS)
    line = config["hooks"]["PreToolUse"][0]["hooks"][0]["command"]  # type: ignore[index]
    call = {"hook_event_name": "PreToolUse", "tool_name": "Bash", "tool_input": {"command": command}}
    return subprocess.run(["sh", "-c", line], input=json.dumps(call), capture_output=True, text=True, timeout=60)


def test_every_hostile_command_line_is_refused_by_the_one_check_and_the_codex_hook(tmp_path: Path) -> None:
    held = 0
    fell = []
    for i, (what, command) in enumerate(HOSTILE):
        bash = what_bash_does(command, tmp_path / f"r{i}")
        why = check(command)
        r = hook(command)
        ok = why is not None and r.returncode == 2
        held += ok
        if not ok:
            fell.append(what)
        print(f"  {'held' if ok else 'FELL'}: {what}: {command!r} (bash alone: {bash}); kiro: {why or 'allowed'}")
    print(f"shell allow-list attacks tried: {len(HOSTILE)}, held: {held}")
    assert not fell, fell


def test_the_issues_brace_expansion_really_runs_a_program_under_bash(tmp_path: Path) -> None:
    """The attack is real: bash turns the braces into `git grep -Oid>CANARY;true -- needle`, and git runs
    `-O`'s program."""
    assert what_bash_does(HOSTILE[0][1], tmp_path / "r") == "CANARY written"


@pytest.mark.parametrize("command", BENIGN)
def test_what_kiro_accepts_bash_reads_into_the_same_words(command: str) -> None:
    assert check(command) is None, check(command)
    assert shell_words(command) == words_by_bash(command)


@pytest.fixture
def claude(cli_home: Path) -> Iterator[Cli]:
    yield from serving(CLIS["claude"](cli_home))


def test_the_real_claude_does_not_run_the_brace_expansion_its_allow_list_was_built_from(
        ws: Workspace, claude: Cli) -> None:
    """Claude Code gets `tools.shell.allow` as its own `--allowedTools Bash(git grep:*)`, checked by Claude
    Code's matcher, not kiro's: the model asks for the issue's command, and no CANARY appears."""
    subprocess.run(["git", "init", "-q", str(ws.root)], check=True)
    ws.write("notes.txt", "needle\n")
    ws.task(task_text(1))
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "agent: claude\ntools:\n  shell:\n    enabled: true\n"
             "    allow: [\"git grep\"]\n")
    claude.extra = [("Bash", {"command": HOSTILE[0][1], "description": "search"})]
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", env=ws.env(**claude.env()), timeout=600)
    log = "\n".join(p.read_text() for p in (ws.root / "Logs").rglob("*.log"))
    version = agents.get("claude").version(timeout=10)
    print("claude", version, "exit", r.returncode, "CANARY:", (ws.root / "CANARY").exists())
    assert '"name":"Bash"' in log.replace(" ", "")  # the model did ask for it
    assert not (ws.root / "CANARY").exists(), log[-3000:]
