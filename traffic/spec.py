"""The workload section of an experiment spec (``workload:``), owned by this package.

``workload.options`` are the scheme's own (each scheme declares them as a
:class:`~traffic.schemes.base.SchemeOptions` model); :func:`workload_errors` checks them
with the rest of the section.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from common.errors import FieldError, SpecError, TestbedError
from common.validation import SpecModel, did_you_mean, one_of
from traffic import schemes
from traffic.chakra import load_trace
from traffic.compute_profiles import load_profile
from traffic.data import available_datasets
from traffic.launchers import launcher_refusal
from traffic.models import available_models

#: the scheme name of a researcher's own program (``workload.program``)
PROGRAM_SCHEME = "program"
#: the scheme name of a Chakra trace's replay (``workload.trace``)
TRACE_SCHEME = "trace"

#: PS configurations of PHub (Section 2.1, Figure 4): placement and whether the
#: keys are centralized on one server process or sharded over several.
PS_CONFIGS = {
    "CC": ("colocated", "centralized"),
    "CS": ("colocated", "sharded"),
    "NCC": ("dedicated", "centralized"),
    "NCS": ("dedicated", "sharded"),
}


class ServersSpec(SpecModel):
    """Where parameter servers run (PS-family schemes only; other schemes ignore it).

    ``config`` is shorthand for the four PS configurations of PHub Section 2.1 and
    Figure 4 (colocated C / non-colocated NC x centralized C / sharded S):

    ====  =====================================  ===========  =========================
    name  meaning                                placement    count
    ====  =====================================  ===========  =========================
    CC    colocated centralized: one server on   colocated    1
          a worker's host
    CS    colocated sharded: a server on every   colocated    0 (one per worker), or >= 2
          worker's host (MXNet's default)
    NCC   non-colocated centralized: one         dedicated    1
          dedicated server host (a PBox when
          ``interfaces`` > 1)
    NCS   non-colocated sharded: one dedicated   dedicated    0 (one host per worker), or
          server host per worker                              >= 2
    ====  =====================================  ===========  =========================

    With ``scope: per_rack`` the count is per rack (NCC per rack: a PBox in every rack,
    PHub Section 3.4). ``count`` and ``placement`` may be given with ``config`` only if
    they agree with it; left out, they take what ``config`` implies (else 1, colocated).
    """

    count: int | None = Field(None, ge=0)
    """Servers per scope (per rack if ``scope: per_rack``); 0: one per worker."""
    placement: Literal["colocated", "dedicated"] | None = None
    """``colocated`` (a server process on a worker's host) or ``dedicated`` (extra hosts
    ``ps1..`` that run only servers)."""
    scope: Literal["global", "per_rack"] = "global"
    """Whether ``count`` is for the whole cluster or for each rack."""
    interfaces: int = Field(1, gt=0)
    """Links of each dedicated server host to its ToR, each shaped like a host link with its
    own address; k > 1 makes a PBox (PHub Section 3.3, Figure 9). More than 1 needs
    ``placement: dedicated``."""
    config: Literal["CC", "CS", "NCC", "NCS"] | None = None
    """One of PHub's four PS configurations (table above)."""

    _given: dict = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _resolve(self):
        self._given = {"count": self.count, "placement": self.placement}
        if self.config is not None:
            placement, kind = PS_CONFIGS[self.config]
            if self.placement is None:
                self.placement = placement
            if self.count is None:
                self.count = 1 if kind == "centralized" else 0
        if self.count is None:
            self.count = 1
        if self.placement is None:
            self.placement = "colocated"
        return self

    def __eq__(self, other) -> bool:
        """Equal placements: the resolved fields agree (however they were given)."""
        return isinstance(other, ServersSpec) and self.model_dump() == other.model_dump()

    __hash__ = None

    def cross_errors(self, prefix: str = "workload.servers") -> list[FieldError]:
        """``count`` or ``placement`` contradicting ``config``; ``interfaces`` > 1 colocated."""
        out = []
        given = self._given
        if self.config is not None:
            placement, kind = PS_CONFIGS[self.config]
            if given.get("placement") not in (None, placement):
                out.append(
                    FieldError(
                        f"{prefix}.placement",
                        given["placement"],
                        f"{placement!r} for servers.config {self.config} (PHub Figure 4), or leave it out",
                    )
                )
            c = given.get("count")
            if c is not None and kind == "centralized" and c != 1:
                out.append(
                    FieldError(
                        f"{prefix}.count",
                        c,
                        f"1 for servers.config {self.config} (centralized: one server process), or leave it out",
                    )
                )
            if c is not None and kind == "sharded" and c == 1:
                out.append(
                    FieldError(
                        f"{prefix}.count",
                        c,
                        f"0 (one per worker) or >= 2 for servers.config "
                        f"{self.config} (sharded: several server processes), or leave it out",
                    )
                )
        if self.interfaces > 1 and self.placement != "dedicated":
            out.append(
                FieldError(
                    f"{prefix}.interfaces",
                    self.interfaces,
                    "1 unless workload.servers.placement is 'dedicated' (colocated servers use "
                    "their worker host's links; topology.interfaces_per_host sets those)",
                )
            )
        return out


