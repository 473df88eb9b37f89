"""The one exception type a user can cause, and its kinds.

Every error a user can provoke (a malformed spec, a missing privilege or tool, a kernel that
lacks a qdisc, a worker that died) is a :class:`TestbedError`; the CLI prints its message
without a traceback. The message always says what to do.

This module sits in :mod:`common`, beneath the four layers, so that every package may raise
these errors without importing a package to its right.
"""

from __future__ import annotations

import reprlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


class TestbedError(Exception):
    """An error the user can act on; ``str(err)`` says what went wrong and what to do."""

    __test__ = False  # not a pytest test class despite its name


_VALUE_REPR = reprlib.Repr()
_VALUE_REPR.maxlevel, _VALUE_REPR.maxdict, _VALUE_REPR.maxlist, _VALUE_REPR.maxtuple = 3, 6, 6, 6
_VALUE_REPR.maxset, _VALUE_REPR.maxstring, _VALUE_REPR.maxother, _VALUE_REPR.maxlong = 6, 120, 120, 60


def show_value(value: Any) -> str:
    """``repr(value)`` cut to a few lines: long strings, big or deeply nested (even
    self-referencing) collections and huge integers are elided with ``...``."""
    try:
        return _VALUE_REPR.repr(value)
    except Exception:  # noqa: BLE001 - a value whose repr fails still gets a message
        return f"<{type(value).__name__}>"


@dataclass(frozen=True)
class FieldError:
    """One malformed spec field: its dotted path, the value given and what is allowed."""

    field: str
    value: Any
    allowed: str

    def __str__(self) -> str:
        return f"spec field '{self.field}': got {show_value(self.value)}; allowed: {self.allowed}"


class SpecError(TestbedError):
    """A malformed experiment spec: one or several bad fields, all reported at once.

    ``SpecError(field, value, allowed)`` is one bad field; ``SpecError.of(errors)`` several.
    ``field``, ``value`` and ``allowed`` are those of the first error; ``errors`` lists all.

    Args:
        field: dotted path of the offending field, e.g. ``topology.host_bw_mbps``.
        value: the value given.
        allowed: what is allowed, in words.
    """

    def __init__(self, field: str, value=None, allowed: str = "", *, errors: Iterable[FieldError] = ()):
        self.errors = list(errors) or [FieldError(field, value, allowed)]
        first = self.errors[0]
        self.field, self.value, self.allowed = first.field, first.value, first.allowed
        if len(self.errors) == 1:
            msg = str(first)
        else:
            msg = f"{len(self.errors)} errors in the spec:\n" + "\n".join(f"  - {e}" for e in self.errors)
        super().__init__(msg)

    @classmethod
    def of(cls, errors: Iterable[FieldError]) -> SpecError:
        """One error carrying every ``FieldError`` of ``errors`` (which must not be empty)."""
        errors = list(errors)
        if not errors:
            raise ValueError("SpecError.of needs at least one FieldError")
        return cls(errors[0].field, errors=errors)


class MissingRequirement(TestbedError):
    """The machine lacks a privilege, a tool or a kernel feature (message names the remedy)."""


class RunFailed(TestbedError):
    """A run ended abnormally: a process died, the run timed out, or teardown found a problem."""


class CapacityError(TestbedError):
    """A run would not fit this machine (its estimated memory exceeds what is available), or
    the measured cost model the estimate needs is missing or malformed; the message gives the
    estimate, what the machine has and what to change (:mod:`testbed.capacity`)."""
