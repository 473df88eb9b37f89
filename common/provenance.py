"""Where and from what a run came: :class:`Provenance`, collected by :func:`collect` when a
run starts and recorded in its directory (``provenance.json``, the ``provenance`` section of
``summary.json``, a comment block at the head of ``spec.yaml``).

The project's source revision (:func:`source_revision`) is read with ``git`` in the
directory this package is installed from, never in the caller's working directory: a
testbed run from inside another repository records the testbed's own commit. It is None when
``git`` is absent, fails, or that directory is not the top of a git checkout (an installed
copy in ``site-packages``). ``dirty`` follows ``git describe --dirty``: a tracked file differs
from the commit (staged or not); untracked files do not count.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import platform
import socket
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import yaml
from pydantic import BaseModel, ConfigDict

__all__ = [
    "PROVENANCE_FILE",
    "PROJECT_DIR",
    "DISTRIBUTION",
    "CostModelSource",
    "Machine",
    "Provenance",
    "RUNTIME_PACKAGES",
    "changes_digest",
    "code_digest",
    "collect",
    "cpu_model",
    "distribution_version",
    "source_revision",
]

#: the file a run directory records its provenance in
PROVENANCE_FILE = "provenance.json"
#: the project's root directory on this machine: the parent of this package
PROJECT_DIR = Path(__file__).resolve().parents[1]
#: the project's distribution name (``pyproject.toml``)
DISTRIBUTION = "dl-netbed"
#: how long one ``git`` command may take, s
GIT_TIMEOUT_S = 10.0
#: the packages whose files decide what a run does (:func:`code_digest`); ``analysis`` only
#: reads finished runs
RUNTIME_PACKAGES = ("common", "topologies", "traffic", "testbed")


class _Record(BaseModel):
    """Base of the provenance models: keys this version does not know are kept and written back."""

    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True)


class Machine(_Record):
    """The machine a run's harness ran on."""

    hostname: str | None = None
    """``socket.gethostname()``."""
    cpu_model: str | None = None
    """The CPU's model name (:func:`cpu_model`)."""
    cores_logical: int | None = None
    """Logical CPUs (``psutil.cpu_count()``)."""
    cores_physical: int | None = None
    """Physical cores (``psutil.cpu_count(logical=False)``; None when unknown)."""
    memory_bytes: int | None = None
    """Total physical memory (``psutil.virtual_memory().total``), bytes."""
    arch: str | None = None
    """``platform.machine()`` (``x86_64``, ``aarch64``)."""


class CostModelSource(_Record):
    """The machine cost model a run's capacity check and ``scale: auto`` read
    (:mod:`testbed.machine_costs`)."""

    path: str | None = None
    """The file: ``$TESTBED_MACHINE_COSTS``, the user's, or the one shipped with the package."""
    measured_on: dict[str, Any] | None = None
    """The machine the file says measured it, as the file records it (its ``machine`` section:
    ``cores``, ``cpu``, ``memory_total_bytes``, ``kernel``, ``date``); None when the file
    cannot be read."""


class Provenance(_Record):
    """The code, software and machine of one run, and when and how it was started. A value
    that cannot be found is None, never an error."""

    project_version: str | None = None
    """The installed ``dl-netbed`` distribution's version (``importlib.metadata``)."""
    commit: str | None = None
    """``git rev-parse HEAD`` of the project's source tree (40 hex digits)."""
    dirty: bool | None = None
    """A tracked file of the source tree differs from ``commit``."""
    python: str | None = None
    """``platform.python_version()``."""
    torch: str | None = None
    """The installed torch's version."""
    mininet: str | None = None
    """The installed Mininet's version."""
    kernel: str | None = None
    """The kernel's release (``platform.release()``)."""
    machine: Machine | None = None
    """The machine the harness ran on."""
    started_at: str | None = None
    """When the run started, UTC, ISO 8601 (``2026-11-23T04:25:36.123456+00:00``)."""
    argv: list[str] | None = None
    """The harness's full command line (``sys.argv``)."""
    cost_model: CostModelSource | None = None
    """The machine cost model the run's capacity check and ``scale: auto`` used; None for a
    run that reads none (a loopback run)."""

    def dump(self) -> dict:
        """The JSON document (every key, unknown ones included)."""
        return self.model_dump(mode="json")

    def comment(self) -> str:
        """The document as a YAML comment block (every line starts with ``#``), for the head
        of a YAML file that loaders must read unchanged."""
        body = yaml.safe_dump({"provenance": self.dump()}, sort_keys=False, width=1000)
        return "".join(f"# {line}" if line.strip() else "#\n" for line in body.splitlines(keepends=True))