#: warm-up iterations when ``workload.warmup_iterations`` is left out (fewer in a shorter run)
DEFAULT_WARMUP = 5
#: the fewest measured iterations whose steadiness can be tested: the rule compares the
#: median of the later half with that of the earlier (``analysis.metrics.iteration_drift``)
MIN_SETTLE_ITERATIONS = 4
#: the most iterations a run may have: every process writes its events of each iteration to
#: ``events/<process>.jsonl`` (4 to 28 kB per iteration in this project's test runs of ps and
#: phub), which the analysis reads back whole, so a million iterations is already gigabytes
#: per process; the papers' runs have hundreds
MAX_ITERATIONS = 1_000_000
#: the largest seed: numpy's ``RandomState`` takes seeds in [0, 2**32 - 1]; the data order
#: (``numpy.random.default_rng``) refuses a negative seed with ValueError, and torch one
#: beyond 2**64 - 1 (emulated compute seeds its gradients with seed x 100,003 + rank)
MAX_SEED = 2**32 - 1


class OptimizerSpec(SpecModel):
    """SGD with momentum (torch.optim.SGD semantics): v = m*v + g + wd*p; p -= lr*v."""

    lr: float = Field(0.05, gt=0)
    """Learning rate."""
    momentum: float = 0.9
    """Momentum m, in [0, 1)."""
    weight_decay: float = Field(0.0, ge=0)
    """L2 weight decay wd."""

    @field_validator("momentum")
    @classmethod
    def _momentum(cls, v):
        if not 0 <= v < 1:
            raise ValueError("a number in [0, 1)")
        return v


class ComputeSpec(SpecModel):
    """How workers compute.

    ``mode: real``: forward and backward of the real model on real data (accuracy and
    convergence experiments). ``mode: emulated``: every layer's forward and backward take the
    time a compute profile gives (times ``scale``), slept precisely without burning CPU, while
    parameters and gradients stay real tensors of the layers' true sizes (throughput
    experiments).
    """

    mode: Literal["real", "emulated"] = "real"
    """``real`` or ``emulated``."""
    memory: Literal["full", "light"] = "full"
    """``full``: every process holds the model's real tensors (parameters, gradients,
    optimizer state, receive buffers), as real compute needs. ``light`` (``mode: emulated``
    only): values are never used, so a process builds its model on the meta device, sends
    from a read-only region of zeros that takes no memory and receives into one scratch
    buffer the size of its largest message, shared by the processes of a machine when they
    fork from the zygote (:mod:`traffic.runtime.buffers`); every message keeps its true size
    and time. For runs too large to hold one model per process (VGG-19 on 128 workers).
    Not with ``save_params``, and only for schemes that route their tensors through
    :mod:`traffic.runtime.buffers` (``allreduce``, ``ps``, ``p3``, ``ibatch``, ``pipe_sgd``;
    the others are refused, naming why). Left ``full`` by default so that a spec's results do not change
    unasked."""
    profile: str = "zero"
    """``zero`` (infinitely fast compute: communication only, like PHub's
    ZeroComputeEngine, PHub Section 4.4), a device with a compute profile for (model, batch) in
    ``traffic/compute_profiles/data/`` (e.g. ``gtx1080ti``), or the path of a compute profile JSON file
    (``testbed profile`` writes one)."""


