"""`opencode-acp`: opencode spoken to over ACP (kiro.executors.acp): `opencode acp` of the opencode
already installed (npm `opencode-ai`; 1.18). opencode's credentials, files and config come from the
opencode preset (kiro.executors.agents.opencode).

What it sends, seen against the scripted Chat Completions server (tests/agent_clis_codex_opencode_acp.py):

- `initialize`: protocol 1; `loadSession`, prompts with images and embedded context, MCP over HTTP
  and SSE, session list / fork / resume / close; one auth method, `opencode-login` (a terminal login).
  Its credentials are its config's, as for `opencode run`: no `authenticate`.
- `session/new`: config options for the model (every provider's, the configured one current) and
  the mode (`build`, `plan`).
- Each tool call is a `tool_call` (kind `read`, `edit`, `execute`, `search`, `other`; no locations
  yet), a `tool_call_update` `in_progress` with its `locations` and `rawInput`, then `completed` or
  `failed` with the output.
- Permissions: by default opencode asks for nothing (edits, shell, reads anywhere are allowed).
  kiro starts it with an `OPENCODE_CONFIG_CONTENT` layer (opencode loads it after the person's own
  opencode.json files) in which every permission is `ask`, so each one is a
  `session/request_permission` kiro answers (options `once`, `always`, `reject`):
  - `edit` / `write`: kind `edit`, the file in `locations`, the diff as content;
  - `bash`: kind `execute`, the command in `rawInput.command`, no locations;
  - `read`, `glob`, `grep`, `list`: kind `read` / `search`, with NO locations and an empty `rawInput`
    (the path is in the `tool_call_update` just before, of the same toolCallId);
  - `external_directory`: before any of these reaches outside the project (a read of ~/.ssh, a
    write to ../outside, a shell command naming such a path): kind `other`, the path and its folder
    in `locations`.
  With `experimental.continue_loop_on_deny` (also in that layer) a refused call fails
  ("The user rejected permission to use this specific tool call.") and the turn goes on; without
  it opencode ends its turn at the first refusal.
- Its file access: after kiro allows an edit it also sends the new text to the client's
  `fs/write_text_file` (when kiro offers `fs`), and its own edit tool writes the same file; it never
  calls `fs/read_text_file` or `terminal/*`.
- The turn's result has the LAST model call's tokens in `usage` (not the turn's sum); the session's
  cost so far comes in `usage_update.cost` (USD), sent only when the model's context limit is known
  (`limit.context` in its config, or models.dev).
- `session/cancel` ends the turn at once (`stopReason: cancelled`, ~0.1 s). A dead endpoint: it
  sends nothing more and never ends its turn (kiro's idle timeout ends the attempt).

- The mode: its ACP modes are its agents, `build` and `plan` (and any agent a person or the project
  defines, which may allow what it likes; `default_agent` may name one). kiro sets `build` with
  `session/set_mode` and holds `build` or `plan` (kiro.executors.acp.hold_mode), whose permissions the
  layer sets to `ask` too (`agent.<mode>.permission`).

What the layer cannot cover: a person's own rule for one tool that comes after `"*"` in their
opencode.json (opencode takes the last rule that matches, and merges layers key by key) is
overridden here only for the tools named below; plugins (`--pure` is not passed) are theirs.
"""

from __future__ import annotations

import json
import os
from typing import Any

from kiro.executors.agents import Invocation
from kiro.executors.agents.acp import AcpPreset
from kiro.executors.agents.opencode import OpencodePreset

# opencode's permissions (1.18): each one kiro answers
PERMISSIONS = ("*", "read", "edit", "write", "glob", "grep", "list", "bash", "task", "external_directory",
               "todowrite", "todoread", "webfetch", "websearch", "codesearch", "lsp", "skill", "doom_loop",
               "question")
MODES = ("build", "plan")  # its agents (ACP modes) kiro holds a session in; each asks for every permission
ASKING = dict.fromkeys(PERMISSIONS, "ask")
KIRO_LAYER: dict[str, Any] = {"permission": ASKING, "agent": {mode: {"permission": ASKING} for mode in MODES},
                              "experimental": {"continue_loop_on_deny": True}}
CONTENT_VAR = "OPENCODE_CONFIG_CONTENT"


def layer(person: str | None) -> str:
    """kiro's OPENCODE_CONFIG_CONTENT: the person's own (when it is a JSON object) with kiro's permissions,
    its modes' permissions and continue_loop_on_deny over it."""
    try:
        theirs = json.loads(person) if person else {}
    except ValueError:
        theirs = {}
    return json.dumps(_over(theirs if isinstance(theirs, dict) else {}, KIRO_LAYER))


def _over(theirs: dict[str, Any], mine: dict[str, Any]) -> dict[str, Any]:
    """`theirs` with each of `mine`'s values over it, objects merged key by key."""
    merged = dict(theirs)
    for key, value in mine.items():
        before = merged.get(key)
        merged[key] = _over(before, value) if isinstance(before, dict) and isinstance(value, dict) else value
    return merged


class OpencodeAcpPreset(AcpPreset, OpencodePreset):
    """opencode over ACP: opencode's credentials, files and config, `opencode acp`, every permission asked."""

    name = "opencode-acp"
    program = "opencode"
    install = "npm install -g opencode-ai"
    command = "opencode acp"
    asking_modes = MODES

    def env(self, inv: Invocation) -> dict[str, str]:
        return {**super().env(inv), CONTENT_VAR: layer(os.environ.get(CONTENT_VAR))}
