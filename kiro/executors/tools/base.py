"""What every agent tool shares: its argument model, its result, the environment it runs in, and
the one place where a model's raw tool call becomes validated arguments or a correctable error.

A tool never raises into the agent loop. Whatever goes wrong (a refused path, a missing file, a
bad regex, a bug) comes back as the tool's result text starting with "error:", which the model
reads and can act on. Only the step tools (`complete_step`, `fail_step`, `request_human`, an
interrupted `sleep`) end the attempt, by returning an `Ending`.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from kiro.errors import raise_errors
from kiro.executors.base import Outcome
from kiro.executors.tools.errors import ToolError

if TYPE_CHECKING:
    from kiro.executors.base import StepContext
    from kiro.executors.tools.paths import Confinement
    from kiro.store.memory import MemoryStore
    from kiro.store.redact import Redactor

OUTPUT_LIMIT = 100_000  # characters of any one tool result the model sees


class Args(BaseModel):
    """Base of every tool's argument model. Unknown arguments are errors, so a misspelt argument
    name is reported instead of silently ignored."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=False)


@dataclass(frozen=True)
class Ending:
    """How a step tool ends the attempt."""

    outcome: Outcome
    summary: str = ""
    error: str | None = None
    question: str | None = None
    stop_reason: str | None = None


@dataclass
class ToolResult:
    text: str
    ok: bool = True
    ending: Ending | None = None

    @classmethod
    def error(cls, message: str) -> ToolResult:
        return cls(f"error: {message}", ok=False)


@dataclass
class ToolEnv:
    """Everything a tool may use for one attempt. Built by the executor; tools never reach for
    globals, which keeps them testable one by one."""

    ctx: StepContext
    confinement: Confinement
    memory: MemoryStore
    redact: Redactor
    memory_source: str
    api_key_env: str
    deadline: float | None = None  # time.monotonic() by which the attempt must end
    memory_saved: list[str] = field(default_factory=list)  # contents saved this attempt (wrap-up summary)

    def remaining(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()


A = TypeVar("A", bound=Args)


@dataclass(frozen=True)
class Tool(Generic[A]):
    name: str
    description: str
    args: type[A]
    run: Callable[[A, ToolEnv], Awaitable[ToolResult]]

    def schema(self) -> dict[str, Any]:
        """The Chat Completions `tools` entry: the argument model's JSON schema, minus the
        pydantic titles that only cost tokens. Built once per tool (it never changes); callers
        must not mutate it."""
        return _tool_schema(self.name, self.description, self.args)

    def parse(self, raw: str | None) -> A:
        """Raw JSON arguments -> the validated model, or a ToolError that names each field and its
        problem and lists the expected arguments, so the model can correct the call."""
        text = (raw or "").strip() or "{}"
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ToolError(
                f"the arguments of {self.name} are not valid JSON ({exc.msg} at line {exc.lineno} column "
                f"{exc.colno}); send one JSON object: {self.signature()}"
            ) from None
        if not isinstance(value, dict):
            raise ToolError(f"the arguments of {self.name} must be a JSON object, not "
                            f"{type(value).__name__}; expected {self.signature()}")
        try:
            return self.args.model_validate(value)
        except ValidationError as exc:
            raise ToolError(f"invalid arguments for {self.name}: {describe_validation_error(exc)}; "
                            f"expected {self.signature()}") from None

    def signature(self) -> str:
        """`name(path: string, content: string, type?: string)` for error messages."""
        schema = self.args.model_json_schema()
        required = set(schema.get("required", []))
        parts = []
        for key, prop in schema.get("properties", {}).items():
            parts.append(f"{key}{'' if key in required else '?'}: {_type_name(prop)}")
        return f"{self.name}({', '.join(parts)})"


@functools.lru_cache(maxsize=64)
def _tool_schema(name: str, description: str, args: type[BaseModel]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": name, "description": description,
                     "parameters": _strip_titles(args.model_json_schema())},
    }


async def execute(tool: Tool[A], args: A, env: ToolEnv) -> ToolResult:
    """Run a tool on validated arguments; a ToolError or any other exception becomes the error result
    the model reads (under KIRO_RAISE_ERRORS/KIRO_DEBUG other exceptions surface, so bugs are seen in development)."""
    try:
        return await tool.run(args, env)
    except ToolError as exc:
        return ToolResult.error(str(exc))
    except Exception as exc:  # a tool bug is the model's information, never the loop's end
        if raise_errors():
            raise
        return ToolResult.error(f"{tool.name} failed: {type(exc).__name__}: {exc}")


def describe_validation_error(exc: ValidationError) -> str:
    problems = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(arguments)"
        if err["type"] == "extra_forbidden":
            problems.append(f"{loc}: unknown argument")
        elif err["type"] == "missing":
            problems.append(f"{loc}: required argument missing")
        else:
            problems.append(f"{loc}: {err['msg']}")
    return "; ".join(problems)


def _type_name(prop: Mapping[str, Any]) -> str:
    if "type" in prop:
        t = prop["type"]
        if t == "array" and isinstance(prop.get("items"), dict):
            return f"array of {_type_name(prop['items'])}"
        return str(t)
    if "anyOf" in prop:
        names = [_type_name(p) for p in prop["anyOf"] if p.get("type") != "null"]
        return " | ".join(names) or "null"
    return "value"


def _strip_titles(schema: Any) -> Any:
    if isinstance(schema, dict):
        # A schema title is a string; a property that happens to be called "title" is a dict.
        return {k: _strip_titles(v) for k, v in schema.items() if not (k == "title" and isinstance(v, str))}
    if isinstance(schema, list):
        return [_strip_titles(v) for v in schema]
    return schema


def clip_output(text: str, limit: int = OUTPUT_LIMIT) -> str:
    """Bound what the model sees, and say that something was cut: head and tail are kept."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 5
    tail = limit - head
    return (text[:head] + f"\n[... output truncated: {len(text) - limit} of {len(text)} characters cut ...]\n"
            + text[-tail:])