class ProgramSpec(SpecModel):
    """A researcher's own training program, run unmodified on every worker host instead of
    a scheme (``workload.program``; scheme ``program``, :mod:`traffic.schemes.program`).

    Each process gets the environment ``torchrun`` gives (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``ROLE_RANK``, ``MASTER_ADDR``: rank
    0's address on the emulated network, ``MASTER_PORT``) and ``GLOO_SOCKET_IFNAME``, so a
    script that calls ``torch.distributed.init_process_group("gloo")`` with the default
    ``env://`` runs as it is; it may mark iterations with :mod:`traffic.marks`.
    """

    command: list[str] = Field(min_length=1)
    """The command line, e.g. ``[python, train.py, --epochs, "1"]``; ``python`` is the
    testbed's interpreter (the one with torch). Not a distributed launcher (``torchrun``,
    ``python -m torch.distributed.run``, ``accelerate launch``): the testbed is the launcher
    (:mod:`traffic.launchers`)."""
    processes_per_host: int = Field(1, ge=1, le=64)
    """Processes started on each worker host (``LOCAL_WORLD_SIZE``)."""
    cwd: str | None = None
    """Working directory: in a spec file, relative to the file's folder; else relative to the
    current directory; left out: the spec file's folder (the current directory)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables, set last (they override the testbed's, e.g.
    ``OMP_NUM_THREADS``)."""

    @field_validator("command")
    @classmethod
    def _command(cls, v):
        if any(not a for a in v[:1]):
            raise ValueError("a non-empty program name first")
        refusal = launcher_refusal(v)  # torchrun & co.: the testbed is the launcher
        if refusal:
            raise ValueError(refusal)
        return v

    def cross_errors(self, prefix: str = "workload.program") -> list[FieldError]:
        """The working directory exists and the program can be found (``python`` is always
        found: the testbed's interpreter; a name with a ``/`` is looked up from ``cwd``)."""
        cwd = Path(self.cwd or ".")
        try:
            if not cwd.is_dir():
                return [
                    FieldError(f"{prefix}.cwd", self.cwd, "an existing folder (relative to the spec file's folder)")
                ]
            name = self.command[0]
            found = (
                name in ("python", "python3")
                or (("/" in name) and (cwd / name).is_file())
                or ("/" not in name and shutil.which(name) is not None)
            )
        except (OSError, ValueError) as e:  # a path the OS refuses
            return [FieldError(f"{prefix}.cwd", self.cwd, f"a usable folder ({type(e).__name__}: {e})")]
        if not found:
            return [
                FieldError(
                    f"{prefix}.command",
                    self.command,
                    f"a command whose program exists: {name!r} is not "
                    f"on PATH" + (f" nor a file under {cwd}" if "/" in name else ""),
                )
            ]
        script = self.command[1] if name in ("python", "python3") and len(self.command) > 1 else None
        if script is not None and script.endswith(".py") and not (cwd / script).is_file():
            return [
                FieldError(
                    f"{prefix}.command",
                    self.command,
                    f"a script that exists: no {script} under {cwd.resolve()} "
                    f"(workload.program.cwd, relative to the spec file's folder)",
                )
            ]
        return []


