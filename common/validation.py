"""Spec validation shared by every package: pydantic models whose errors read as spec errors.

Each package owns its part of an experiment spec as a :class:`SpecModel` (``topologies``
the topology, ``traffic`` the workload and each scheme's options, ``testbed`` capture, run
and the whole experiment). :func:`validate` turns pydantic's errors into one
:class:`~common.errors.SpecError` that names every bad field by its dotted path, the
value given and what is allowed. :func:`load_yaml` reads YAML with ``1e12`` as a number
(every reader of a spec, its ``--set`` values and a run's ``spec.yaml`` uses it), and refuses
documents nested deeper than :data:`MAX_DEPTH` levels; its errors name the file, line and column.
A name that is not among those allowed (an unknown field, a value of a fixed set) is answered
with the closest allowed one (:func:`did_you_mean`). :func:`safe_name` is the rule for every
name that becomes a path component (a spec's ``name``, a run id, a background flow's name);
:func:`is_safe_label` the looser one of a variant's name (``D-Sync+T``), which reaches a path
only through a mapping to those characters.
"""

from __future__ import annotations

import difflib
import re
import typing
from collections.abc import Iterable
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from common.errors import FieldError, SpecError

M = TypeVar("M", bound=BaseModel)


class SpecModel(BaseModel):
    """Base of every spec section: unknown fields are errors, types are strict (``"5"`` is
    not an integer, ``1`` is not ``true``; an integer is a valid number; ``.inf`` and
    ``.nan`` are not), and each field's docstring is its description."""

    model_config = ConfigDict(
        extra="forbid", strict=True, use_attribute_docstrings=True, validate_default=False, allow_inf_nan=False
    )


#: the longest name that becomes part of a path (a run id adds ``-YYYYmmdd-HHMMSS`` and a
#: ``-N`` suffix to it, and a file name may have at most 255 bytes)
NAME_MAX = 100
_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
#: what :func:`safe_name` allows, in words (the ``allowed`` of its spec errors)
SAFE_NAME_ALLOWED = (
    f"a name of 1 to {NAME_MAX} characters: ASCII letters, digits, '_', '-' and '.', "
    "starting with a letter, a digit or '_' (it becomes part of a path: no '/', "
    "no '..', no leading '.' or '-', no spaces)"
)
# e.g. "exp-1", "p3_vgg19", "run.2"; never "..", ".hidden", "a/b", "/abs", "-rf", "a b", "x\n"


def is_safe_name(value: Any, max_len: int = NAME_MAX) -> bool:
    """True if ``value`` is a string that :func:`safe_name` accepts."""
    return (
        isinstance(value, str)
        and len(value) <= max_len
        and _SAFE_NAME.fullmatch(value) is not None
        and ".." not in value
    )


_SAFE_LABEL = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+=@%,-]*")
#: what :func:`is_safe_label` allows, in words
SAFE_LABEL_ALLOWED = (
    f"a label of 1 to {NAME_MAX} characters: ASCII letters, digits and _ - . + = @ % , "
    "starting with a letter, a digit or '_' (no '/', no '..', no spaces or control characters; "
    "in a directory name every character but letters, digits and _ - . = becomes '-')"
)


def is_safe_label(value: Any, max_len: int = NAME_MAX) -> bool:
    """True if ``value`` may name a variant: a :func:`safe_name` that may also hold ``+ = @ %
    ,`` (e.g. the paper's ``D-Sync+T``). A label is shown in tables and becomes part of a
    directory name only through a mapping that turns those characters into ``-``."""
    return (
        isinstance(value, str)
        and len(value) <= max_len
        and _SAFE_LABEL.fullmatch(value) is not None
        and ".." not in value
    )


def safe_name(value: str) -> str:
    """``value`` if it is safe as one path component (see :data:`SAFE_NAME_ALLOWED`): it can
    never name a parent directory, an absolute path, a hidden file or an option.

    Raises:
        ValueError: with :data:`SAFE_NAME_ALLOWED` as message (a field validator turns it
            into a spec error naming the field and the value).
    """
    if not is_safe_name(value):
        raise ValueError(SAFE_NAME_ALLOWED)
    return value


