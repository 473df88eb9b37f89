"""Communication schemes are plugins: a :class:`Scheme` subclass registered by name.

A scheme is found by :func:`get` from ``workload.scheme``, which may be

* a registered name: the schemes of this package (each module of ``traffic/schemes/``
  registers its class with ``@register("name")``) and any class registered by code that
  was imported;
* ``package.module:ClassName``: any importable module (e.g. a researcher's own file on
  ``PYTHONPATH``), whose class must subclass :class:`Scheme`;
* the name of an entry point in the group ``dl_netbed.schemes`` of an installed
  distribution (``[project.entry-points."dl_netbed.schemes"] myscheme = "mypkg.mod:MyScheme"``).

Adding a scheme touches no harness code: the harness asks the class for the hosts it needs
(:meth:`Scheme.hosts`) and for its process plan (:meth:`Scheme.plan`).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil

from common.errors import TestbedError
from common.validation import did_you_mean
from topologies.hosts import HostInfo, HostRequest
from traffic.schemes.base import ProcessPlan, Scheme, SchemeOptions

ENTRY_POINT_GROUP = "dl_netbed.schemes"

_REGISTRY: dict[str, type[Scheme]] = {}
_builtins_loaded = False


class SchemeNotFound(TestbedError):
    """``workload.scheme`` names no scheme (the message lists what is available)."""


def register(name: str):
    """Class decorator: make the class available as ``workload.scheme: <name>``.

    Example::

        @register("myring")
        class MyRing(Scheme): ...

    Raises:
        TypeError: the class is not a :class:`Scheme`, or the name is empty.
    """
    if not isinstance(name, str) or not name:
        raise TypeError("register(name) takes the scheme's name, e.g. @register('ps')")

    def deco(cls: type[Scheme]) -> type[Scheme]:
        if not (isinstance(cls, type) and issubclass(cls, Scheme)):
            raise TypeError(f"@register({name!r}) decorates a Scheme subclass, not {cls!r}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def _load_builtins() -> None:
    global _builtins_loaded
    if not _builtins_loaded:
        _builtins_loaded = True
        for m in pkgutil.iter_modules(__path__):
            if m.name != "base":
                importlib.import_module(f"{__name__}.{m.name}")  # each registers its scheme


def _entry_points() -> dict:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def available() -> list[str]:
    """Names of the registered schemes and of the installed entry points, sorted."""
    _load_builtins()
    return sorted({*_REGISTRY, *_entry_points()})


def get(name: str) -> type[Scheme]:
    """The scheme class that ``name`` refers to (see the module docstring).

    Raises:
        SchemeNotFound: no registered name, importable ``module:Class`` or entry point
            matches, or what it names is not a Scheme subclass; the message says which.
    """
    _load_builtins()
    if name in _REGISTRY:
        return _REGISTRY[name]
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except ImportError as e:
            raise SchemeNotFound(
                f"cannot import module {module!r} of scheme {name!r} ({e}); is its folder on PYTHONPATH?"
            ) from None
        except AttributeError:
            raise SchemeNotFound(f"module {module!r} has no class {attr!r}") from None
        return _checked(cls, name)
    eps = _entry_points()
    if name in eps:
        try:
            return _checked(eps[name].load(), name)
        except ImportError as e:
            raise SchemeNotFound(f"entry point {name!r} of {ENTRY_POINT_GROUP} failed to load: {e}") from None
    raise SchemeNotFound(
        f"one of {', '.join(available())}, a package.module:ClassName, "
        f"or an entry point of the group {ENTRY_POINT_GROUP}{did_you_mean(name, available())}"
    )


def _checked(cls, name: str) -> type[Scheme]:
    if not (isinstance(cls, type) and issubclass(cls, Scheme)):
        raise SchemeNotFound(f"{name!r} is {cls!r}, not a subclass of traffic.schemes.Scheme")
    return cls


__all__ = [
    "HostInfo",
    "HostRequest",
    "ProcessPlan",
    "Scheme",
    "SchemeOptions",
    "SchemeNotFound",
    "register",
    "available",
    "get",
    "ENTRY_POINT_GROUP",
]
