"""Typed records read from JSON or YAML and written back: the loop's state (kiro.state) and the
config (kiro.config).

Not pydantic (issue #12): importing pydantic and building kiro's models was half of `kiro loop
start`'s instructions, spent before any work. A `Record` is a class of typed fields, as a dataclass
is (`typing.dataclass_transform`: mypy checks every constructor call), with the part of pydantic's
model interface kiro uses: `model_validate`, `model_validate_json`, `model_dump`, `model_dump_json`,
`model_copy`, `model_extra`, `model_fields`.

What a field takes is read from its annotation once, when the class is made: str, int, float, bool,
Any, `X | None`, `Literal[...]`, an Enum, `list[X]`, `dict[str, X]`, another Record, a union of
Records told apart by a `kind` tag, `Annotated[T, f, ...]` (`f` runs on the checked value; its
ValueError is the field's error). The checks take what pydantic's lax mode took (a whole number
written as text, 5.0 for 5, "yes" for true, a tuple for a list), refuse NaN and infinity, and say
what is wrong in pydantic's words, which kiro's messages were built on (`FieldError.errors()`: type,
loc, msg, input, as pydantic's ErrorDetails). A record checks every field and reports every error,
in the order the class names its fields, unknown keys last.

A key a class does not name is kept (`model_extra`) and written back, so a newer kiro's fields survive
a round trip through an older one; a class made with `extra="forbid"` refuses it instead (the config).
"""

from __future__ import annotations

import copy
import enum
import json
import re
import sys
import types
from collections.abc import Callable
from typing import (
    Annotated,
    Any,
    ClassVar,
    Literal,
    NamedTuple,
    Self,
    Union,
    dataclass_transform,
    get_args,
    get_origin,
)

_NO_INPUT: Any = object()


class FieldError(ValueError):
    """Values that do not fit: one error or several, each a dict as pydantic's ErrorDetails (type,
    loc, msg, input, ctx). Its text is the first, with its path, and how many more there are."""

    def __init__(self, message: str = "", loc: tuple[str | int, ...] = (), *, kind: str = "value_error",
                 value: Any = _NO_INPUT, ctx: dict[str, Any] | None = None,
                 errors: list[dict[str, Any]] | None = None) -> None:
        if errors is None:
            error: dict[str, Any] = {"type": kind, "loc": loc, "msg": message}
            if value is not _NO_INPUT:
                error["input"] = value
            if ctx:
                error["ctx"] = ctx
            errors = [error]
        self._errors = errors
        super().__init__(str(self))

    def errors(self, *, include_url: bool = False) -> list[dict[str, Any]]:
        return self._errors

    def at(self, *outer: str | int) -> FieldError:
        """The same errors, one level down: `outer` is the path to where they were found."""
        return FieldError(errors=[{**e, "loc": (*outer, *e["loc"])} for e in self._errors])

    def __str__(self) -> str:
        first = self._errors[0]
        where = ".".join(str(part) for part in first["loc"])
        more = f"; and {len(self._errors) - 1} more" if len(self._errors) > 1 else ""
        return f"{where}: {first['msg']}{more}" if where else f"{first['msg']}{more}"


def _bad(kind: str, message: str, value: Any, **ctx: Any) -> FieldError:
    return FieldError(message, kind=kind, value=value, ctx=ctx or None)


# -- checks of plain values, shared with kiro.events ---------------------------------------------

_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})


def check_str(v: Any) -> str:
    if isinstance(v, str):
        return v if type(v) is str else str.__str__(v)  # a StrEnum is its value
    if isinstance(v, bytes | bytearray):
        try:
            return bytes(v).decode("utf-8")
        except UnicodeDecodeError:
            raise _bad("string_unicode", "Input should be a valid string, unable to parse raw data as a unicode "
                       "string", v) from None
    raise _bad("string_type", "Input should be a valid string", v)


def check_int(v: Any) -> int:
    if isinstance(v, int):
        return v if type(v) is int else int(v)
    if isinstance(v, float):
        if v.is_integer():
            return int(v)
        if v - v != 0.0:
            raise _bad("finite_number", "Input should be a finite number", v)
        raise _bad("int_from_float", "Input should be a valid integer, got a number with a fractional part", v)
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            raise _bad("int_parsing", "Input should be a valid integer, unable to parse string as an integer",
                       v) from None
    raise _bad("int_type", "Input should be a valid integer", v)


def check_float(v: Any) -> float:
    """A number, NaN and infinity included (an event's figure: kiro.events)."""
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            raise _bad("float_parsing", "Input should be a valid number, unable to parse string as a number",
                       v) from None
    raise _bad("float_type", "Input should be a valid number", v)