def to_safe_name(text: str, default: str = "experiment") -> str:
    """``text`` made safe (:func:`safe_name`): every other character becomes ``-``, runs of
    ``.`` one ``.``, leading ``.``/``-`` are dropped and it is cut to :data:`NAME_MAX`;
    ``default`` if nothing is left. Used for a name the user did not write (a spec's file name)."""
    out = re.sub(r"\.{2,}", ".", re.sub(r"[^A-Za-z0-9_.-]", "-", text)).lstrip(".-")[:NAME_MAX]
    return out if is_safe_name(out) else default


#: the deepest nesting of mappings and lists a spec may have
MAX_DEPTH = 32


def check_depth(data: Any, limit: int = MAX_DEPTH) -> None:
    """Refuse data nested deeper than ``limit`` mappings/lists, which also refuses a
    self-referencing structure (a recursive YAML anchor). Shared sub-structures (YAML aliases)
    are not expanded: each distinct container is walked at most ``limit`` times.

    Raises:
        SpecError: field ``<spec>``, the part nested too deep as value, the limit.
    """
    seen: dict[int, int] = {}  # id -> deepest depth at which its children were walked
    stack = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = list(node.values())
        elif isinstance(node, (list, tuple, set, frozenset)):
            children = list(node)
        else:
            continue
        if depth > limit:
            raise SpecError(
                "<spec>", node, f"mappings and lists nested at most {limit} levels deep (and no recursive YAML anchors)"
            )
        if seen.get(id(node), 0) >= depth:  # walked at least this deep already
            continue
        seen[id(node)] = depth
        stack.extend((c, depth + 1) for c in children)


def did_you_mean(value: Any, choices: Iterable[Any], prefix: str = "") -> str:
    """`` (did you mean 'X'?)`` with X the one of ``choices`` closest to ``value``
    (:func:`difflib.get_close_matches`, similarity at least 0.6), ``prefix`` before it (the
    dotted path of an unknown field's parent); '' when none is close or ``value`` is not a
    string. E.g. ``did_you_mean("allreduc", ["ps", "allreduce"])`` is `` (did you mean
    'allreduce'?)``."""
    if not isinstance(value, str):
        return ""
    close = difflib.get_close_matches(value, [str(c) for c in choices], n=1)
    return f" (did you mean '{prefix}{close[0]}'?)" if close else ""


def one_of(value: Any, choices: Iterable[Any]) -> str:
    """``one of a, b, c``, and :func:`did_you_mean` for ``value`` (the ``allowed`` of a spec
    error, or a validator's ``ValueError`` message, for a value outside a fixed set)."""
    choices = [str(c) for c in choices]
    return "one of " + ", ".join(choices) + did_you_mean(value, choices)


_TYPE_WORDS = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "finite_number": "a finite number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string",
    "dict_type": "a mapping",
    "list_type": "a list",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "none_required": "null",
}


def _path(prefix: str, loc: Iterable) -> str:
    out = prefix
    for part in loc:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        elif not isinstance(part, str):  # a key that is not a string (YAML ``1:``, ``null:``)
            out += f"[{part!r}]"
        elif str(part).startswith(("function-after[", "function-before[", "function-wrap[")):
            continue
        else:
            out += ("." if out else "") + str(part)
    return out


