"""Which code this is: the installed package's version and, when it runs from a git
checkout, the commit.

:func:`describe` is what ``testbed --version`` prints, e.g. ``dl-netbed 0.1.0 (git
65a3a56c1f2e, modified)``; :func:`package_version` is the version a cluster's machines must
share (:mod:`testbed.cluster`).
"""
from __future__ import annotations

import importlib.metadata
import subprocess
from pathlib import Path

__all__ = ["DISTRIBUTION", "package_version", "git_commit", "describe"]

#: the distribution name in ``pyproject.toml``
DISTRIBUTION = "dl-netbed"

#: the project's folder (a git checkout when it holds ``.git``, a file in a worktree)
_PROJECT_DIR = Path(__file__).resolve().parents[1]


def package_version() -> str:
    """The installed distribution's version (``importlib.metadata``), or ``unknown`` when the
    code runs without being installed."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def git_commit(folder: Path = _PROJECT_DIR) -> str | None:
    """``git describe --always --dirty`` of ``folder`` (e.g. ``65a3a56c1f2e`` or
    ``65a3a56c1f2e-dirty``) when it is a git checkout and git runs; else None."""
    if not (folder / ".git").exists():
        return None
    try:
        r = subprocess.run(["git", "-C", str(folder), "describe", "--always", "--dirty", "--abbrev=12"],
                           capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return (r.stdout.strip() or None) if r.returncode == 0 else None


def describe() -> str:
    """``dl-netbed <version>``, plus ``(git <commit>)`` from a git checkout (``, modified``
    when its files differ from the commit)."""
    out = f"{DISTRIBUTION} {package_version()}"
    commit = git_commit()
    if commit:
        dirty = commit.endswith("-dirty")
        out += f" (git {commit.removesuffix('-dirty')}{', modified' if dirty else ''})"
    return out
