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
- Credentials, per provider (its bundle merges them in this order, the last winning): the provider's
  key variable from models.dev (ANTHROPIC_API_KEY ...), then `opencode auth login` entries in
  `$XDG_DATA_HOME/opencode/auth.json` (`~/.local/share/opencode/auth.json`; an API key or an OAuth
  login), then opencode.json's provider options. A login there is never passed over for a variable.
- An unknown or bad flag makes it print its usage text and exit 1, with no error line of its own.
- A failed model call (a 429, a 5xx) it retries itself, five times, each after the server's
  `retry-after` however long (its bundle caps the wait at 2^31 ms, and no setting caps the retries),
  with nothing printed meanwhile. kiro loads a plugin of its own into it (`opencode_retry.js`, through
  `OPENCODE_CONFIG_CONTENT`'s `plugin`, merged with the person's) that prints each retry as a
  `session.status` line; a retry that waits more than `LONG_RETRY_SECONDS` ends the attempt at once as
  a usage-limit wait until that time, rather than the idle timeout's failure hours later.
- What kiro reads for a failure (never the model's text: its `text` parts): the exit code, stderr, and
  opencode's own `error` events (with the HTTP status and response headers it reports), and kiro's
  plugin's `session.status` lines.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kiro.executors.agents import (
    Credential,
    Failure,
    FailureKind,
    Invocation,
    Preset,
    ToolCall,
    clean,
    env_folder,
    epoch,
    error_line,
    json_lines,
    last_line,
    read_json,
    shown,
    tail,
    tool_call,
)
from kiro.executors.base import Usage

_AUTH = re.compile(r"\b401\b|\b403\b|api key|unauthori[sz]ed|authentication|not authenticated|credentials", re.I)
_RATE = re.compile(r"\b429\b|rate[ _-]?limit|too many requests|quota|overloaded", re.I)
_USAGE_HEAD = "opencode run [message..]"
_LIMIT_BODY = re.compile(r"UsageLimitError|usage_limit_reached|usage limit", re.I)


PLUGIN = Path(__file__).with_name("opencode_retry.js")
LONG_RETRY_SECONDS = 60.0  # opencode's own backoff without a retry-after stops at 30 s: longer is the server's


def _config_content(given: str | None) -> str:
    """OPENCODE_CONFIG_CONTENT with kiro's retry plugin added to the person's own (a JSON object, whose
    `plugin` list opencode merges with its other configs'); a value that is not one is kept as it is
    (opencode reads it, kiro gets no retry notice)."""
    spec = PLUGIN.as_uri()
    try:
        config = json.loads(given) if given else {}
    except ValueError:
        return given or ""
    if not isinstance(config, dict):
        return given or ""
    plugins = config.get("plugin")
    config["plugin"] = [*(plugins if isinstance(plugins, list) else []), spec]
    return json.dumps(config)


XDG = (("XDG_CONFIG_HOME", ".config"), ("XDG_DATA_HOME", ".local/share"), ("XDG_STATE_HOME", ".local/state"),
       ("XDG_CACHE_HOME", ".cache"))


