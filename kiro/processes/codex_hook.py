"""Codex's PreToolUse hook that puts kiro's `tools.shell` rules on codex-acp's commands out of kiro's box.

In its `read-only` mode codex-acp asks kiro about every edit, but runs a command in Codex's own
read-only sandbox without asking: that sandbox reads every file the user can (`~/.ssh` included), and
Codex cannot be told otherwise without the person's config.toml (restricted reads need a permission
profile, which codex-acp only offers from the config files). What it does offer is `CODEX_CONFIG`'s
`hooks`, passed to the App Server as `-c hooks=...`: a hook of the invocation only, trusted by its
`hooks.state` hash in the same flag (Codex's session-flags layer), never written to `~/.codex`.

Codex runs the hook before each shell command (`tool_name` "Bash", `tool_input.command`); exit 2 with a
reason on stderr refuses it, and the model reads the reason. The rule is kiro's own agent's
(kiro.processes.shellwords.permitted: `tools.shell` enabled, the command on its allow-list), and as
Codex runs the command through a shell, no expansion or second line either. The one exception is
`apply_patch` with a quoted heredoc, which Codex turns into an edit it asks kiro about (kiro answers by
its path rules: kiro.executors.acp).

    python -m kiro.processes.codex_hook SETTINGS_JSON < hook-input.json

Codex starts it before every command, so it imports only the standard library and kiro.processes
(a few tens of milliseconds, against ~0.4 s for kiro's agent and config modules). Its command line and trust
hash are made where codex-acp's run is (kiro.executors.agents.codex_acp.codex_config).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass

from kiro.processes.shellwords import Refused, permitted

# Codex's own edit form: one `apply_patch` of one quoted heredoc, nothing after it
APPLY_PATCH = re.compile(r"apply_patch <<'(?P<end>[A-Za-z_]+)'\n(?P<body>.*)\n(?P=end)\n?", re.DOTALL)


@dataclass(frozen=True)
class Rules:
    """`tools.shell` as the hook's argument gives it (ShellToolSettings.model_dump_json)."""

    enabled: bool
    allow: tuple[str, ...]
    trust_agent_code: bool

    @classmethod
    def from_json(cls, text: str) -> Rules:
        settings = json.loads(text)
        return cls(enabled=settings["enabled"] is True, allow=tuple(str(a) for a in settings["allow"]),
                   trust_agent_code=settings["trust_agent_code"] is True)


def refusal(command: str, rules: Rules) -> str | None:
    """Why kiro refuses Codex's shell command, or None when it may run."""
    patch = APPLY_PATCH.fullmatch(command)
    if patch is not None and patch["end"] not in patch["body"].split("\n"):
        return None
    try:
        permitted(command, rules)
    except Refused as exc:
        return str(exc)
    return None


def main(argv: list[str]) -> int:
    """Exit 0 lets Codex run the command; 2 refuses it, the reason on stderr."""
    rules = Rules.from_json(argv[1])
    try:
        command = json.load(sys.stdin)["tool_input"]["command"]
    except (ValueError, KeyError, TypeError):
        print("kiro cannot tell which command this runs", file=sys.stderr)
        return 2
    why = refusal(command, rules) if isinstance(command, str) else "kiro cannot tell which command this runs"
    if why is None:
        return 0
    print(f"kiro refused this command: {why}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