def check_finite(v: Any) -> float:
    """A number that is not NaN or infinite: one read back would poison every sum and average."""
    f = v if type(v) is float else check_float(v)
    if f - f != 0.0:
        raise _bad("finite_number", "Input should be a finite number", v)
    return f


def check_number(v: Any) -> int | float:
    if isinstance(v, bool):
        return int(v)
    if type(v) is int or type(v) is float:
        return v
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            pass
    return check_float(v)


def check_bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, int | float) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in _TRUE | _FALSE:
        return v.strip().lower() in _TRUE
    if isinstance(v, int | float | str):
        raise _bad("bool_parsing", "Input should be a valid boolean, unable to interpret input", v)
    raise _bad("bool_type", "Input should be a valid boolean", v)


def check_texts(v: Any) -> list[str]:
    if not isinstance(v, list | tuple | set | frozenset):
        raise _bad("list_type", "Input should be a valid list", v)
    return _items(check_str, v)


def check_any(v: Any) -> Any:
    return v


def _items(check: Callable[[Any], Any], v: Any) -> list[Any]:
    out, errors = [], []
    for i, x in enumerate(v):
        try:
            out.append(check(x))
        except FieldError as exc:
            errors += exc.at(i).errors()
    if errors:
        raise FieldError(errors=errors)
    return out


def _one_of(values: tuple[Any, ...]) -> str:
    shown = [repr(x) for x in values]
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " or " + shown[-1]


# -- a field: its check, default, name on disk, and how it is written -------------------------


class _Field(NamedTuple):
    check: Callable[[Any], Any]
    default: Any
    factory: Callable[[], Any] | None
    alias: str | None  # its key on disk when that is not its name (`from`)
    dump: Callable[[Any, bool, bool], Any] | None  # (value, json, by_alias) -> what is written; None: the value
    annotation: Any = None  # the field's type
    before: Callable[[Any], Any] | None = None  # runs on the value as given, before the check
    after: Callable[[Any, dict[str, Any]], Any] | None = None  # runs on the checked value; sees the fields before it
    limits: tuple[tuple[str, Any], ...] = ()  # field()'s bounds and pattern: ("ge", 1), ("pattern", "^...$")


_REQUIRED: Any = object()


def field(*, default: Any = _REQUIRED, default_factory: Callable[[], Any] | None = None, alias: str | None = None,
          ge: float | None = None, gt: float | None = None, le: float | None = None, pattern: str | None = None,
          before: Callable[[Any], Any] | None = None, after: Callable[[Any, dict[str, Any]], Any] | None = None,
          ) -> Any:
    """A field's default (`default_factory`: one made per record), its key on disk when that is not
    a Python name (`alias`), bounds of a number (`ge`, `gt`, `le`), a pattern a text must match, and
    functions run on a value given (`before` the check; `after` it, with the fields before it). Only
    in a class body of a Record; a default is not checked, and a validator does not run on it."""
    limits = tuple((name, bound) for name, bound in (("ge", ge), ("gt", gt), ("le", le), ("pattern", pattern))
                   if bound is not None)
    return _Field(check_any, default, default_factory, alias, None, None, before, after, limits)


_LIMITS: dict[str, tuple[str, Callable[[Any, Any], bool], str]] = {
    "ge": ("greater_than_equal", lambda v, b: v >= b, "Input should be greater than or equal to {}"),
    "gt": ("greater_than", lambda v, b: v > b, "Input should be greater than {}"),
    "le": ("less_than_equal", lambda v, b: v <= b, "Input should be less than or equal to {}"),
}


def _limited(check: Callable[[Any], Any], limits: tuple[tuple[str, Any], ...]) -> Callable[[Any], Any]:
    def bounded(given: Any) -> Any:
        v = check(given)
        if v is None:
            return v
        for name, bound in limits:
            if name == "pattern":
                if not re.search(bound, v):
                    raise _bad("string_pattern_mismatch", f"String should match pattern '{bound}'", given,
                               pattern=bound)
                continue
            kind, holds, message = _LIMITS[name]
            if not holds(v, bound):
                raise _bad(kind, message.format(bound), given, **{name: bound})
        return v
    return bounded


_SCALARS: dict[Any, Callable[[Any], Any]] = {
    str: check_str, int: check_int, float: check_finite, bool: check_bool, Any: check_any,
}
_Dump = Callable[[Any, bool, bool], Any]