class OpencodePreset(Preset):
    name = "opencode"
    program = "opencode"
    install = "npm install -g opencode-ai"
    command = "opencode run --format json --auto"
    idle_timeout_seconds = 600.0
    env_prefixes = ("OPENCODE_", "OPENAI_", "ANTHROPIC_")
    env_keys = ("OPENCODE_CONFIG", "OPENCODE_CONFIG_CONTENT", "OPENAI_API_KEY", "ANTHROPIC_API_KEY")

    def login(self, env: Mapping[str, str]) -> str | None:
        data_home = Path(env["XDG_DATA_HOME"]) if env.get("XDG_DATA_HOME") else Path(
            env.get("HOME") or Path.home(), ".local", "share")
        path = data_home / "opencode" / "auth.json"
        data = read_json(path)
        if not isinstance(data, dict) or not data:
            return None
        kinds = [f"{name} ({entry.get('type')})" for name, entry in sorted(data.items()) if isinstance(entry, dict)]
        return f"opencode auth login for {', '.join(kinds)} in {shown(path, env)}"

    def keys_over_login(self, env: Mapping[str, str]) -> list[str]:
        return []  # its auth.json entries win over the variables

    def credential(self, env: Mapping[str, str]) -> Credential:
        login = self.login(env)
        if login is not None:
            return Credential("login", login)
        keys = [name for name in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY") if env.get(name)]
        if keys:
            return Credential("api_key", f"{' / '.join(keys)} (the model's provider picks)")
        return Credential("unknown", "takes its credential from its opencode.json provider config")

    def template(self) -> list[str]:
        return [*super().template(), "--title", "kiro {step_id}"]

    def env(self, inv: Invocation) -> dict[str, str]:
        return {"NO_COLOR": "1", "OPENCODE_DISABLE_AUTOUPDATE": "true",
                "OPENCODE_CONFIG_CONTENT": _config_content(os.environ.get("OPENCODE_CONFIG_CONTENT"))}

    def read_paths(self, env: Mapping[str, str]) -> list[Path]:
        """Also kiro's retry plugin, which an install under $HOME (pipx) would have hidden in the box."""
        return [*super().read_paths(env), PLUGIN]

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

    tool_marker = '"tool_use"'

    def tool_calls(self, event: dict[str, Any]) -> list[ToolCall]:
        """`--format json`: a `tool_use` event as each tool part finishes (`part.tool`, `part.state.input`)."""
        part = event.get("part")
        if event.get("type") != "tool_use" or not isinstance(part, dict):
            return []
        state = part.get("state")
        found = tool_call(part.get("tool"), state.get("input") if isinstance(state, dict) else None)
        return [found] if found is not None else []

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
        line = line or error_line(stderr) or last_line(stderr) or f"exit status {exit_code}"  # not stdout: the model's
        kind: FailureKind
        if _AUTH.search(line):
            kind = "auth_error"
        elif _RATE.search(line):
            kind = "rate_limit"
        else:
            kind = self.kind_of(exit_code, f"{stderr}\n{line}", line)
        return Failure(kind, line)

    def usage_limit(self, stdout: str, stderr: str) -> Failure | None:
        """opencode retries a 429 five times itself, each after the server's `retry-after`, then prints
        an `error` event with the status, the response headers and body. A 429 that still stands and
        says when to come back (`retry-after`, or opencode's own Go/Free usage limits) is a usage
        limit, reset at the event's time plus that wait."""
        last = None
        for event in json_lines(stdout):
            if event.get("type") == "step_finish":
                last = None
            elif event.get("type") == "error":
                last = event
        err = last.get("error") if last is not None else None
        data = err.get("data") if isinstance(err, dict) else None
        if not isinstance(data, dict) or data.get("statusCode") != 429:
            return None
        headers = data.get("responseHeaders") if isinstance(data.get("responseHeaders"), dict) else {}
        assert isinstance(headers, dict) and last is not None
        wait = None
        for key, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
            try:
                wait = float(headers[key]) / scale
                break
            except (KeyError, TypeError, ValueError):
                continue
        if wait is None and not _LIMIT_BODY.search(str(data.get("responseBody") or "")):
            return None
        line = (self._errors(stdout) or ["opencode: usage limit (HTTP 429)"])[-1]
        stamp = epoch(last["timestamp"] / 1000) if isinstance(last.get("timestamp"), int | float) else None
        resets = epoch(stamp.timestamp() + wait) if stamp is not None and wait is not None else None
        return Failure("usage_limit", clean(line).strip().splitlines()[0][:300], resets)

    def fatal_line(self, line: str) -> Failure | None:
        """kiro's plugin's line for a retry opencode has just put off (`session.status`, status `retry`
        with `next`, ms since 1970): one that waits more than LONG_RETRY_SECONDS (a server's retry-after
        of hours) is a usage limit until that time; kiro ends the attempt now and sleeps until then."""
        if '"session.status"' not in line:
            return None
        for event in json_lines(line):
            status = event.get("status")
            if event.get("type") != "session.status" or not isinstance(status, dict) or status.get("type") != "retry":
                continue
            nxt, now = status.get("next"), event.get("timestamp")
            if not isinstance(nxt, int | float) or not isinstance(now, int | float):
                continue
            when = epoch(nxt / 1000)
            if when is None or (nxt - now) / 1000 <= LONG_RETRY_SECONDS:
                continue
            said = clean(str(status.get("message") or "a failed model call")).strip().splitlines() or [""]
            return Failure("usage_limit", f"opencode retries at {when:%H:%M:%S} UTC: {said[0][:240]}", when)
        return None

    def summary(self, stdout: str, stderr: str, prompt: str) -> str:
        errors = self._errors(stdout)
        if errors:
            return tail(clean(errors[-1]))
        said = [str(e["part"]["text"]) for e in json_lines(stdout) if e.get("type") == "text"
                and isinstance(e.get("part"), dict) and isinstance(e["part"].get("text"), str)]
        if said:
            return tail(clean(said[-1]))
        return super().summary("" if stdout.lstrip().startswith("{") else stdout, stderr, prompt)