def cpu_model() -> str:
    """The CPU's ``model name`` from ``/proc/cpuinfo`` (else ``platform.processor()``, else
    ``"unknown CPU"``)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def distribution_version(name: str) -> str | None:
    """The installed version of the distribution ``name``, or None when it is not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git(*args: str, cwd: Path) -> bytes | None:
    """The output of ``git args`` in ``cwd`` (trusted as a safe directory: it holds the code
    running now); None when git is absent, fails or times out."""
    try:
        r = subprocess.run(
            ["git", "-c", f"safe.directory={cwd}", "--no-optional-locks", *args],
            cwd=cwd,
            capture_output=True,
            timeout=GIT_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout if r.returncode == 0 else None


def _git_text(*args: str, cwd: Path) -> str | None:
    out = _git(*args, cwd=cwd)
    return None if out is None else out.decode(errors="replace").strip()


def source_revision(project_dir: str | Path = PROJECT_DIR) -> tuple[str | None, bool | None]:
    """The commit and dirty flag of the git checkout whose top is ``project_dir``.

    Returns:
        ``(commit, dirty)``: the 40-hex-digit ``HEAD`` and whether a tracked file differs
        from it; ``(None, None)`` when git is absent or fails, or ``project_dir`` is not the
        top of a checkout (e.g. a copy installed inside another repository's tree).
    """
    project_dir = Path(project_dir).resolve()
    top = _git_text("rev-parse", "--show-toplevel", cwd=project_dir)
    if top is None or Path(top).resolve() != project_dir:
        return None, None
    commit = _git_text("rev-parse", "--verify", "HEAD", cwd=project_dir)
    if commit is None:  # a checkout without a commit yet
        return None, None
    status = _git_text("status", "--porcelain", "--untracked-files=no", cwd=project_dir)
    return commit, None if status is None else bool(status)


def changes_digest(project_dir: str | Path = PROJECT_DIR) -> str | None:
    """The SHA-256 (hex) of ``git diff HEAD --binary`` in the checkout whose top is
    ``project_dir``: two checkouts of one commit with the same uncommitted changes to tracked
    files have the same digest. None when :func:`source_revision` is ``(None, None)`` or git
    fails."""
    project_dir = Path(project_dir).resolve()
    if source_revision(project_dir)[0] is None:
        return None
    diff = _git("diff", "HEAD", "--binary", "--no-ext-diff", "--no-color", cwd=project_dir)
    return None if diff is None else hashlib.sha256(diff).hexdigest()


def code_digest(extra: list[str | Path] = (), project_dir: str | Path = PROJECT_DIR) -> str:
    """The SHA-256 (hex) of the code a run executes: every file of :data:`RUNTIME_PACKAGES`
    under ``project_dir`` (``__pycache__`` left out), and the files ``extra`` (e.g. the spec and
    a compute profile it names), each with its path. Two runs with the same digest ran the same
    code on the same inputs, whatever the commit (a commit that changes only the analysis, the
    catalogue or the docs keeps it); no git needed.

    Raises:
        OSError: a file of ``extra`` cannot be read.
    """
    root = Path(project_dir).resolve()
    h = hashlib.sha256()
    files = sorted(
        f for pkg in RUNTIME_PACKAGES for f in (root / pkg).rglob("*") if f.is_file() and "__pycache__" not in f.parts
    )
    for f in files:
        h.update(f"{f.relative_to(root).as_posix()}\0".encode())
        h.update(hashlib.sha256(f.read_bytes()).digest())
    for f in map(Path, extra):
        h.update(f"extra:{f.name}\0".encode())
        h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def _machine() -> Machine:
    try:
        memory = int(psutil.virtual_memory().total)
    except (OSError, RuntimeError):
        memory = None
    return Machine(
        hostname=socket.gethostname(),
        cpu_model=cpu_model(),
        cores_logical=psutil.cpu_count(),
        cores_physical=psutil.cpu_count(logical=False),
        memory_bytes=memory,
        arch=platform.machine(),
    )


def collect(
    argv: list[str] | None = None, started_at: datetime | None = None, cost_model: CostModelSource | None = None
) -> Provenance:
    """The provenance of a run starting now, on this machine.

    Args:
        argv: the command line to record (default ``sys.argv``).
        started_at: the start time (default now); a naive datetime is taken as UTC.
        cost_model: the machine cost model the run uses (None: it uses none).

    Returns:
        Every field set (None where a value cannot be found). Runs ``git`` twice or three
        times in :data:`PROJECT_DIR` (each at most :data:`GIT_TIMEOUT_S`); imports neither
        torch nor Mininet.
    """
    when = started_at or datetime.now(UTC)
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    commit, dirty = source_revision()
    return Provenance(
        project_version=distribution_version(DISTRIBUTION),
        commit=commit,
        dirty=dirty,
        python=platform.python_version(),
        torch=distribution_version("torch"),
        mininet=distribution_version("mininet"),
        kernel=platform.release(),
        machine=_machine(),
        started_at=when.astimezone(UTC).isoformat(),
        argv=list(sys.argv if argv is None else argv),
        cost_model=cost_model,
    )