def _field_names(model: type[BaseModel]) -> str:
    return ", ".join(model.model_fields)


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The model class that holds the field at ``loc`` (for naming the known fields)."""
    cur: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        if not (isinstance(cur, type) and issubclass(cur, BaseModel)) or part not in cur.model_fields:
            return None
        ann = cur.model_fields[part].annotation
        cur = _inner_model(ann)
    return cur if isinstance(cur, type) and issubclass(cur, BaseModel) else None


def _inner_model(ann):
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for a in getattr(ann, "__args__", ()) or ():
        m = _inner_model(a)
        if m is not None:
            return m
    return None


def _allowed(err: dict, model: type[BaseModel], prefix: str = "", what: str | None = None) -> str:
    t, ctx, loc = err["type"], err.get("ctx") or {}, err["loc"]
    if t == "extra_forbidden":
        holder = _model_at(model, loc)
        names = _field_names(holder) if holder else ""
        parent = _path(prefix, loc[:-1])
        hint = did_you_mean(loc[-1], holder.model_fields if holder else (), f"{parent}." if parent else "")
        if what is not None and len(loc) == 1:
            return f"{what}: {names or 'none'}{hint}"
        where = _path(prefix, [p for p in loc[:-1] if not isinstance(p, int)]) or "the spec"
        return f"a known field of {where}: {names}{hint}" if holder else "no such field"
    if t == "missing":
        return "a value (required)"
    if t == "list_type":
        holder = _model_at(model, loc)
        inner = (
            _inner_model(holder.model_fields[loc[-1]].annotation)
            if holder and loc and loc[-1] in holder.model_fields
            else None
        )
        if inner is not None:
            return f"a list of mappings with fields {_field_names(inner)}"
    if t == "literal_error":
        expected = str(ctx.get("expected", ""))
        if "'" not in expected:
            return f"one of {expected}"
        quoted = re.findall(r"'([^']*)'", expected)
        return "one of " + ", ".join(f"'{q}'" for q in quoted) + did_you_mean(err.get("input"), quoted)
    if t in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        bound = {
            "greater_than": f"> {ctx.get('gt')}",
            "greater_than_equal": f">= {ctx.get('ge')}",
            "less_than": f"< {ctx.get('lt')}",
            "less_than_equal": f"<= {ctx.get('le')}",
        }[t]
        return f"a number {_num(bound)}"
    if t == "too_short":
        return f"at least {ctx.get('min_length')} item(s)"
    if t == "value_error":
        return str(ctx.get("error", err["msg"]))
    if t == "assertion_error":
        return err["msg"].removeprefix("Assertion failed, ")
    if t in _TYPE_WORDS:
        return _TYPE_WORDS[t]
    return err["msg"]


def _num(bound: str) -> str:
    """``> 0.0`` -> ``> 0`` (bounds are written as the user would)."""
    op, _, v = bound.partition(" ")
    try:
        f = float(v)
        return f"{op} {int(f) if f == int(f) else f}"
    except ValueError:
        return bound


def field_errors(
    exc: ValidationError, model: type[BaseModel], prefix: str = "", what: str | None = None
) -> list[FieldError]:
    """Pydantic's errors as :class:`FieldError` s with dotted paths under ``prefix``.

    A union of types reports one error per member; they are merged into one per field.
    ``what`` names the model's fields in the error of an unknown top-level field (e.g.
    ``options of scheme 'ps'``).
    """
    out: dict[str, FieldError] = {}
    for err in exc.errors(include_url=False):
        clean = _field_loc(model, err["loc"], extra=err["type"] == "extra_forbidden")
        path = _path(prefix, clean)
        allowed = _allowed({**err, "loc": clean}, model, prefix, what)
        value = err.get("input")
        if path in out:
            if allowed not in out[path].allowed:
                out[path] = FieldError(path, out[path].value, f"{out[path].allowed} or {allowed}")
        else:
            out[path] = FieldError(path, value, allowed)
    return list(out.values())


def _field_loc(model: type[BaseModel], loc: tuple, extra: bool) -> tuple:
    """``loc`` without the tags pydantic adds for union members and validators (``int``,
    ``literal['auto']``, ``function-after[...]``). Walking the models along ``loc``, a string
    that names no field of the model at that point is such a tag (except the unknown field of
    an ``extra_forbidden`` error, the last part); below a mapping field its keys are kept;
    below any other field only list indices are."""
    out, cur = [], model  # cur: a model class, "mapping", or None (a leaf value)
    for n, part in enumerate(loc):
        if isinstance(part, int) or cur == "mapping":
            out.append(part)
        elif isinstance(cur, type) and (part in cur.model_fields or (extra and n == len(loc) - 1)):
            out.append(part)
            ann = cur.model_fields[part].annotation if part in cur.model_fields else None
            cur = _inner_model(ann) or ("mapping" if typing.get_origin(ann) is dict or ann is dict else None)
    return tuple(out)


def validate(model: type[M], data: Any, prefix: str = "", what: str | None = None) -> M:
    """``model`` validated from ``data`` (a mapping). ``what``: see :func:`field_errors`.

    Raises:
        SpecError: naming every bad field (``prefix`` + its dotted path), its value and what
            is allowed.
    """
    if not isinstance(data, dict):
        raise SpecError(prefix or "<spec>", data, f"a mapping with fields {_field_names(model)}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise SpecError.of(field_errors(e, model, prefix, what)) from None


class DuplicateKeyError(SpecError, yaml.YAMLError):
    """A key given twice in one YAML mapping: a :class:`SpecError` (field: the key's dotted
    path; allowed: each key once, with the lines of both and the file), and a
    ``yaml.YAMLError`` for readers that treat any YAML problem alike."""


class _Rules:
    """YAML 1.1 with YAML 1.2's floats: ``1e12`` and ``1E-3`` are numbers, not strings; and a
    key given twice in a mapping is an error (:class:`DuplicateKeyError`), not the second
    value silently winning. Mixed into PyYAML's pure-Python loader (:class:`_Loader`) and its
    libyaml one (:class:`_CLoader`): the same resolver and constructor over either parser.

    Args:
        text: the YAML text.
        source: what the text is, for messages (a file's path, ``--set ...``).
        prefix: the dotted path the document sits at (the field a ``--set`` value sets).
    """

    def __init__(self, text: str, source: str | None = None, prefix: str = ""):
        super().__init__(text)
        if source is not None:
            self.name = source  # marks (line numbers in messages) name it
        self.source, self._paths, self._checked = source, {}, set()
        self._depth = 0  # collections open in the composer (compose_node)
        self._paths[None] = prefix  # the document's root (see construct_document)

    def construct_document(self, node):
        self._paths[id(node)] = self._paths.pop(None, "")
        return super().construct_document(node)

    def compose_node(self, parent, index):
        """PyYAML's composer, refusing a collection nested deeper than :data:`MAX_DEPTH` as
        soon as it opens: the pure-Python scanner's cost grows with the square of the open
        flow collections, so a hostile text is stopped before it is read whole. (libyaml
        composes in C, without this method: its documents are checked whole by
        :func:`check_depth`.)"""
        if not self.check_event(yaml.SequenceStartEvent, yaml.MappingStartEvent):
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise yaml.YAMLError(_located(self.source, mark, f"nested more than {MAX_DEPTH} levels deep"))
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def _check_keys(self, node) -> None:
        """Refuse a key given twice among ``node``'s own keys (merged ``<<`` keys may be
        overridden, as YAML says) and note the path of each value. Done once per node, before
        PyYAML flattens its merges (which happens first when another mapping merges it)."""
        if id(node) in self._checked or not isinstance(node, yaml.MappingNode):
            return
        self._checked.add(id(node))
        here, first = self._paths.get(id(node), ""), {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                continue
            key = self.construct_object(key_node, deep=True)
            path = _path(here, [key])
            line = key_node.start_mark.line + 1
            if key in first:
                where = f" of {self.source}" if self.source else ""
                raise DuplicateKeyError(path, key, f"each key once (lines {first[key]} and {line}{where})")
            first[key] = line
            self._paths.setdefault(id(value_node), path)

    def flatten_mapping(self, node):
        self._check_keys(node)
        super().flatten_mapping(node)

    def construct_mapping(self, node, deep=False):
        self._check_keys(node)
        return super().construct_mapping(node, deep=deep)

    def construct_sequence(self, node, deep=False):
        here = self._paths.get(id(node), "")
        for i, child in enumerate(getattr(node, "value", ())):
            self._paths.setdefault(id(child), f"{here}[{i}]")
        return super().construct_sequence(node, deep=deep)


class _Loader(_Rules, yaml.SafeLoader):
    """:class:`_Rules` over PyYAML's pure-Python parser: every error's wording comes from it."""


if getattr(yaml, "__with_libyaml__", False):

    class _CLoader(_Rules, yaml.CSafeLoader):
        """:class:`_Rules` over libyaml's parser, used when PyYAML has it because it reads a
        spec several times faster (measured: ``docs/scaling.md``)."""
else:  # PyYAML built without libyaml: every text is read by _Loader
    _CLoader = None

#: libyaml's composer recurses in C once per nesting level, past the interpreter's recursion
#: guard: flow collections nested some 50,000 deep crash the process. A text with fewer
#: openers than this, and short enough that block nesting cannot go that deep, is safe for it.
_CLOADER_MAX_OPENERS, _CLOADER_MAX_CHARS = 10_000, 10_000_000

#: YAML 1.2's floats, which YAML 1.1's resolver misses (``1e12``, ``1E-3``)
_FLOAT = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                   |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                   |\.[0-9_]+(?:[eE][-+][0-9]+)?
                   |[-+]?\.(?:inf|Inf|INF)
                   |\.(?:nan|NaN|NAN))$""",
    re.X,
)
for _cls in filter(None, (_Loader, _CLoader)):
    _cls.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))