def _plain_copy(v: Any, as_json: bool, by_alias: bool = True) -> Any:
    """A value of an `Any` field or an unknown key, copied: the dump never shares a list or dict
    with the record, so a change to one is never a change to the other."""
    if isinstance(v, dict):
        return {k: _plain_copy(x, as_json, by_alias) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain_copy(x, as_json, by_alias) for x in v]
    if as_json and isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, Record):
        return v.model_dump(mode="json" if as_json else "python", by_alias=by_alias)
    return v


def _or_none(dump: _Dump) -> _Dump:
    return lambda v, j, a: None if v is None else dump(v, j, a)


def _each(dump: _Dump) -> _Dump:
    return lambda v, j, a: [dump(x, j, a) for x in v]


def _each_value(dump: _Dump) -> _Dump:
    return lambda v, j, a: {k: dump(x, j, a) for k, x in v.items()}


def _dump_record(v: Any, as_json: bool, by_alias: bool) -> dict[str, Any]:
    return v.model_dump(mode="json" if as_json else "python", by_alias=by_alias)  # type: ignore[no-any-return]


def _spec(owner: str, tp: Any) -> tuple[Callable[[Any], Any], _Dump | None]:
    """The check of a type and how a value of it is written (None: as it is)."""
    origin = get_origin(tp)
    if tp in _SCALARS:
        return _SCALARS[tp], _plain_copy if tp is Any else None
    if origin is Annotated:
        base, *afters = get_args(tp)
        inner, dump = _spec(owner, base)
        return _then(inner, afters), dump
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            inner, dump = _spec(owner, args[0])
            return (lambda v: None if v is None else inner(v)), (None if dump is None else _or_none(dump))
        if type(None) not in get_args(tp) and all(isinstance(a, type) and issubclass(a, Record) for a in args):
            return _tagged(owner, args), _dump_record
        raise TypeError(f"{owner}: kiro.records takes X | None or a union of tagged Records, not {tp!r}")
    if origin is Literal:
        allowed = get_args(tp)
        message = f"Input should be {_one_of(allowed)}"

        def one_of(v: Any) -> Any:
            if v not in allowed:
                raise _bad("literal_error", message, v, expected=_one_of(allowed))
            return next(x for x in allowed if x == v)
        return one_of, None
    if origin is list:
        (item,) = get_args(tp)
        check, dump = _spec(owner, item)

        def items(v: Any) -> list[Any]:
            if not isinstance(v, list | tuple):
                raise _bad("list_type", "Input should be a valid list", v)
            return _items(check, v)
        return items, ((lambda v, j, a: list(v)) if dump is None else _each(dump))
    if origin is dict:
        key, value = get_args(tp)
        if key is not str:
            raise TypeError(f"{owner}: kiro.records takes dict[str, X], not {tp!r}")
        check, dump = _spec(owner, value)

        def entries(v: Any) -> dict[str, Any]:
            if not isinstance(v, dict):
                raise _bad("dict_type", "Input should be a valid dictionary", v)
            out, errors = {}, []
            for k, x in v.items():
                try:
                    out[check_str(k)] = check(x)
                except FieldError as exc:
                    errors += exc.at(str(k)).errors()
            if errors:
                raise FieldError(errors=errors)
            return out
        return entries, ((lambda v, j, a: dict(v)) if dump is None else _each_value(dump))
    if isinstance(tp, type) and issubclass(tp, Record):
        return tp.model_validate, _dump_record
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        kind = tp
        message = f"Input should be {_one_of(tuple(m.value for m in kind))}"

        def member(v: Any) -> Any:
            try:
                return kind(v)
            except ValueError:
                raise _bad("enum", message, v) from None
        return member, lambda v, j, a: v.value if j else v
    raise TypeError(f"{owner}: kiro.records has no check for {tp!r}")


def _tagged(owner: str, members: list[type[Record]]) -> Callable[[Any], Any]:
    """A union of Records told apart by their `kind` field (a Literal), as pydantic's discriminated
    union: a member's errors are found under its tag."""
    by_tag: dict[Any, type[Record]] = {}
    for member in members:
        kind = member.model_fields.get("kind")
        if kind is None or get_origin(kind.annotation) is not Literal:
            raise TypeError(f"{owner}: {member.__name__} has no `kind: Literal[...]` to tell it by")
        by_tag.update(dict.fromkeys(get_args(kind.annotation), member))
    expected = ", ".join(repr(t) for t in by_tag)

    def tagged(v: Any) -> Any:
        if isinstance(v, tuple(members)):
            return v
        if not isinstance(v, dict):
            raise _bad("model_attributes_type", "Input should be a valid dictionary or object to extract fields from",
                       v)
        if "kind" not in v:
            raise _bad("union_tag_not_found", "Unable to extract tag using discriminator 'kind'", v)
        member = by_tag.get(v["kind"]) if isinstance(v["kind"], str) else None
        if member is None:
            raise _bad("union_tag_invalid", f"Input tag '{v['kind']}' found using 'kind' does not match any of "
                       f"the expected tags: {expected}", v)
        try:
            return member.model_validate(v)
        except FieldError as exc:
            raise exc.at(v["kind"]) from None
    return tagged