class TraceSpec(SpecModel):
    """A Chakra execution trace replayed instead of a scheme's training (``workload.trace``;
    scheme ``trace``, :mod:`traffic.schemes.trace`; the trace's format and what each node
    becomes: :mod:`traffic.chakra.trace`).

    Rank ``r`` of the trace runs on the ``r``-th worker process: the trace's ranks must be as
    many as the worker processes (``workload.workers``, or every worker host). Left out,
    ``workload.iterations`` is the trace's own number of iterations; more replay the trace
    again from its first iteration. ``batch_size`` is the samples each iteration counts (for
    samples/s); ``model``, ``dataset``, ``optimizer`` and the servers are unused.
    """

    path: str = Field(min_length=1)
    """The trace's prefix: its files are ``<path>.0.et``, ``<path>.1.et``, ... (one per rank).
    In a spec file, relative to the file's folder; on the command line (``--trace``), to the
    current directory. Needs mlc-chakra (the extra ``chakra``)."""


class WorkloadSpec(SpecModel):
    """What trains: scheme, model, data, batch, iterations.

    ``batch_size`` is per worker; the global batch is ``batch_size * workers``. With
    ``program`` the researcher's command runs instead of a scheme (``scheme`` is then
    ``program``, set by itself), and ``iterations`` is what the program is expected to mark
    (progress display, ``at_iteration`` events); ``model``, ``dataset``, ``optimizer`` and
    the servers are unused.
    """

    scheme: str = "ps"
    """A registered scheme name, ``package.module:ClassName``, or an entry point of the group
    ``dl_netbed.schemes`` (:func:`traffic.schemes.get`)."""
    model: str = "digits_mlp"
    """A model of :mod:`traffic.models`."""
    dataset: str = "digits"
    """A dataset of :mod:`traffic.data` (read in ``compute.mode: real`` only)."""
    compute: ComputeSpec = Field(default_factory=ComputeSpec)
    """Real or emulated compute."""
    batch_size: int = Field(32, gt=0)
    """Samples per worker per iteration."""
    iterations: int = Field(100, gt=0, le=MAX_ITERATIONS)
    """Training iterations (warm-up included), at most :data:`MAX_ITERATIONS` (1,000,000)."""
    warmup_iterations: int = Field(DEFAULT_WARMUP, ge=0)
    """First iterations left out of the measured figures; left out: 5, or ``iterations - 1``
    when the run is shorter (a default never contradicts the ``iterations`` written). With
    ``max_warmup_iterations``, the fewest."""
    max_warmup_iterations: int | None = Field(None, ge=0)
    """Warm up until steady: the warm-up is the fewest iterations, from ``warmup_iterations``
    to this many, after which the next ``iterations - max_warmup_iterations`` iterations had
    settled (the steadiness rule of :func:`analysis.metrics.settled_warmup`, chosen when the
    run is analysed; ``summary.json``'s ``warmup_iterations`` says which). The run executes
    ``iterations`` in all; those after the measured ones are left out, as if it had stopped
    there. Not with scheduled events. Left out: the warm-up is ``warmup_iterations``."""
    eval_every: int = Field(0, ge=0)
    """Evaluate on the test set every this many iterations (0: only at the end)."""
    seed: int = Field(0, ge=0, le=MAX_SEED)
    """Seed of the model's initial values and of the data order, in [0, 4294967295]
    (:data:`MAX_SEED`)."""
    workers: int = Field(0, ge=0)
    """Worker processes; 0: one per worker host."""
    save_params: bool = False
    """Write each process's final parameters to ``params/<proc>.pt``."""
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    """The optimizer every scheme applies."""
    servers: ServersSpec = Field(default_factory=ServersSpec)
    """Parameter-server placement (PS-family schemes)."""
    options: dict[str, Any] = Field(default_factory=dict)
    """The scheme's own options (its ``Options`` model says which)."""
    program: ProgramSpec | None = None
    """A researcher's own program instead of a scheme (:class:`ProgramSpec`)."""
    trace: TraceSpec | None = None
    """A Chakra execution trace replayed instead of a scheme (:class:`TraceSpec`)."""

    @field_validator("scheme")
    @classmethod
    def _scheme(cls, v):
        try:
            schemes.get(v)
        except _BAD_SCHEME_NAME as e:
            raise ValueError(_scheme_not_found(v, e)) from None
        return v

    @model_validator(mode="after")
    def _program_scheme(self):
        if self.program is not None and "scheme" not in self.model_fields_set:
            self.scheme = PROGRAM_SCHEME
        if self.trace is not None and "scheme" not in self.model_fields_set:
            self.scheme = TRACE_SCHEME
        return self

    @model_validator(mode="after")
    def _warmup_default(self):
        if self.trace is not None and "iterations" not in self.model_fields_set:
            n = _trace_iterations(self.trace.path)  # an unreadable trace: cross_errors names it
            if n is not None:
                self.iterations = min(max(n, 1), MAX_ITERATIONS)
        if "warmup_iterations" not in self.model_fields_set:
            self.warmup_iterations = min(DEFAULT_WARMUP, self.iterations - 1)
        return self

    @field_validator("model")
    @classmethod
    def _model(cls, v):
        if v not in available_models():
            raise ValueError(one_of(v, available_models()))
        return v

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, v):
        if v not in available_datasets():
            raise ValueError(one_of(v, available_datasets()))
        return v

    def cross_errors(self, prefix: str = "workload") -> list[FieldError]:
        """Checks that involve several fields (run once every field is valid): warm-up
        shorter than the run, the servers' configuration, a loadable compute profile."""
        out = []
        if self.program is not None and self.scheme != PROGRAM_SCHEME:
            out.append(
                FieldError(
                    f"{prefix}.scheme",
                    self.scheme,
                    f"left out, or {PROGRAM_SCHEME!r}, with workload.program (the program runs instead of a scheme)",
                )
            )
        if self.program is None and self.scheme == PROGRAM_SCHEME:
            out.append(
                FieldError(f"{prefix}.program", None, f"a program (command, ...) with scheme {PROGRAM_SCHEME!r}")
            )
        if self.program is not None:
            out += self.program.cross_errors(f"{prefix}.program")
        if self.trace is not None and self.scheme != TRACE_SCHEME:
            out.append(
                FieldError(
                    f"{prefix}.scheme",
                    self.scheme,
                    f"left out, or {TRACE_SCHEME!r}, with workload.trace (the trace is replayed instead of a scheme)",
                )
            )
        if self.trace is None and self.scheme == TRACE_SCHEME:
            out.append(FieldError(f"{prefix}.trace", None, f"a trace (path: PREFIX) with scheme {TRACE_SCHEME!r}"))
        if self.trace is not None and self.program is not None:
            out.append(
                FieldError(
                    f"{prefix}.trace",
                    self.trace.path,
                    "left out with workload.program (one of a program or a trace runs)",
                )
            )
        if self.trace is not None:
            try:
                trace_of(self)
            except TestbedError as e:
                out.append(FieldError(f"{prefix}.trace.path", self.trace.path, f"a readable Chakra trace: {e}"))
        if self.program is not None and self.compute.mode != "real":
            out.append(
                FieldError(
                    f"{prefix}.compute.mode",
                    self.compute.mode,
                    "'real' with workload.program (the program computes for itself)",
                )
            )
        if self.warmup_iterations >= self.iterations:
            out.append(
                FieldError(
                    f"{prefix}.warmup_iterations",
                    self.warmup_iterations,
                    f"fewer than workload.iterations ({self.iterations})",
                )
            )
        most = self.max_warmup_iterations
        if most is not None and not self.warmup_iterations <= most <= self.iterations - MIN_SETTLE_ITERATIONS:
            out.append(
                FieldError(
                    f"{prefix}.max_warmup_iterations",
                    most,
                    f"from workload.warmup_iterations ({self.warmup_iterations}) to workload.iterations "
                    f"({self.iterations}) - {MIN_SETTLE_ITERATIONS} (the steadiness rule compares two "
                    f"halves of at least {MIN_SETTLE_ITERATIONS} measured iterations), or left out",
                )
            )
        out += self.servers.cross_errors(f"{prefix}.servers")
        out += self._memory_errors(prefix)
        if self.compute.mode == "emulated":
            try:
                load_profile(self.compute.profile, self.model, self.batch_size)
            except TestbedError as e:
                out.append(FieldError(f"{prefix}.compute.profile", self.compute.profile, str(e)))
            except (OSError, ValueError) as e:  # a path the OS refuses (too long), a file not UTF-8
                out.append(
                    FieldError(
                        f"{prefix}.compute.profile",
                        self.compute.profile,
                        f"'zero', a device with a shipped profile, or the path of a readable "
                        f"profile JSON file ({type(e).__name__}: {e})",
                    )
                )
        return out

    def _memory_errors(self, prefix: str) -> list[FieldError]:
        """``compute.memory: light`` needs emulated compute, no saved parameters and a scheme
        that supports it (:meth:`traffic.schemes.base.Scheme.light_memory_refusal`)."""
        if self.compute.memory != "light":
            return []
        field = f"{prefix}.compute.memory"
        if self.compute.mode != "emulated":
            return [
                FieldError(
                    field, "light", "'full' with workload.compute.mode: real (real compute needs the model's values)"
                )
            ]
        out = []
        if self.save_params:
            out.append(
                FieldError(
                    field,
                    "light",
                    "'full' with workload.save_params: true (a light process holds no parameter values to save)",
                )
            )
        if self.program is None:
            refusal = schemes.get(self.scheme).light_memory_refusal()
            if refusal:
                out.append(FieldError(field, "light", f"'full' with scheme {self.scheme!r}: {refusal}"))
        return out