def _located(source: str | None, mark, text: str) -> str:
    """``SOURCE, line L, column C: text`` (the parts known; ``mark`` a PyYAML mark or None)."""
    where = [source] if source else []
    if mark is not None:
        where.append(f"line {mark.line + 1}, column {mark.column + 1}")
    return f"{', '.join(where)}: {text}" if where else text


def _marked(e: yaml.MarkedYAMLError, source: str | None) -> str:
    """A YAML syntax error as ``SOURCE, line L, column C: <problem> (<context>)``: PyYAML's
    own message quotes the line, which may be a secret of a file the tool (root) was pointed
    at, and names a text it was given as ``<unicode string>``."""
    context = f" ({e.context})" if e.context else ""
    return _located(source, e.problem_mark or e.context_mark, f"{e.problem or 'not YAML'}{context}")


def load_yaml(text: str, source: str | None = None, prefix: str = "") -> Any:
    """Parse YAML text; ``1e12`` is a number (PyYAML alone reads it as a string).

    Args:
        text: the YAML text.
        source: what it is, named in messages: a file's path, ``the --set value ...``.
        prefix: the dotted path the document sits at, for the field of a repeated key (the
            path a ``--set`` value is set at; '' for a whole spec).

    Raises:
        DuplicateKeyError: a key given twice in one mapping (a :class:`SpecError` naming the
            key's dotted path, both lines and ``source``; also a ``yaml.YAMLError``).
        yaml.YAMLError: not YAML, a value its tag cannot hold (``2001-13-01``, ``!!int x``,
            an integer of more than 4300 digits), or nesting deeper than :data:`MAX_DEPTH`
            levels (or a recursive anchor). The message begins with where: ``SOURCE, line L,
            column C: `` (the line and column where PyYAML stopped, when it says).
    """
    data = _read_with_libyaml(text, source, prefix)
    if data is _UNREAD:
        data = _read_with_python(text, source, prefix)
    try:
        check_depth(data)
    except SpecError as e:
        raise yaml.YAMLError(_located(source, None, e.allowed)) from None
    return data


