"""What ``testbed --version`` prints: the installed package's version and, when it runs from
a git checkout, the commit (:func:`common.provenance.source_revision`), e.g.
``dl-netbed 0.2.0 (git 65a3a56c1f2e, modified)``.
"""

from __future__ import annotations

from common.provenance import DISTRIBUTION, distribution_version, source_revision

__all__ = ["describe"]


def describe() -> str:
    """``dl-netbed <version>`` (``unknown`` when the code runs without being installed), plus
    ``(git <12 hex digits>)`` from a git checkout, with ``, modified`` when a tracked file
    differs from the commit."""
    out = f"{DISTRIBUTION} {distribution_version(DISTRIBUTION) or 'unknown'}"
    commit, dirty = source_revision()
    if commit:
        out += f" (git {commit[:12]}{', modified' if dirty else ''})"
    return out