def trace_of(workload: WorkloadSpec):
    """The trace of ``workload.trace`` read and checked (:func:`traffic.chakra.load_trace`;
    cached while its files do not change).

    Raises:
        TestbedError: the workload has no trace, or the trace cannot be read, or fails a check
            (the message names the file and the node), or mlc-chakra is not installed.
    """
    if workload.trace is None:
        raise TestbedError("the workload has no trace (workload.trace.path)")
    return load_trace(workload.trace.path)


def _trace_iterations(path: str) -> int | None:
    """Iterations of one pass over the trace at ``path``; None when it cannot be read."""
    try:
        return load_trace(path).iterations
    except (TestbedError, OSError, ValueError):
        return None


#: what :func:`traffic.schemes.get` raises for a name that names no scheme: its own error, or
#: the import machinery's for a ``module:Class`` it cannot even try (``":x"``, ``"..:x"``), or
#: a value that is not a string
_BAD_SCHEME_NAME = (TestbedError, ImportError, ValueError, TypeError)


def _scheme_not_found(name: str, e: Exception) -> str:
    if isinstance(e, TestbedError):
        return str(e)
    return (
        f"one of {', '.join(schemes.available())}, a package.module:ClassName or an entry point "
        f"of the group {schemes.ENTRY_POINT_GROUP} (cannot import {name!r}: {type(e).__name__}: {e})"
        f"{did_you_mean(name, schemes.available())}"
    )


def option_errors(raw_workload: Any) -> list[FieldError]:
    """Errors of ``workload.options`` against the scheme's ``Options``, from the section as
    given (a mapping): checked even when other fields are wrong, so that one message names
    every bad field. Nothing is checked when the scheme itself cannot be resolved.
    """
    if not isinstance(raw_workload, dict) or not isinstance(raw_workload.get("options", {}), dict):
        return []  # the structural check names it
    try:
        scheme = schemes.get(raw_workload.get("scheme", WorkloadSpec.model_fields["scheme"].default))
    except _BAD_SCHEME_NAME:
        return []  # the scheme's own check names it
    try:
        scheme.validate_options(raw_workload.get("options", {}))
    except SpecError as e:
        return e.errors
    return []