#: what :func:`_read_with_libyaml` returns when it did not read the text
_UNREAD = object()


def _read_with_libyaml(text: str, source: str | None, prefix: str) -> Any:
    """The document, read by libyaml's parser; :data:`_UNREAD` when libyaml is missing, the
    text is not safe for it (:data:`_CLOADER_MAX_OPENERS`) or reading it failed: the
    pure-Python parser then reads it again, so that every error is worded as always."""
    if _CLoader is None or len(text) > _CLOADER_MAX_CHARS or text.count("[") + text.count("{") > _CLOADER_MAX_OPENERS:
        return _UNREAD
    loader = _CLoader(text, source, prefix)
    try:
        return loader.get_single_data()
    except Exception:  # noqa: BLE001 -- read again by _read_with_python, which words the error
        return _UNREAD
    finally:
        loader.dispose()


def _read_with_python(text: str, source: str | None, prefix: str) -> Any:
    """The document, read by PyYAML's pure-Python parser (see :func:`load_yaml`'s errors)."""
    loader = _Loader(text, source, prefix)
    try:
        data = loader.get_single_data()
    except yaml.MarkedYAMLError as e:  # said without PyYAML's snippet: a file's lines are never echoed
        raise yaml.YAMLError(_marked(e, source)) from None
    except yaml.YAMLError:
        raise
    except RecursionError:
        raise yaml.YAMLError(_located(source, None, f"nested more than {MAX_DEPTH} levels deep")) from None
    except (ValueError, TypeError, OverflowError) as e:  # PyYAML's constructors let these through
        raise yaml.YAMLError(_located(source, None, f"a value its type cannot hold ({e})")) from None
    finally:
        loader.dispose()
    return data


class SpecFileError(SpecError):
    """A spec file that is not YAML (field ``<file>``, value its path): the message is the
    YAML error's, which begins with the file, line and column (``experiments/x.yaml, line 3,
    column 5: mapping values are not allowed here (not valid YAML)``).

    Args:
        path: the file, as the user named it.
        error: what :func:`load_yaml` raised.
    """

    def __init__(self, path: str, error: yaml.YAMLError):
        super().__init__("<file>", path, f"valid YAML ({error})")
        self.detail = str(error)

    def __str__(self) -> str:
        return f"{self.detail} (not valid YAML)"
