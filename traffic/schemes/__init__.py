"""Communication schemes, one module each, registered by name (see :mod:`.base`)."""
import importlib
import pkgutil

from traffic.schemes.base import HostInfo, ProcessPlan, Scheme, register, _REGISTRY

_loaded = False


def _load_all() -> None:
    global _loaded
    if not _loaded:
        for m in pkgutil.iter_modules(__path__):
            if m.name != "base":
                importlib.import_module(f"{__name__}.{m.name}")
        _loaded = True


def available_schemes() -> list[str]:
    """Names of every registered scheme, sorted."""
    _load_all()
    return sorted(_REGISTRY)


def get_scheme(name: str) -> type[Scheme]:
    """The scheme class registered as ``name``.

    Raises:
        KeyError: no such scheme (spec validation reports it as a SpecError first).
    """
    _load_all()
    return _REGISTRY[name]


__all__ = ["HostInfo", "ProcessPlan", "Scheme", "register", "available_schemes", "get_scheme"]
