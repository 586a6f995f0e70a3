"""The registries of kiro's extension points: what can be plugged in, found by Python entry points.

An extension point is an entry point group; each entry names one thing (`claude =
kiro.executors.agents.claude:ClaudePreset`). kiro's own are declared in its pyproject.toml, and any
installed package can add one the same way (a `kiro-agent-<x>` package with
`[project.entry-points."kiro.agents"] x = "kiro_agent_x:XPreset"`), as simonw/llm's plugins do.

The names are read from the installed packages' metadata, never by importing what they name: a
command that only validates a config does not load the presets. `load` imports one when it is used.
"""

from __future__ import annotations

import functools
import sys
import types
from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint


class UnknownName(LookupError):
    """A name no installed package registered."""


class Registry:
    """One extension point: its entry point group, and what a person calls its members (`agent`)."""

    def __init__(self, group: str, what: str) -> None:
        self.group = group
        self.what = what

    @functools.cached_property
    def _entries(self) -> dict[str, EntryPoint]:
        from importlib.metadata import entry_points  # read when first asked: ~50 ms a read command never pays

        found: dict[str, EntryPoint] = {}
        for entry in entry_points(group=self.group):
            found.setdefault(entry.name, entry)  # the first on sys.path wins, as for an import
        return found

    def names(self) -> tuple[str, ...]:
        """Every registered name, sorted (whichever package registered it)."""
        return tuple(sorted(self._entries))

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def choices(self) -> str:
        """The names as an error lists them: `'claude', 'codex' or 'x'`."""
        quoted = [repr(name) for name in self.names()]
        return " or ".join([", ".join(quoted[:-1]), quoted[-1]] if len(quoted) > 1 else quoted)

    def load(self, name: str) -> Any:
        """What `name` registered (imported now). UnknownName when none did; ModuleNotFoundError (with
        the registered module's name as `name`) when its module is not there."""
        try:
            entry = self._entries[name]
        except KeyError:
            raise UnknownName(f"unknown {self.what} {name!r}; choose one of {', '.join(self.names())}") from None
        module_name, _, attr = entry.value.partition(":")
        module = import_module(module_name.strip())
        return getattr(module, attr.strip()) if attr else module


_PYDANTIC_LOADER = "pydantic.plugin._loader"


def _no_plugins() -> tuple[()]:
    return ()


def _real_loader_attribute(name: str) -> Any:
    """A name the stand-in lacks (a later pydantic's loader may offer more): the real loader takes its place,
    its cache of loaded plugins set empty, rather than a command failing on the stand-in. (The import system's
    own questions, `__path__` and the like, are answered as for any module.)"""
    if name.startswith("__"):
        raise AttributeError(name)
    if sys.modules.get(_PYDANTIC_LOADER) is _STAND_IN:
        del sys.modules[_PYDANTIC_LOADER]
    real = import_module(_PYDANTIC_LOADER)
    real._plugins = {}  # type: ignore[attr-defined]
    return getattr(real, name)


_STAND_IN = types.ModuleType(_PYDANTIC_LOADER, "pydantic's plugin loader in kiro: no plugin (kiro.plugins)")
_STAND_IN.get_plugins = _no_plugins  # type: ignore[attr-defined]
_STAND_IN._plugins = {}  # type: ignore[attr-defined]
_STAND_IN.__getattr__ = _real_loader_attribute  # type: ignore[method-assign]


def no_pydantic_plugins() -> None:
    """kiro runs no pydantic plugin, in this process only: unlike PYDANTIC_DISABLE_PLUGINS (which Typer sets
    around its own builds), nothing reaches the environment a step, a hook or git inherits.

    pydantic's first validator build in a process imports its plugin loader, which imports importlib.metadata
    (email, csv, zipfile: ~53 M instructions), then scans every installed package's entry points for a plugin
    (~26 M): a read command waited for both (issue #41). Called before that first build (kiro.cli.main, before
    Typer builds its options' validators), the loader's module is one that finds no plugin: pydantic's one use of
    it (`from ._loader import get_plugins`, in pydantic.plugin._schema_validator) gets no plugins, and neither
    import is made. If pydantic's loader is imported already, its cache of loaded plugins is set empty."""
    loader = sys.modules.get(_PYDANTIC_LOADER)
    if loader is None:
        sys.modules[_PYDANTIC_LOADER] = _STAND_IN
    elif getattr(loader, "_plugins", {}) is None:
        loader._plugins = {}  # type: ignore[attr-defined]


AGENTS = Registry("kiro.agents", "agent")
"""The agent presets (kiro.executors.agents): a `Preset` subclass per name."""
