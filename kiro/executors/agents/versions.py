"""The agent CLIs' versions for `kiro agents`: each installed CLI's `--version`, asked once per
executable, all at once, and kept in the user's cache (`$XDG_CACHE_HOME/kiro/agent-versions.json`, else
`~/.cache/kiro/...`).

A node CLI takes seconds to print its version, tens of seconds on a busy machine: asking eleven of
them one after another with a short timeout lost some versions (a person saw none). Now the
probes run side by side with a generous timeout (`PROBE_TIMEOUT`), and an answer is kept under the
executable's real path, modification time and size: the next `kiro agents` asks only a CLI that was
installed, upgraded or replaced since. A probe that timed out is kept too, as such (`TIMED_OUT`): on a
busy machine every later `kiro agents` would otherwise wait for it again; the row says the version is
unknown because the probe timed out, and an upgraded CLI (a new key) is asked again. A probe that could
not start the CLI is not kept: it is asked again next time. A version line passes the redactor before
it is written. `kiro agents NAME` asks only NAME's CLI (`versions` of the presets it is given).
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kiro.executors.agents import Preset

PROBE_TIMEOUT = 120.0  # seconds for one `--version`: eleven node CLIs starting at once on a loaded machine
CACHE_VERSION = 1  # of the cache file's layout (`timed_out`, a list of keys, came later beside `versions`)


class TimedOut(str):
    """The answer of a CLI whose `--version` did not answer within PROBE_TIMEOUT: its version is unknown."""


TIMED_OUT = TimedOut("timed out")


def cache_file(environ: dict[str, str] | None = None) -> Path | None:
    """Where the versions are kept; None without an absolute $XDG_CACHE_HOME or $HOME."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CACHE_HOME")
    if base and os.path.isabs(base):
        return Path(base) / "kiro" / "agent-versions.json"
    home = env.get("HOME")
    return Path(home) / ".cache" / "kiro" / "agent-versions.json" if home and os.path.isabs(home) else None


def _key(preset: Preset) -> str | None:
    """The executable the preset would run, as it is now: its real path, mtime and size, and the version
    flags. None when it is not installed."""
    path = preset.installed()
    if path is None:
        return None
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except OSError:
        return None
    return json.dumps([real, st.st_mtime_ns, st.st_size, list(preset.version_args)])


def _load(path: Path | None) -> dict[str, str | None]:
    """The kept answers by key: a version, None (no version printed), or TIMED_OUT."""
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # none yet, or unreadable: asked again, and written anew
    if not isinstance(data, dict) or data.get("layout") != CACHE_VERSION or not isinstance(data.get("versions"), dict):
        return {}
    known: dict[str, str | None] = {k: v for k, v in data["versions"].items()
                                    if isinstance(k, str) and (v is None or isinstance(v, str))}
    slow = data.get("timed_out")
    known.update({k: TIMED_OUT for k in slow if isinstance(k, str)} if isinstance(slow, list) else {})
    return known


def _save(path: Path, known: dict[str, str | None]) -> None:
    from kiro.fs.atomic import atomic_write
    from kiro.store.redact import Redactor, written_in

    secrets = Redactor.from_environment(None)

    def clean(text: str | None) -> str | None:
        if text is None:
            return None
        text = secrets.text(text)
        own = written_in(text)
        return own.text(text) if own is not None else text

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        slow = sorted(k for k, v in known.items() if isinstance(v, TimedOut))
        kept = {"layout": CACHE_VERSION, "timed_out": slow,
                "versions": {k: clean(v) for k, v in known.items() if not isinstance(v, TimedOut)}}
        atomic_write(path, json.dumps(kept, indent=1, sort_keys=True) + "\n", fsync=False)
    except OSError:
        pass  # a read-only or full cache: the versions are shown all the same, and asked again next time


def versions(presets: list[Preset]) -> list[str | None]:
    """Each preset's version (None: not installed, or no answer; TIMED_OUT: its probe timed out, now or
    before): from the cache when its executable is the one asked before, else asked now, every one
    still unknown at once."""
    path = cache_file()
    known = _load(path)
    keys = [_key(p) for p in presets]
    todo = {key: preset for preset, key in zip(presets, keys, strict=True) if key is not None and key not in known}
    if todo:
        with ThreadPoolExecutor(max_workers=len(todo)) as pool:
            answers = dict(zip(todo, pool.map(_probe, todo.values()), strict=True))
        answered = {key: version for key, (ok, version) in answers.items() if ok}  # a timeout too (TIMED_OUT)
        if answered and path is not None:
            now = {json.loads(key)[0]: key for key in keys if key is not None}
            kept = {key: v for key, v in known.items() if now.get(_real_path(key), key) == key}  # not an old build's
            _save(path, {**kept, **answered})
        known = {**known, **{key: version for key, (_, version) in answers.items()}}
    return [known.get(key) if key is not None else None for key in keys]


def _probe(preset: Preset) -> tuple[bool, str | None]:
    """(whether to keep the answer, its version): a timeout is kept as TIMED_OUT; a CLI that could not
    start (OSError, another subprocess error) is not."""
    import subprocess

    try:
        return True, preset.version(PROBE_TIMEOUT)
    except subprocess.TimeoutExpired:
        return True, TIMED_OUT
    except (OSError, subprocess.SubprocessError):
        return False, None


def _real_path(key: str) -> str | None:
    try:
        found = json.loads(key)[0]
    except (ValueError, IndexError, TypeError, KeyError):
        return None
    return found if isinstance(found, str) else None
