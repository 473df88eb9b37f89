"""The emulated host: what every non-network cost of an emulated host takes.

The spec's ``host:`` section (:class:`HostSpec`) states, in the emulated host's units,
the rates of the work a scheme does besides communicating: per-message software overhead,
the start-up a server pays before answering a pull request, summation of gradients, the
optimizer update and compression. A host *profile* (``traffic/hostmodel/data/<name>.yaml``, one per
system the papers describe, every value with its source) supplies them; fields written
inline override the profile's. ``null`` states nothing: a value that neither the spec nor its
profile states resolves to the reference profile's (:data:`REFERENCE_PROFILE`, a measurement
of a named machine at scale 1), never to the real time of the machine running the emulation
(which, divided by ``scale``, would make the same unstated cost depend on the dilation and the
machine). :class:`HostModel` is the resolved form the runtime uses
(:class:`traffic.hostmodel.costs.HostCosts` charges each operation at it, dilated by
``scale``).

Each value has a *scope*. ``process`` (the default): every emulated process has the rate to
itself, and each of its operations runs on its own clock. ``machine``: the rate is the whole
emulated host's (e.g. a rate derived from the host's DRAM bandwidth), shared by every
process and thread on that host; only the three rates (``aggregate_gb_per_s``,
``optimizer_gb_per_s``, ``codec_gb_per_s``) may have it. Those kinds are charged on one
shared clock per host (:class:`traffic.hostmodel.machine.HostMachine`).

Host profile file format (YAML)::

    description: "..."
    message_overhead_us: {value: 12.0, source: "PHub Sec. 4.1: \\"...\\""}
    request_startup_ms: {value: 0, source: "reference measurement (...): the paper gives no figure"}
    aggregate_gb_per_s: {value: 40, source: "...", scope: machine}
    optimizer_gb_per_s: {...}
    codec_gb_per_s: {...}
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, field_validator

from common.errors import FieldError, SpecError, TestbedError
from common.validation import SpecModel, load_yaml, validate

DATA_DIR = Path(__file__).resolve().parent / "data"
"""Directory of the shipped host profiles ``<name>.yaml``."""

RATE_FIELDS = (
    "message_overhead_us",
    "request_startup_ms",
    "aggregate_gb_per_s",
    "optimizer_gb_per_s",
    "codec_gb_per_s",
)

REFERENCE_PROFILE = "reference"
"""The shipped profile every value that neither a spec nor its profile states resolves to:
``testbed profile --host`` on a named machine at scale 1 (``data/reference.yaml``)."""

#: the fields that may be machine-scoped (``scope: machine``, ``host.machine_rates``) and the
#: kind of cost (:meth:`HostModel.cost_s`) each one is the rate of
MACHINE_RATE_KINDS = {"aggregate_gb_per_s": "aggregate", "optimizer_gb_per_s": "optimizer", "codec_gb_per_s": "codec"}

MachineRate = Literal["aggregate_gb_per_s", "optimizer_gb_per_s", "codec_gb_per_s"]


class HostSpec(SpecModel):
    """The ``host:`` section: the emulated host's non-network costs (emulated units).

    The smallest operation of each kind, dilated (x ``scale``), must take less than
    ``run.timeout_s`` (:meth:`testbed.spec.Experiment.cross_errors`): one message, one pull
    request, and one float32 element (4 bytes) at each rate. A run that sends, sums, updates
    or codes anything pays at least one of them, waiting in ``time.sleep``; with more, the
    run could never end in time (and a wait beyond ``threading.TIMEOUT_MAX`` would raise)."""

    profile: str | None = None
    """A host profile: a name in ``traffic/hostmodel/data/`` or the path of a profile file; the
    fields below, when written, override its values."""
    message_overhead_us: float | None = Field(None, ge=0)
    """Software cost per message sent and per message received, microseconds (null: the
    profile's, else the reference profile's)."""
    request_startup_ms: float | None = Field(None, ge=0)
    """What a server pays before answering each pull request (iBatch's T_s), milliseconds
    (null: the profile's, else the reference profile's)."""
    aggregate_gb_per_s: float | None = Field(None, gt=0)
    """Server summation, GB of incoming gradient per second; null: the profile's, else the reference's."""
    optimizer_gb_per_s: float | None = Field(None, gt=0)
    """Optimizer update, GB of parameters per second; null: the profile's, else the reference's."""
    codec_gb_per_s: float | None = Field(None, gt=0)
    """Compression and decompression, GB of uncompressed data per second; null: the profile's,
    else the reference's."""
    machine_rates: list[MachineRate] | None = None
    """Which of the three rates are the whole emulated host's (``scope: machine``: shared by
    every process and thread on the host), e.g. ``[aggregate_gb_per_s, optimizer_gb_per_s]``;
    the others are each process's. When written (``[]`` too) it replaces every scope; null:
    each rate has the scope its value comes with (the profile's, which a rate written inline
    keeps; else the reference profile's)."""

    def cross_errors(self, prefix: str = "host") -> list[FieldError]:
        """A profile that cannot be found or read."""
        if self.profile is None:
            return []
        try:
            load_host_profile(self.profile)
        except TestbedError as e:
            return [FieldError(f"{prefix}.profile", self.profile, str(e))]
        return []

    def _values(self) -> tuple[dict, dict, list[str]]:
        """The rates in force (the profile's, overridden by the fields written inline; a value
        stated by neither, or stated null, is the reference profile's), where each comes
        from, and the machine-scoped rate fields (in :data:`RATE_FIELDS` order: ``machine_rates``
        when written, else each value's scope in its profile).

        Raises:
            TestbedError: the profile (or the reference profile) cannot be loaded.
        """
        values = {f: None for f in RATE_FIELDS}
        sources = {f: "" for f in RATE_FIELDS}
        scopes = {f: "process" for f in RATE_FIELDS}
        if self.profile is not None:
            prof = load_host_profile(self.profile)
            for f in RATE_FIELDS:
                scopes[f] = prof[f].scope  # what the field means on this host, its value inline or not
                if prof[f].value is not None:
                    values[f], sources[f] = prof[f].value, f"profile {self.profile}: {prof[f].source}"
        for f in RATE_FIELDS:
            if f in self.model_fields_set and getattr(self, f) is not None:
                values[f], sources[f] = getattr(self, f), "spec"
        unstated = [f for f in RATE_FIELDS if values[f] is None]
        if unstated:  # never this machine's real time: the reference machine's measured number
            ref = load_host_profile(REFERENCE_PROFILE)
            by = "the spec" if self.profile is None else f"the spec or profile {self.profile}"
            for f in unstated:
                values[f], scopes[f] = ref[f].value, ref[f].scope
                sources[f] = (
                    f"reference measurement (profile {REFERENCE_PROFILE}, as {by} states no value): {ref[f].source}"
                )
        machine = (
            set(self.machine_rates)
            if self.machine_rates is not None
            else {f for f in RATE_FIELDS if scopes[f] == "machine"}
        )
        return values, sources, [f for f in RATE_FIELDS if f in machine]

    def pinned(self) -> dict:
        """This section with every rate written out as resolved, as numbers, and
        ``machine_rates`` as resolved (what a run's ``spec.yaml`` records: the run keeps the
        rates and scopes it used even if the profile file or the reference profile changes
        later, and reading it back resolves to the same model).

        Raises:
            TestbedError: the profile cannot be loaded.
        """
        values, _, machine = self._values()
        return {"profile": self.profile, **values, "machine_rates": machine}

    def resolve(self) -> HostModel:
        """The rates in force: the profile's, overridden by the fields written inline.

        Raises:
            TestbedError: the profile cannot be loaded.
        """
        values, sources, machine = self._values()
        gb = 1e9
        return HostModel(
            message_overhead_s=(values["message_overhead_us"] or 0.0) * 1e-6,
            request_startup_s=(values["request_startup_ms"] or 0.0) * 1e-3,
            aggregate_bytes_per_s=values["aggregate_gb_per_s"] and values["aggregate_gb_per_s"] * gb,
            optimizer_bytes_per_s=values["optimizer_gb_per_s"] and values["optimizer_gb_per_s"] * gb,
            codec_bytes_per_s=values["codec_gb_per_s"] and values["codec_gb_per_s"] * gb,
            sources=sources,
            machine_kinds=frozenset(MACHINE_RATE_KINDS[f] for f in machine if values[f] is not None),
        )


class SourcedValue(SpecModel):
    """One value of a host profile and where it comes from."""

    value: float | None = None
    """The value in the field's unit; null: not stated (resolves to the reference profile's)."""
    source: str
    """A paper's table, figure or sentence (quoted), or a measurement with its command, or why
    there is none."""
    scope: Literal["process", "machine"] = "process"
    """``machine``: the rate is the whole emulated host's, shared by every process and thread
    on that host (one clock per host, :class:`traffic.hostmodel.machine.HostMachine`);
    ``process``: each process has it. Only the three rates may be machine-scoped."""

    @field_validator("value")
    @classmethod
    def _non_negative(cls, v):
        if v is not None and v < 0:
            raise ValueError("a number >= 0 or null")
        return v

    @field_validator("source")
    @classmethod
    def _stated(cls, v):
        if not v.strip():
            raise ValueError("a non-empty statement of where the value comes from")
        return v


class HostProfile(SpecModel):
    """A host profile file: a description and every rate with its source."""

    description: str
    """What system this is (which paper, which hosts)."""
    message_overhead_us: SourcedValue
    request_startup_ms: SourcedValue
    aggregate_gb_per_s: SourcedValue
    optimizer_gb_per_s: SourcedValue
    codec_gb_per_s: SourcedValue

    @field_validator(*(f for f in RATE_FIELDS if f not in MACHINE_RATE_KINDS))
    @classmethod
    def _process_scoped(cls, v: SourcedValue) -> SourcedValue:
        if v.scope != "process":
            raise ValueError(
                "scope: process (a per-message or per-request cost is each process's; only "
                f"{', '.join(MACHINE_RATE_KINDS)} may be scope: machine)"
            )
        return v

    def __getitem__(self, name: str) -> SourcedValue:
        return getattr(self, name)


def available_host_profiles() -> list[str]:
    """Names of the shipped host profiles, sorted."""
    return sorted(p.stem for p in DATA_DIR.glob("*.yaml"))


def load_host_profile(ref: str) -> HostProfile:
    """The host profile ``ref``: a shipped name or the path of a profile file.

    Raises:
        TestbedError: no such profile, not YAML, or a malformed field (named).
    """
    path = DATA_DIR / f"{ref}.yaml"
    if not path.is_file():
        path = Path(ref)
    if not path.is_file():
        raise TestbedError(
            f"no host profile {ref!r}: one of {', '.join(available_host_profiles()) or 'none'}, "
            "or the path of a host profile file (testbed profile --host writes one)"
        )
    # the messages name the file, the place and the fields, never the file's content: a
    # path is read with the tool's privileges (root), so its lines must not be echoed
    try:
        data = load_yaml(path.read_text(), source=str(path))
    except UnicodeDecodeError as e:
        raise TestbedError(f"host profile {path} is not a text file (byte {e.start} is not UTF-8)") from None
    except SpecError as e:  # a key given twice (also a YAMLError): its lines, never the key itself
        raise TestbedError(f"host profile {path} is not a host profile ({e.allowed})") from None
    except yaml.YAMLError as e:  # (load_yaml's messages quote no line of the file)
        raise TestbedError(f"host profile {path} is not valid YAML ({e})") from None
    try:
        return validate(HostProfile, data, "")
    except SpecError as e:
        known = set(HostProfile.model_fields)
        lines = [f"{x.field}: {x.allowed}" for x in e.errors if x.field.split(".")[0] in known]
        other = len(e.errors) - len(lines)
        if other:  # a key that is no field (or no mapping at all) is the file's content: not shown
            lines.append(
                f"{other} key(s) or value(s) that are not fields of a host profile (not shown); a profile "
                f"is a mapping of {', '.join(HostProfile.model_fields)}"
            )
        raise TestbedError(f"host profile {path} is not a host profile: {'; '.join(lines)}") from None


@dataclass(frozen=True)
class HostModel:
    """Resolved host rates in SI units of the emulated host. :meth:`HostSpec.resolve` never
    leaves a rate None (a value stated nowhere is the reference profile's); None, as in a
    bare ``HostModel()``, is not modelled: the work is charged its real time.

    Attributes:
        machine_kinds: the kinds (``aggregate``, ``optimizer``, ``codec``) whose stated rate
            is the whole host's: charged on the host's one shared clock
            (:class:`traffic.hostmodel.machine.HostMachine`), not per process.
    """

    message_overhead_s: float = 0.0
    request_startup_s: float = 0.0
    aggregate_bytes_per_s: float | None = None
    optimizer_bytes_per_s: float | None = None
    codec_bytes_per_s: float | None = None
    sources: dict | None = None
    machine_kinds: frozenset[str] = frozenset()

    def cost_s(self, kind: str, nbytes: int = 0) -> float | None:
        """Emulated seconds of one operation of ``kind`` on ``nbytes`` bytes; None when the
        kind is not modelled.

        Kinds: ``message`` (one message sent or received), ``request_startup`` (one pull
        request answered), ``aggregate`` (``nbytes`` of incoming gradient summed),
        ``optimizer`` (``nbytes`` of parameters updated), ``codec`` (``nbytes`` of
        uncompressed data compressed or decompressed).

        Raises:
            ValueError: an unknown kind.
        """
        if kind == "message":
            return self.message_overhead_s
        if kind == "request_startup":
            return self.request_startup_s
        rate = {
            "aggregate": self.aggregate_bytes_per_s,
            "optimizer": self.optimizer_bytes_per_s,
            "codec": self.codec_bytes_per_s,
        }
        if kind not in rate:
            raise ValueError(f"unknown host cost kind {kind!r}")
        return None if rate[kind] is None else nbytes / rate[kind]
