"""opencode (`npm install -g opencode-ai`), run headless with `opencode run`.

- The prompt goes on stdin; `--format json` prints JSONL events as parts finish (`step_start`,
  `text`, `tool_use`, `step_finish` with that model call's `tokens` and `cost`, `error`).
- `--auto` approves the permissions that are not explicitly denied (edits, shell, a task file
  outside the project): without it a permission that asks is refused in a headless run.
- `--title` names the session, which also saves the model call opencode spends to title it.
- Endpoint and auth: a provider in opencode's config (`$OPENCODE_CONFIG`, `opencode.json` in the
  project, or `~/.config/opencode/opencode.json`), e.g. any OpenAI-compatible server with
  `"npm": "@ai-sdk/openai-compatible"` and `options.baseURL`; keys from `opencode auth login` or
  `{env:VAR}` in the config; `--model provider/model` or `model` in the config. Costs come from the
  model's `cost` in the config (or models.dev); kiro falls back to `llm.prices[<model>]`.
- An unknown or bad flag makes it print its usage text and exit 1, with no error line of its own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kiro.executors.agents import (
    Failure,
    FailureKind,
    Invocation,
    Preset,
    clean,
    env_folder,
    error_line,
    json_lines,
    last_line,
    tail,
)
from kiro.executors.base import Usage

_AUTH = re.compile(r"\b401\b|\b403\b|api key|unauthori[sz]ed|authentication|not authenticated|credentials", re.I)
_RATE = re.compile(r"\b429\b|rate[ _-]?limit|too many requests|quota|overloaded", re.I)
_USAGE_HEAD = "opencode run [message..]"


XDG = (("XDG_CONFIG_HOME", ".config"), ("XDG_DATA_HOME", ".local/share"), ("XDG_STATE_HOME", ".local/state"),
       ("XDG_CACHE_HOME", ".cache"))


class OpencodePreset(Preset):
    name = "opencode"
    program = "opencode"
    install = "npm install -g opencode-ai"
    command = "opencode run --format json --auto"
    idle_timeout_seconds = 600.0
    env_keys = ("OPENCODE_CONFIG", "OPENCODE_CONFIG_CONTENT", "OPENAI_API_KEY", "ANTHROPIC_API_KEY")

    def template(self) -> list[str]:
        return [*super().template(), "--title", "kiro {step_id}"]

    def env(self, inv: Invocation) -> dict[str, str]:
        return {"NO_COLOR": "1", "OPENCODE_DISABLE_AUTOUPDATE": "true"}

    def home_paths(self, env: Mapping[str, str]) -> list[Path]:
        """Its folders under the XDG base directories: config, data (auth, sessions), state, cache."""
        found = [env_folder(env, variable, default) for variable, default in XDG]
        return [folder / "opencode" for folder in found if folder is not None]

    def parse_usage(self, stdout: str) -> Usage | None:
        total = Usage()
        found = priced = False
        model = None
        for event in json_lines(stdout):
            part = event.get("part")
            if not isinstance(part, dict):
                continue
            if event.get("type") != "step_finish" or not isinstance(part.get("tokens"), dict):
                continue
            found = True
            tokens: dict[str, Any] = part["tokens"]
            cache: dict[str, Any] = tokens["cache"] if isinstance(tokens.get("cache"), dict) else {}
            prompt = int(tokens.get("input") or 0) + int(cache.get("read") or 0) + int(cache.get("write") or 0)
            completion = int(tokens.get("output") or 0) + int(tokens.get("reasoning") or 0)
            cost = float(part.get("cost") or 0.0)
            priced = priced or cost > 0
            total.add(Usage(prompt_tokens=prompt, completion_tokens=completion,
                                total_tokens=int(tokens.get("total") or prompt + completion), api_calls=1,
                                cost_usd=cost))
            model = model or part.get("modelID")
        if not found:
            return None
        if not priced:
            name = model if isinstance(model, str) else self._model()
            price = self.config.llm.prices.get(name) if name else None
            if price is None and name and "/" in name:
                price = self.config.llm.prices.get(name.split("/", 1)[1])
            if price is not None:
                total.cost_usd = (total.prompt_tokens * price.input_per_1m
                                  + total.completion_tokens * price.output_per_1m) / 1_000_000
        return total

    def _model(self) -> str | None:
        argv = self.template()
        for i, arg in enumerate(argv):
            if arg in ("-m", "--model") and i + 1 < len(argv):
                return argv[i + 1]
        return None

    @staticmethod
    def _errors(stdout: str) -> list[str]:
        """The errors it reported and did not get past: a model step that finished after an error
        (opencode retried and went on) clears the ones before it."""
        found: list[str] = []
        for event in json_lines(stdout):
            if event.get("type") == "step_finish":
                found = []
                continue
            if event.get("type") != "error":
                continue
            err = event.get("error")
            if isinstance(err, dict):
                data: dict[str, Any] = err["data"] if isinstance(err.get("data"), dict) else {}
                message = data.get("message") or err.get("message") or err.get("name")
                status = data.get("statusCode")
                if isinstance(message, str):
                    found.append(f"{err.get('name', 'Error')}: {message}" + (f" (HTTP {status})" if status else ""))
            elif isinstance(err, str):
                found.append(err)
        return found

    def classify_failure(self, exit_code: int | None, stdout: str, stderr: str) -> Failure | None:
        errors = self._errors(stdout)
        if exit_code == 0 and not errors:
            return None
        err_text = clean(stderr).strip()
        if not errors and err_text.startswith(_USAGE_HEAD) and not list(json_lines(stdout)):
            return Failure("usage_error", f"opencode printed its usage text ({_USAGE_HEAD}): an unknown option "
                                          f"or a bad value in its command line")
        line = (clean(errors[-1]).strip().splitlines() or [""])[0][:300] if errors else None
        line = line or error_line(stderr) or last_line(stderr) or last_line(stdout) or f"exit status {exit_code}"
        kind: FailureKind
        if _AUTH.search(line):
            kind = "auth_error"
        elif _RATE.search(line):
            kind = "rate_limit"
        else:
            kind = self.kind_of(exit_code, f"{stderr}\n{line}", line)
        return Failure(kind, line)

    def summary(self, stdout: str, stderr: str, prompt: str) -> str:
        errors = self._errors(stdout)
        if errors:
            return tail(clean(errors[-1]))
        said = [str(e["part"]["text"]) for e in json_lines(stdout) if e.get("type") == "text"
                and isinstance(e.get("part"), dict) and isinstance(e["part"].get("text"), str)]
        if said:
            return tail(clean(said[-1]))
        return super().summary("" if stdout.lstrip().startswith("{") else stdout, stderr, prompt)
