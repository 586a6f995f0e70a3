"""aider (PyPI `aider-chat`, best in its own virtual environment: `pipx install aider-chat`).

- Unattended: `--yes-always` answers every question; `--message-file {prompt_file}` runs one message
  and exits. The task file must be in aider's chat to be edited at all: `--file {task_file}`. That is
  the step's own copy under `.state/steps/`, which kiro keeps out of git (`.git/info/exclude`), and
  aider skips a git-ignored file ("matches gitignore spec") unless `--add-gitignore-files`.
- It edits files by its own edit formats (whole file, SEARCH/REPLACE blocks, diffs), chosen per
  model; kiro does not override that (`--edit-format` in agent_args does).
- Off for unattended runs: URL detection (`--no-detect-urls`: a URL in kiro's prompt made aider
  offer to download a browser and scrape it), Playwright (`--disable-playwright`), update checks,
  release notes, analytics, shell-command suggestions, model warnings (they ask a question), and
  its own git commits (`--no-auto-commits --no-dirty-commits`: kiro makes its checkpoints); it does
  not add `.aider*` to `.gitignore`, and its chat/input history go nowhere (the attempt log keeps
  the whole output).
- aider needs a git repository: without one it takes the folder of its chat files (the task
  file's, under Specs/) as its root, so the agent's files would land there (and with
  `--yes-always` it offers to `git init` the project and does). kiro refuses to start aider outside
  a repository and says so, unless `--no-git` is in agent_args.
- Endpoint: `--model openai/<name>` with `OPENAI_API_BASE` + `OPENAI_API_KEY` for any
  OpenAI-compatible server (Chat Completions), or any model litellm knows (`ANTHROPIC_API_KEY`,
  `GEMINI_API_KEY`, `ollama_chat/<name>` with `OLLAMA_API_BASE` ...); or `.aider.conf.yml`.
- Usage: one `Tokens: 2.4k sent, 37 received. Cost: $0.0052 message, $0.0052 session.` line per
  model call (aider rounds thousands to `1.2k`; cost only for models with a known price, e.g. via
  `--model-metadata-file`); kiro sums them, and prices tokens with `llm.prices[<model>]` when aider
  printed no cost.
- Failures: aider prints API errors (`litellm.AuthenticationError: ...`) and exits 0, so kiro reads
  its output; its argument errors are argparse's (`aider: error: unrecognized arguments: ...`, exit 2).
- What kiro reads for a failure: stderr (argparse), and the `litellm.<Kind>Error` line aider printed
  after the model's last answer, in a run aider ended itself (exit 0). aider prints the model's reply
  on the same stdout, each followed by its `Tokens:` line, so an error line before one is the model's
  (or retried away); a run cut short (killed) is a plain failure.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from kiro.errors import ExecutorError
from kiro.executors.agents import Credential, Failure, FailureKind, Invocation, Preset, clean, last_line, tail
from kiro.executors.base import Usage

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from kiro.store.config import Config

_TOKENS = re.compile(r"^Tokens: (?P<body>.*?)\."
                     r"(?: Cost: \$(?P<msg>[\d.]+) message, \$(?P<session>[\d.]+) session\.)?\s*$")
_COUNT = re.compile(r"(?P<n>[\d.]+)(?P<unit>[kKmM]?) (?P<what>sent|received|cache write|cache hit)")
_LITELLM = re.compile(r"^(?:litellm\.)?(?P<kind>[A-Za-z]+Error):\s*(?P<rest>.*)$")
_BILLING = re.compile(r"plan and billing|insufficient_quota|credit balance", re.I)
_FATAL_ARGS = re.compile(r"^aider: error: (?P<msg>.+)$")
# litellm's exception classes (what aider prints) -> kiro's failure kinds
_KINDS: dict[str, FailureKind] = {
    "AuthenticationError": "auth_error", "PermissionDeniedError": "auth_error",
    "RateLimitError": "rate_limit", "BadRequestError": "failure", "NotFoundError": "failure",
}


def _number(value: str, unit: str) -> int:
    scale = {"k": 1_000, "m": 1_000_000}.get(unit.lower(), 1)
    return round(float(value) * scale)


def in_git_repo(folder: Path) -> bool:
    """A `.git` (folder, or a worktree's file) in the folder or one above it."""
    folder = folder.resolve()
    return any((p / ".git").exists() for p in (folder, *folder.parents))


# in kiro's box, where /tmp is the step's own (AiderPreset.boxed_env)
BOXED_INDEX, BOXED_OBJECTS = "/tmp/kiro-aider-index", "/tmp"


def _git(env: Mapping[str, str], cwd: Path, *args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=cwd, env=dict(env), capture_output=True, text=True, timeout=10,
                              stdin=subprocess.DEVNULL).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


class AiderPreset(Preset):
    name = "aider"
    program = "aider"
    install = ("pipx install aider-chat  (or: python3 -m venv ~/.venvs/aider && "
               "~/.venvs/aider/bin/pip install aider-chat)")
    command = ("aider --yes-always --no-pretty --no-fancy-input --no-detect-urls --disable-playwright "
               "--no-check-update --no-show-release-notes --no-analytics --no-suggest-shell-commands "
               "--no-auto-commits --no-dirty-commits --no-gitignore --add-gitignore-files "
               "--no-show-model-warnings "
               "--chat-history-file /dev/null --input-history-file /dev/null "
               "--message-file {prompt_file} --file {task_file}")
    idle_timeout_seconds = 600.0
    env_prefixes = ("AIDER_", "OPENAI_", "ANTHROPIC_", "GEMINI_", "LITELLM_", "OLLAMA_")
    env_keys = ("OPENAI_API_BASE", "OPENAI_API_KEY", "AIDER_MODEL", "ANTHROPIC_API_KEY", "GEMINI_API_KEY")
    # its caches and analytics (~/.aider), and the settings it reads from $HOME
    home_files = (".aider", ".aider.conf.yml", ".aider.model.settings.yml", ".aider.model.metadata.json")

    def credential(self, env: Mapping[str, str]) -> Credential:
        """aider has no login: litellm takes the key variable of the model's provider."""
        keys = [name for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY") if env.get(name)]
        if keys:
            return Credential("api_key", f"{' / '.join(keys)} (the model's provider picks)")
        return Credential("unknown", "has no API key variable set (its .aider.conf.yml or .env may hold one)")

    def __init__(self, config: Config | None = None) -> None:
        super().__init__(config)
        self._argv: list[str] = []

    def argv(self, inv: Invocation, template: Sequence[str] | None = None) -> list[str]:
        argv = super().argv(inv, template)
        if Path(argv[0]).name == self.program and "--no-git" not in argv and not in_git_repo(inv.project_dir):
            # Without a repository aider takes the folder of its chat files (the task file's) as its
            # root, and the agent's files would land in Specs/...; with --yes-always it would instead
            # `git init` the project on its own.
            raise ExecutorError(
                f"aider needs the project in a git repository, and {inv.project_dir} is not in one: run "
                f"`git init` there (aider resolves the agent's paths from the repository root; kiro tells it "
                f"not to commit), or add --no-git to agent_args if the task file's folder is the project")
        self._argv = argv
        return argv

    def env(self, inv: Invocation) -> dict[str, str]:
        # no colours, and litellm's bundled price list instead of a download at every start
        return {"NO_COLOR": "1", "LITELLM_LOCAL_MODEL_COST_MAP": os.environ.get("LITELLM_LOCAL_MODEL_COST_MAP", "True")}

    def boxed_env(self, env: Mapping[str, str], project_dir: Path) -> dict[str, str]:
        """aider's git in kiro's box, where `.git` is read-only:
        - aider writes a git identity into the repository's `.git/config` when git has none (aider's
          main.py, `setup_git`), which the box refuses, and aider ends with a traceback. It commits
          nothing here (--no-auto-commits), so where git has no identity the box gives it one, as
          command-line config (`GIT_CONFIG_COUNT`), written nowhere;
        - aider `git add`s every file it creates, and `.git/index.lock` cannot be made there (the
          reply's edits were dropped): its index and new objects live in the box's private /tmp, the
          repository's objects read as alternates; gone with the step, kiro's repository untouched."""
        boxed: dict[str, str] = {}
        objects = _git(env, project_dir, "rev-parse", "--path-format=absolute", "--git-path", "objects")
        if objects:
            alternates = [objects, *filter(None, [env.get("GIT_ALTERNATE_OBJECT_DIRECTORIES")])]
            boxed.update({"GIT_INDEX_FILE": BOXED_INDEX, "GIT_OBJECT_DIRECTORY": BOXED_OBJECTS,
                          "GIT_ALTERNATE_OBJECT_DIRECTORIES": os.pathsep.join(alternates)})
        if "GIT_CONFIG_COUNT" in env or (_git(env, project_dir, "config", "--get", "user.name")
                                         and _git(env, project_dir, "config", "--get", "user.email")):
            return boxed
        return {**boxed, "GIT_CONFIG_COUNT": "2", "GIT_CONFIG_KEY_0": "user.name", "GIT_CONFIG_VALUE_0": "aider (kiro)",
                "GIT_CONFIG_KEY_1": "user.email", "GIT_CONFIG_VALUE_1": "aider@kiro.invalid"}

    def model(self) -> str | None:
        argv = self._argv or self.template()
        for i, arg in enumerate(argv):
            if arg == "--model" and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith("--model="):
                return arg.split("=", 1)[1]
        return os.environ.get("AIDER_MODEL")

    def parse_usage(self, stdout: str) -> Usage | None:
        total = Usage()
        found = priced = False
        for line in clean(stdout).splitlines():
            m = _TOKENS.match(line.strip())
            if m is None:
                continue
            found = True
            sent = received = 0
            for c in _COUNT.finditer(m["body"]):
                n = _number(c["n"], c["unit"])
                if c["what"] == "received":
                    received += n
                else:  # sent, and the cached parts of what was sent
                    sent += n
            cost = 0.0
            if m["msg"] is not None:
                priced = True
                cost = float(m["msg"])
            total.add(Usage(prompt_tokens=sent, completion_tokens=received, total_tokens=sent + received,
                                api_calls=1, cost_usd=cost))
        if not found:
            return None
        if not priced:
            model = self.model()
            price = self.config.llm.prices.get(model) if model else None
            if price is None and model and "/" in model:
                price = self.config.llm.prices.get(model.split("/", 1)[1])
            if price is not None:
                total.cost_usd = (total.prompt_tokens * price.input_per_1m
                                  + total.completion_tokens * price.output_per_1m) / 1_000_000
        return total

    @staticmethod
    def _api_error(stdout: str) -> tuple[FailureKind, str] | None:
        """The model-API error aider ended with (it reports them and exits 0): the last one after the
        model's last answer. aider prints the model's reply on the same stdout, always followed by that
        call's `Tokens:` line, so a `litellm.` line before a `Tokens:` line is the model's words or an
        error retried away, never read. Its message may be wrapped over two lines; they are joined."""
        lines = clean(stdout).splitlines()
        found: tuple[FailureKind, str] | None = None
        for i, raw in enumerate(lines):
            if _TOKENS.match(raw.strip()):
                found = None  # a later answer: the earlier error was retried away (or the model said it)
                continue
            m = _LITELLM.match(raw.strip())
            if m is None or not raw.strip().startswith("litellm."):
                continue
            text = raw.strip()
            if i + 1 < len(lines) and lines[i + 1].strip() and not lines[i + 1].startswith(("The API", "Retrying")):
                text += " " + lines[i + 1].strip()
            found = (_KINDS.get(m["kind"], "failure"), text[:300])
        return found

    def classify_failure(self, exit_code: int | None, stdout: str, stderr: str) -> Failure | None:
        """Its argument errors (stderr); the API error it ended a run with, read only when aider itself
        ended the run (exit 0): a run cut short (killed) may end in the middle of the model's reply. A
        RateLimitError is aider's after about a minute of its own retries (doubling waits): a usage
        limit, without a reset time (litellm prints none); a used-up balance ("check your plan and
        billing") does not reset and stays a failed attempt."""
        for raw in clean(stderr).splitlines():
            m = _FATAL_ARGS.match(raw.strip())
            if m is not None:
                return Failure("usage_error", raw.strip()[:300])
        if exit_code == 0:
            api = self._api_error(stdout)
            if api is None:
                return None
            kind, line = api
            if line.startswith("litellm.RateLimitError") and not _BILLING.search(line):
                kind = "usage_limit"
            return Failure(kind, line)
        line = last_line(stderr) or f"exit status {exit_code}"  # not stdout: the model's reply is printed there
        return Failure(self.kind_of(exit_code, f"{stderr}\n{line}", line), line)

    def summary(self, stdout: str, stderr: str, prompt: str) -> str:
        """What aider said after it read the message (its banner and the token lines left out)."""
        lines = clean(stdout).splitlines()
        start = 0
        for i, raw in enumerate(lines):
            if raw.startswith("Added ") and raw.rstrip().endswith("to the chat."):
                start = i + 1
        kept = [raw for raw in lines[start:] if not _TOKENS.match(raw.strip())]
        return tail("\n".join(kept)) or super().summary(stdout, stderr, prompt)
