"""The one reading of an agent's shell command that every allow-list shares, and `tools.shell`'s rule on it:
kiro's own run_command (kiro.executors.tools.shell), an ACP agent's `execute` permission
(kiro.executors.acp) and Codex's shell hook (kiro.processes.codex_hook), which Codex starts before each
command and so must start in milliseconds: this module imports nothing heavier than the standard library
and kiro.processes.programs.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from typing import Protocol

from kiro.processes import programs


class Refused(Exception):
    """Why kiro refuses an agent's command (the message is what the agent reads)."""


class ShellRules(Protocol):
    """What the rule reads of `tools.shell` (kiro.store.config.ShellToolSettings)."""

    @property
    def enabled(self) -> bool: ...
    @property
    def allow(self) -> Sequence[str]: ...
    @property
    def trust_agent_code(self) -> bool: ...


# Literal words only, so what kiro checks is what bash runs. Outside quotes a word is made of these
# characters; anything else (braces, globs, ~, $, `, \\, #, !, ;, &, |, <, >, parentheses, a newline) bash
# would expand, split or run, and is refused.
PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./:=@%+,-")
BLANKS = " \t"
OPERATORS = frozenset(";&|<>()")
IN_DOUBLE_QUOTES = frozenset("$`\\!\n\r\0")  # what bash expands inside "..." (or history would)
IN_SINGLE_QUOTES = frozenset("\n\r\0'")
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\+?=")


def shell_words(command: str) -> list[str]:
    """The words bash would run for `command`, when they are literal: plain characters (PLAIN), and
    quoted parts that bash takes as they are ('...' without a newline, "..." without $, `, \\ or !).
    Anything bash would expand, split, redirect or run as a second command is Refused, naming it."""
    words: list[str] = []
    word: list[str] | None = None
    i, n = 0, len(command)
    while i < n:
        ch = command[i]
        if ch in BLANKS:
            if word is not None:
                words.append("".join(word))
                word = None
            i += 1
            continue
        if ch in ("'", '"'):
            close = command.find(ch, i + 1)
            inside = command[i + 1:close] if close >= 0 else command[i + 1:]
            bad = IN_SINGLE_QUOTES if ch == "'" else IN_DOUBLE_QUOTES
            odd = next((c for c in inside if c in bad), None)
            if close < 0:
                raise Refused(f"cannot parse the command (no closing quote {ch})")
            if odd is not None:
                raise Refused(f"kiro refuses {odd!r} inside {ch}...{ch} in a command: a shell would expand it or "
                                f"it would span lines; give literal words that mean the same without a shell")
            word = [*(word or []), inside]
            i = close + 1
            continue
        if ch in OPERATORS:
            raise Refused(f"kiro runs one program per command, without a shell, so {ch!r} (pipes, redirection, "
                            f"';', '&&', subshells) is refused; run one command per call")
        if ch not in PLAIN:
            raise Refused(f"kiro refuses {ch!r} outside quotes in a command: a shell would expand it (braces, "
                            f"globs, ~, $, `, \\, #, a second line); give literal words that mean the same without a "
                            f"shell, quoted if need be")
        word = [*(word or []), ch]
        i += 1
    if word is not None:
        words.append("".join(word))
    if not words:
        raise Refused("the command is empty")
    if ASSIGNMENT.match(command.lstrip(BLANKS)):
        raise Refused("kiro refuses a command that starts with a variable assignment (NAME=value program)")
    return words


def allowed(argv: Sequence[str], allow: Sequence[str]) -> bool:
    """Whether the command's leading words equal those of one allow-list entry."""
    for entry in allow:
        try:
            words = shell_words(entry)
        except Refused:
            continue
        if words and list(argv[: len(words)]) == words:
            return True
    return False


def permitted(command: str, settings: ShellRules) -> list[str]:
    """The argv of an agent's command when `tools.shell` lets it run (enabled, one program, on the
    allow-list, no code runner unless `trust_agent_code`, no refused argument); else Refused saying
    why. kiro's own run_command and an ACP agent's permission requests (kiro.executors.tools.shell,
    kiro.executors.acp) and Codex's shell hook (kiro.processes.codex_hook)."""
    if not settings.enabled:
        raise Refused("run_command is disabled (tools.shell.enabled is false)")
    argv = shell_words(command)
    if not allowed(argv, settings.allow):
        allow = ", ".join(repr(a) for a in settings.allow) or "(empty: tools.shell.allow lists nothing)"
        raise Refused(f"{argv[0]!r} is not on the allow-list; allowed commands start with: {allow}")
    if not settings.trust_agent_code:
        why = programs.refusal(shlex.join(argv[:2]))
        if why is not None:
            raise Refused(f"kiro refuses to run this: {why}")
    why = programs.refused_arguments(argv)
    if why is not None:
        raise Refused(why)
    return argv
