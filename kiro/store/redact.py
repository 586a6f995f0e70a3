"""The one redactor: every byte kiro writes or sends passes through it first.

A loop builds one `Redactor` when it starts (`Redactor.for_run(config)`) and owns it:
`Loop.redact`, and `StepContext.redact` for executors. Use `redact.text(s) -> str` on any text
and `redact.data(obj)` on JSON-like data before it reaches a file, a log, a prompt, a report, a
transcript or a network peer. The shared write points already do (the event log, the state store,
reports, the prompt file, transcripts); new writers (attempt logs, servers) call it too. Every line
printed for a person passes `kiro.views.console.clean` (the environment's secrets, the loops', the
config resolved last in the process, and `written_in` the line itself).

What it knows as secret, collected once per run:
  * the value of every environment variable whose NAME looks like a credential (`..._KEY`,
    `..._TOKEN`, `..._SECRET`, `PASSWORD`, `CREDENTIAL`, `AUTH`, ...);
  * every environment value that LOOKS like a credential whatever its name (`sk-...`, `ghp_...`,
    `github_pat_...`, `xoxb-...`, `AKIA...`, `glpat-...`, `AIza...`, JWTs);
  * the value of the variable `llm.api_key_env` names, whatever that name is;
  * passwords in URLs (`llm.base_url`, `OPENAI_BASE_URL`, any `scheme://user:pass@host` value in
    the environment or the config's commands), and `?token=`/`?key=`-like query values;
  * credentials written into configured commands (`on_event`, `executor_command`, `verify`):
    `Authorization: Bearer X`, `--token X`, `--password=X`, `API_KEY=X`;
  * the values of the variables the config lists under `secret_env`;
  * the `notify` URLs (Apprise: `tgram://BOT_TOKEN/CHAT_ID`, `ntfy://user:pass@TOPIC`), whole and each
    part of them but the scheme and a host name (`notify_secrets`).

Values shorter than 8 characters are skipped (they would mangle ordinary text), except that a
short URL password is still cut in its `user:password@` form. Each secret is also matched in its
JSON-escaped and URL-encoded forms. Matching is one compiled alternation, longest first. Every scan
is linear in its input: a megabyte-long command or environment value costs milliseconds.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any, Protocol
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from kiro import jsonl


class _Llm(Protocol):
    @property
    def api_key_env(self) -> str: ...
    @property
    def base_url(self) -> str | None: ...


class RunConfig(Protocol):
    """What the redactor reads of a loop's config (kiro.store.config.Config), named here so that the
    config may use the redactor for its own error lines without an import circle."""

    @property
    def llm(self) -> _Llm: ...
    @property
    def secret_env(self) -> list[str]: ...
    @property
    def on_event(self) -> dict[str, str]: ...
    @property
    def executor_command(self) -> str | None: ...
    @property
    def verify(self) -> str | None: ...
    @property
    def notify(self) -> list[str]: ...

REDACTED = "[REDACTED]"
MIN_SECRET_LENGTH = 8  # shorter values ("", "1", "true") would mangle ordinary text if redacted
SECRET_NAME_PARTS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "AUTH",
                     "PRIVATE", "COOKIE", "SESSION")

# Well-known credential formats: a value like this is a secret under any variable name. One list for
# the two patterns below: a whole value, and a whole word inside a line of text. Each format is the text it
# starts with and the pattern of the rest: a value or a line holding none of those starts cannot match, and is
# not looked at with the pattern (compiling the two was ~6 M instructions of every loop's start; issue #41).
_FORMATS = (("sk-", r"[A-Za-z0-9_\-]{16,}+"), *((f"sk_{mode}_", r"[A-Za-z0-9]{16,}+") for mode in ("live", "test")),
            *((f"gh{kind}_", r"[A-Za-z0-9]{20,}+") for kind in "pousr"), ("github_pat_", r"[A-Za-z0-9_]{20,}+"),
            ("xox", r"[abposr]-[A-Za-z0-9\-]{10,}+"), ("AKIA", r"[0-9A-Z]{16}"), ("glpat-", r"[A-Za-z0-9_\-]{16,}+"),
            ("AIza", r"[0-9A-Za-z_\-]{30,}+"),
            ("eyJ", r"[A-Za-z0-9_\-]{8,}+\.[A-Za-z0-9_\-]{8,}+\.[A-Za-z0-9_\-]{8,}+"))
_STARTS = tuple(start for start, _ in _FORMATS)
_ANY_FORMAT = "|".join(re.escape(start) + rest for start, rest in _FORMATS)
# Each pattern is compiled where it is first used, not at import (functools.cache): Python compiles a
# regex in Python code, and a read command that never looks at a command line pays for none of these.


@functools.cache
def _token_formats() -> re.Pattern[str]:
    return re.compile(r"^(?:" + _ANY_FORMAT + r")$")


@functools.cache
def _token_words() -> re.Pattern[str]:
    return re.compile(r"(?<![A-Za-z0-9_\-])(?:" + _ANY_FORMAT + r")(?![A-Za-z0-9_\-])")


# Every pattern here is linear in its input (issue #27 item 12: a 40 KB value cost seconds on every
# command): a match may start only where a run of its characters starts (the lookbehinds), and the
# run is taken whole (`*+`, `++`), never given back a character at a time.
@functools.cache
def _url() -> re.Pattern[str]:
    """A URL: the first letter of a run of scheme characters, the run, `://`, the rest up to a space or quote."""
    return re.compile(r"(?<![A-Za-z0-9+.\-])[0-9+.\-]*+([A-Za-z][A-Za-z0-9+.\-]*+://[^\s'\"<>]++)")


@functools.cache
def _secret_query() -> re.Pattern[str]:
    return re.compile(r"(?i)(token|key|secret|password|passwd|sig|signature|auth|credential)")


@functools.cache
def _in_command() -> tuple[re.Pattern[str], re.Pattern[str], re.Pattern[str], re.Pattern[str]]:
    """Credentials written into a command line: `Bearer X`, `--token X`, `--password=X`, `API_KEY=X`. The
    name is found first (the first pattern), then its value (the last) when the name says secret (the
    option's name by the second, an assignment's by the third)."""
    return (re.compile(r"(?i)\b(?:bearer|basic)\s++"
                       r"|(?<![\w\-])(--?[a-z0-9_\-]*+)(?:=|\s++)"
                       r"|(?<!\w)([a-z0-9_]++)="),
            re.compile(r"(?i)token|key|secret|pass|auth"),
            re.compile(r"(?i)token|key|secret|password|passwd|auth"),
            re.compile(r"['\"]?([^\s'\"&;|]+)"))


def looks_secret(name: str) -> bool:
    """True for an environment variable name that by convention holds a credential."""
    upper = name.upper()
    return any(part in upper for part in SECRET_NAME_PARTS)


def looks_like_token(value: str) -> bool:
    """True for a value in a well-known credential format (OpenAI, GitHub, Slack, AWS, GitLab, Google, JWT)."""
    value = value.strip()
    return value.startswith(_STARTS) and _token_formats().match(value) is not None


def url_secrets(text: str) -> tuple[list[str], list[str]]:
    """Credentials inside the URLs of `text`: (secret values, literal `user:password@` forms)."""
    values: list[str] = []
    forms: list[str] = []
    for match in _url().finditer(text):
        try:
            parts = urlsplit(match.group(1))
            password = parts.password
            query = parse_qsl(parts.query, keep_blank_values=False)
        except ValueError:
            continue
        if password:
            values.extend({password, unquote(password)})
            userinfo = parts.netloc.rpartition("@")[0]
            if userinfo:
                forms.append(userinfo + "@")
        for key, value in query:
            if _secret_query().search(key):
                values.append(value)
    return values, forms


def command_secrets(text: str) -> list[str]:
    """Credentials written into a command line (`Authorization: Bearer X`, `--token X`, `KEY=X`)."""
    found: list[str] = []
    pos = 0
    in_command, option_says_secret, assignment_says_secret, command_value = _in_command()
    while (name := in_command.search(text, pos)) is not None:
        pos = name.end()
        option, assigned = name.group(1), name.group(2)
        if option is not None and not option_says_secret.search(option):
            continue
        if assigned is not None and not assignment_says_secret.search(assigned):
            continue
        value = command_value.match(text, pos)
        if value is not None:
            found.append(value.group(1))
            pos = value.end()
    return found + url_secrets(text)[0]


@functools.cache
def _url_parts() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """What splits a URL into parts, and a part that is a host name or a number (ntfy.sh, 127.0.0.1, a port)."""
    return re.compile(r"[/:@?&=#]+"), re.compile(r"^(?:[A-Za-z0-9\-]+\.)+[A-Za-z0-9\-]+$|^\d+$")


def notify_secrets(url: str) -> list[str]:
    """A notify URL's secrets: the whole URL and each part of it (split at `/ : @ ? & = #`) but its scheme,
    dotted host names and numbers; an Apprise URL keeps its tokens anywhere (Telegram's bot token is where a
    host would be, ntfy's topic is a path)."""
    scheme, sep, rest = url.partition("://")
    splitter, host_name = _url_parts()
    parts = [p for p in splitter.split(rest if sep else url) if p and not host_name.match(p)]
    return [url, *parts, *url_secrets(url)[0]]


def written_in(text: str) -> Redactor | None:
    """A redactor for the secrets `text` itself shows to be secrets: the password of a URL in it
    (`scheme://user:password@host`) and words in a well-known credential format; None when there is
    none. For lines printed before, or without, a run's redactor (a config error echoing a value)."""
    values: list[str] = []
    if any(start in text for start in _STARTS):
        values = _token_words().findall(text)  # the whole words: the pattern has no group
    forms: list[str] = []
    if "://" in text and "@" in text:
        found, forms = url_secrets(text)
        values += found
    return Redactor(values, forms) if values or forms else None


class Redactor:
    """Replaces known secret values with `[REDACTED]` in text kiro is about to write or send.

    `text(s)` (also `redactor(s)`) returns `s` with every secret cut; `data(obj)` does the same to
    every string inside dicts, lists and tuples; `contains_secret(s)` tells whether there is one.
    Cheap when there is nothing to cut: one search of one compiled pattern.
    """

    def __init__(self, secrets: Iterable[str] = (), literal_forms: Iterable[str] = ()) -> None:
        self.secrets: frozenset[str] = frozenset(s for s in secrets if s and len(s) >= MIN_SECRET_LENGTH)
        self.literal_forms: frozenset[str] = frozenset(f for f in literal_forms if f and len(f) >= 4)
        forms: set[str] = set(self.literal_forms)
        for s in self.secrets:
            forms.add(s)
            forms.add(json.dumps(s)[1:-1])
            forms.add(json.dumps(s, ensure_ascii=False)[1:-1])
            forms.add(quote(s, safe=""))
        self._pattern = re.compile(_trie_pattern(forms)) if forms else None

    # -- building ------------------------------------------------------------------------------

    @classmethod
    def from_environment(cls, api_key: str | None, environ: Mapping[str, str] | None = None) -> Redactor:
        """The environment's secrets (by name and by format) plus `api_key`."""
        env = os.environ if environ is None else environ
        values, forms = _environment_secrets(env)
        if api_key:
            values.append(api_key)
        return cls(values, forms)

    @classmethod
    def for_run(cls, config: RunConfig, environ: Mapping[str, str] | None = None) -> Redactor:
        """Everything one run knows as secret (see the module docstring). Built once per loop; loops
        of one config in one environment (a thousand started together) share the one built last."""
        env = os.environ if environ is None else environ
        key = (env_key(env), config.llm.api_key_env, tuple(config.secret_env), config.llm.base_url,
               tuple(config.on_event.values()), config.executor_command, config.verify, tuple(config.notify))
        if _run_seen and _run_seen[0][0] == key:
            return _run_seen[0][1]
        made = cls._for_run(config, env)
        _run_seen[:] = [(key, made)]
        return made

    @classmethod
    def _for_run(cls, config: RunConfig, env: Mapping[str, str]) -> Redactor:
        values, forms = _environment_secrets(env)
        key = env.get(config.llm.api_key_env)
        if key:
            values.append(key)
        for name in config.secret_env:
            value = env.get(name)
            if value:
                values.append(value)
        for url in (config.llm.base_url, env.get("OPENAI_BASE_URL")):
            if url:
                found, literal = url_secrets(url)
                values.extend(found)
                forms.extend(literal)
        for command in (*config.on_event.values(), config.executor_command, config.verify):
            if command:
                values.extend(command_secrets(command))
                forms.extend(url_secrets(command)[1])
        for url in config.notify:
            values.extend(notify_secrets(url))
            forms.extend(url_secrets(url)[1])
        return cls(values, forms)

    def __or__(self, other: Redactor | None) -> Redactor:
        """One redactor that cuts what either cuts; one of the two when it already knows everything
        the other does (an attempt's `loop's | executor's`, the same every attempt: no new pattern)."""
        if other is None or other is self:
            return self
        if other.secrets <= self.secrets and other.literal_forms <= self.literal_forms:
            return self
        if self.secrets <= other.secrets and self.literal_forms <= other.literal_forms:
            return other
        return Redactor(self.secrets | other.secrets, self.literal_forms | other.literal_forms)

    # -- using ---------------------------------------------------------------------------------

    def text(self, text: str) -> str:
        if self._pattern is None or not text:
            return text
        return self._pattern.sub(REDACTED, text)

    __call__ = text

    def data(self, value: Any) -> Any:
        """`value` with every string inside it (keys too) redacted; other values unchanged."""
        if self._pattern is None:
            return value
        if isinstance(value, dict | list | tuple):
            return self._searched(value)[0]
        return self._walk(value)

    def record(self, record: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        """(`data(record)`, the record's JSON line as `json.dumps(record, ensure_ascii=False,
        default=str)` writes it, when that was made to look for a secret and holds none; else None):
        an event is dumped once for the search and the log (kiro.store.events.EventLog.append_record)."""
        if self._pattern is None:
            return record, None
        return self._searched(record)

    def _searched(self, value: Any) -> tuple[Any, str | None]:
        """One search over the whole value's JSON (most records hold no secret): (value, its JSON)
        when it holds none, else (the value walked, None)."""
        assert self._pattern is not None
        try:
            text = jsonl.line(value)
        except (TypeError, ValueError):
            return self._walk(value), None
        if not self._pattern.search(text):
            return value, text
        return self._walk(value), None

    def _walk(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self._walk(k): self._walk(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(self._walk(v) for v in value)
        return value

    def contains_secret(self, text: str) -> bool:
        return bool(self._pattern and self._pattern.search(text))


def _trie_pattern(words: Iterable[str]) -> str:
    """One regex for a set of literals, as a trie (`tok-(?:a1|b2)`), so a position that starts no
    secret is rejected after one character instead of after trying every secret in turn. Longer
    matches win: at each node the branches are tried before the end of a shorter secret."""
    trie: dict[str, Any] = {}
    for word in words:
        node = trie
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def build(node: dict[str, Any]) -> str:
        # A run of single-child nodes is one literal (no recursion per character: a long secret,
        # a private key, stays shallow).
        prefix = ""
        while len(node) == 1 and "" not in node:
            ch, node = next(iter(node.items()))
            prefix += re.escape(ch)
        ends = "" in node
        branches = [re.escape(ch) + build(child) for ch, child in sorted(node.items()) if ch]
        if not branches:
            return prefix
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        if ends:
            body = "(?:" + body + ")?"
        return prefix + body

    return build(trie)


_run_seen: list[tuple[tuple[Any, ...], Redactor]] = []  # the last run's redactor and what it was made of


def last_run() -> Redactor | None:
    """The redactor `Redactor.for_run` made last in this process (of the config resolved last), if any."""
    return _run_seen[0][1] if _run_seen else None

_env_seen: list[tuple[dict[Any, Any], list[str], list[str]]] = []  # the last environment scanned


def env_key(env: Mapping[str, str]) -> dict[Any, Any]:
    """What an environment holds, to compare with another (a copy: a dict compares in C, ~5x cheaper than
    a set of its items, and a shell step's environment is checked against it at every step);
    `os.environ` by its bytes (no decoding of every name and value: ~10x cheaper)."""
    data = getattr(env, "_data", None) if env is os.environ else None
    return dict(data if isinstance(data, dict) else env)


def _environment_secrets(env: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """The secrets in an environment; the same environment (a thousand loops started in one
    process) is scanned once."""
    key = env_key(env)
    if _env_seen and _env_seen[0][0] == key:
        return list(_env_seen[0][1]), list(_env_seen[0][2])
    values, forms = _scan_environment(env)
    _env_seen[:] = [(key, list(values), list(forms))]
    return values, forms


def _scan_environment(env: Mapping[str, str]) -> tuple[list[str], list[str]]:
    values: list[str] = []
    forms: list[str] = []
    for name, value in env.items():
        if not value:
            continue
        if looks_secret(name) or looks_like_token(value):
            values.append(value)
        if "://" in value and "@" in value:
            found, literal = url_secrets(value)
            values.extend(found)
            forms.extend(literal)
    return values, forms
