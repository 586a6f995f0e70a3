"""Codex's PreToolUse hook that puts kiro's `tools.shell` rules on codex-acp's commands out of kiro's box.

In its `read-only` mode codex-acp asks kiro about every edit, but runs a command in Codex's own
read-only sandbox without asking: that sandbox reads every file the user can (`~/.ssh` included), and
Codex cannot be told otherwise without the person's config.toml (restricted reads need a permission
profile, which codex-acp only offers from the config files). What it does offer is `CODEX_CONFIG`'s
`hooks`, passed to the App Server as `-c hooks=...`: a hook of the invocation only, trusted by its
`hooks.state` hash in the same flag (Codex's session-flags layer), never written to `~/.codex`.

Codex runs the hook before each shell command (`tool_name` "Bash", `tool_input.command`); exit 2 with a
reason on stderr refuses it, and the model reads the reason. The rule is kiro's own agent's
(kiro.executors.tools.shell.permitted: `tools.shell` enabled, the command on its allow-list), and as
Codex runs the command through a shell, no expansion or second line either. The one exception is
`apply_patch` with a quoted heredoc, which Codex turns into an edit it asks kiro about (kiro answers by
its path rules: kiro.executors.acp).

    python -m kiro.executors.agents.codex_hook SETTINGS_JSON < hook-input.json
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import sys

from kiro.executors.tools.errors import ToolError
from kiro.executors.tools.shell import permitted
from kiro.store.config import ShellToolSettings

MATCHER = "^Bash$"  # Codex's name for its shell tools in hooks
TIMEOUT_SECONDS = 30
# Codex's own edit form: one `apply_patch` of one quoted heredoc, nothing after it
APPLY_PATCH = re.compile(r"apply_patch <<'(?P<end>[A-Za-z_]+)'\n(?P<body>.*)\n(?P=end)\n?", re.DOTALL)


def refusal(command: str, settings: ShellToolSettings) -> str | None:
    """Why kiro refuses Codex's shell command, or None when it may run."""
    patch = APPLY_PATCH.fullmatch(command)
    if patch is not None and patch["end"] not in patch["body"].split("\n"):
        return None
    try:
        permitted(command, settings)
    except ToolError as exc:
        return str(exc)
    return None


def codex_config(settings: ShellToolSettings) -> dict[str, object]:
    """codex-acp's CODEX_CONFIG: this hook for every shell command, trusted by its hash."""
    # Codex runs a command that fails otherwise (exit 1: kiro cannot start) as if the hook allowed it
    command = f"{shlex.quote(sys.executable)} -m {__name__} {shlex.quote(settings.model_dump_json())} || exit 2"
    handler = {"type": "command", "command": command, "timeout": TIMEOUT_SECONDS, "async": False}
    # Codex trusts a hook whose identity (its event, matcher and handler as sorted compact JSON) hashes so
    identity = {"event_name": "pre_tool_use", "matcher": MATCHER, "hooks": [handler]}
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    key = "/<session-flags>/config.toml:pre_tool_use:0:0"  # its first group's first handler, given with -c
    return {"hooks": {"PreToolUse": [{"matcher": MATCHER, "hooks": [handler]}],
                      "state": {key: {"trusted_hash": f"sha256:{digest}", "enabled": True}}}}


def main(argv: list[str]) -> int:
    """Exit 0 lets Codex run the command; 2 refuses it, the reason on stderr."""
    settings = ShellToolSettings.model_validate_json(argv[1])
    try:
        command = json.load(sys.stdin)["tool_input"]["command"]
    except (ValueError, KeyError, TypeError):
        print("kiro cannot tell which command this runs", file=sys.stderr)
        return 2
    why = refusal(command, settings) if isinstance(command, str) else "kiro cannot tell which command this runs"
    if why is None:
        return 0
    print(f"kiro refused this command: {why}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