def _then(check: Callable[[Any], Any], afters: list[Any]) -> Callable[[Any], Any]:
    """`check`, then each function of an `Annotated` type (a ValueError from one is the field's)."""
    def checked(v: Any) -> Any:
        v = check(v)
        for after in afters:
            try:
                v = after(v)
            except FieldError:
                raise
            except ValueError as exc:
                raise _bad("value_error", f"Value error, {exc}", v) from None
        return v
    return checked


_EVALUATED: dict[tuple[str, str], Any] = {}


def _evaluate(annotation: Any, module: str, names: dict[str, Any]) -> Any:
    """An annotation as written (a string: `from __future__ import annotations`) as the type it names
    in its module; one evaluation per module and text (`str | None` is written many times), where
    typing.get_type_hints compiles each annotation of a class and its bases again."""
    if not isinstance(annotation, str):
        return annotation
    key = (module, annotation)
    if key not in _EVALUATED:
        _EVALUATED[key] = eval(annotation, names)  # noqa: S307 - a class body's own annotation, as get_type_hints does
    return _EVALUATED[key]


# -- the record ---------------------------------------------------------------------------------


@dataclass_transform(kw_only_default=True, field_specifiers=(field,))
class Record:
    """A record of typed fields. Built from keyword fields, each checked (a FieldError if one does not
    fit); read from a record on disk with `model_validate` (keys as written: aliases; unknown keys
    kept, or refused with `extra="forbid"`). Mutable: an assignment is not checked."""

    model_fields: ClassVar[dict[str, _Field]] = {}  # every field, the bases' first, in the order written
    _BY_KEY: ClassVar[dict[str, str]] = {}  # a key on disk or a field's name -> the field's name
    _FORBID: ClassVar[bool] = False  # an unknown key is an error ("extra_forbidden"), not kept
    _READ: ClassVar[tuple[tuple[Any, ...], ...]] = ()  # per field: name, key, name if aliased, check, before, ...
    _WRITE: ClassVar[tuple[tuple[str, str, _Dump | None], ...]] = ()  # per field: name, key, dump
    _PLAIN: ClassVar[tuple[str, ...] | None] = ()  # the field names when every value is written as it is

    def __init_subclass__(cls, *, extra: Literal["allow", "forbid"] | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if extra is not None:
            cls._FORBID = extra == "forbid"
        own = cls.__dict__.get("__annotations__", {})
        names = vars(sys.modules[cls.__module__])
        fields = dict(cls.model_fields)
        for name, annotation in own.items():
            if name.startswith("_") or (isinstance(annotation, str) and annotation.startswith("ClassVar")):
                continue
            tp = _evaluate(annotation, cls.__module__, names)
            if get_origin(tp) is ClassVar:
                continue
            value = cls.__dict__.get(name, _REQUIRED)
            given = value if isinstance(value, _Field) else _Field(check_any, value, None, None, None)
            if isinstance(given.default, list | dict | set):
                raise TypeError(f"{cls.__name__}.{name}: a list, dict or set default would be shared by every "
                                f"record; use field(default_factory=...)")
            check, dump = _spec(f"{cls.__name__}.{name}", tp)
            if given.limits:
                check = _limited(check, given.limits)
            if type(given.default) is int and tp in (float, float | None):
                given = given._replace(default=float(given.default))  # written as a number with a point, as it is read
            fields[name] = given._replace(check=check, dump=dump, annotation=tp)
            if isinstance(value, _Field):
                delattr(cls, name)  # the instance's own value is read, never the spec
        cls.model_fields = fields
        cls._BY_KEY = {**{name: name for name in fields}, **{f.alias: name for name, f in fields.items() if f.alias}}
        # the same, as plain tuples: a record is read and written at every save (issue #12)
        cls._READ = tuple((name, f.alias or name, f.alias and name, f.check, f.before, f.after, f.default, f.factory)
                          for name, f in fields.items())
        cls._WRITE = tuple((name, f.alias or name, f.dump) for name, f in fields.items())
        cls._PLAIN = None if any(f.alias or f.dump for f in fields.values()) else tuple(fields)

    def __init__(self, /, **values: Any) -> None:
        self._fill(values)

    def _fill(self, values: dict[Any, Any]) -> None:
        d = self.__dict__
        errors: list[dict[str, Any]] | None = None
        taken = 0
        for name, key, alt, check, before, after, default, factory in self._READ:
            if key in values:
                v = values[key]
            elif alt and alt in values:
                key, v = alt, values[alt]
            else:
                if factory is not None:
                    d[name] = factory()
                elif default is _REQUIRED:
                    errors = errors or []
                    errors.append({"type": "missing", "loc": (key,), "msg": "Field required", "input": values})
                else:
                    d[name] = default
                continue
            taken += 1
            try:
                if before is None and after is None:
                    d[name] = check(v)
                    continue
                given = v
                if before is not None:
                    v = before(v)
                v = check(v)
                if after is not None:
                    try:
                        v = after(v, d)
                    except FieldError:
                        raise
                    except ValueError as exc:
                        raise _bad("value_error", f"Value error, {exc}", given) from None
                d[name] = v
            except FieldError as exc:
                errors = errors or []
                errors += exc.at(key).errors()
        if taken < len(values):
            by_key = self._BY_KEY
            extra = {k: v for k, v in values.items() if k not in by_key}
            if extra:
                if self._FORBID:
                    errors = errors or []
                    for k, v in extra.items():
                        if isinstance(k, str):
                            errors.append({"type": "extra_forbidden", "loc": (k,),
                                           "msg": "Extra inputs are not permitted", "input": v})
                        else:
                            errors.append({"type": "invalid_key", "loc": (str(k),), "msg": "Keys should be strings",
                                           "input": k})
                else:
                    d["_extra"] = extra
        if errors:
            raise FieldError(errors=errors)

    # -- reading --------------------------------------------------------------------------------

    @classmethod
    def model_validate(cls, data: Any) -> Self:
        """The record `data` holds (a mapping, keys as written on disk), or a FieldError."""
        if isinstance(data, cls):
            return data
        if not isinstance(data, dict):
            raise _bad("model_type", f"Input should be a valid dictionary or instance of {cls.__name__}", data,
                       class_name=cls.__name__)
        record = cls.__new__(cls)
        record._fill(data)
        return record

    @classmethod
    def model_validate_json(cls, raw: str | bytes) -> Self:
        try:
            data = json.loads(raw)
        except RecursionError:
            raise _bad("json_invalid", "Invalid JSON: nested too deeply", None) from None
        except ValueError as exc:
            raise _bad("json_invalid", f"Invalid JSON: {exc}", None) from None
        return cls.model_validate(data)

    # -- writing --------------------------------------------------------------------------------

    def model_dump(self, *, mode: Literal["json", "python"] = "python", by_alias: bool = False,
                   exclude: set[str] | frozenset[str] | None = None) -> dict[str, Any]:
        """The record as a dict of plain values (mode "json": an enum as its value), fields in the
        order written, then the keys it was read with and does not name; `exclude`: field names."""
        as_json = mode == "json"
        d = self.__dict__
        if self._PLAIN is not None and not exclude:
            out = {name: d[name] for name in self._PLAIN}
        else:
            out = {}
            for name, key, dump in self._WRITE:
                if exclude and name in exclude:
                    continue
                out[key if by_alias else name] = d[name] if dump is None else dump(d[name], as_json, by_alias)
        extra = d.get("_extra")
        if extra:
            for k, v in extra.items():
                out[k] = _plain_copy(v, as_json, by_alias)
        return out

    def model_dump_json(self, *, indent: int | None = None, by_alias: bool = False) -> str:
        return json.dumps(self.model_dump(mode="json", by_alias=by_alias), indent=indent, ensure_ascii=False)

    @property
    def model_extra(self) -> dict[str, Any]:
        """The keys it was read with that no field names, as read."""
        return self.__dict__.get("_extra") or {}

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy (`deep`: of everything it holds too), with `update`'s fields set, unchecked."""
        twin = copy.deepcopy(self) if deep else copy.copy(self)
        if not deep and "_extra" in twin.__dict__:
            twin.__dict__["_extra"] = dict(twin.__dict__["_extra"])
        twin.__dict__.update(update or {})
        return twin

    def _values(self) -> dict[str, Any]:
        d = self.__dict__
        return {name: d[name] for name in self.model_fields}

    def __eq__(self, other: object) -> bool:
        return (type(other) is type(self) and self._values() == other._values()
                and (self.__dict__.get("_extra") or {}) == (other.__dict__.get("_extra") or {}))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self._values().items())})"
