"""Experiment specs: YAML -> validated, typed :class:`Experiment`; overrides and sweeps.

A spec has the sections ``topology`` (owned by :mod:`topologies.spec`), ``workload``
(:mod:`traffic.spec`; its ``options`` by the scheme), ``host`` (:mod:`traffic.hostmodel`), and ``capture``, ``run``,
``background``, ``sweep``, ``variants``, ``scale`` and ``name`` (this module), and ``events``
(:mod:`traffic.event_spec`, which the runtime reads too). Every field has
a default, so ``{}`` is a valid spec. Validation happens before anything is built; every
malformed field is reported at once in one :class:`SpecError` naming each dotted field, the
value given and what is allowed.

Example::

    exp = load_spec("experiments/quickstart.yaml", overrides=["workload.iterations=20"])
    for point, e in expand_sweep(exp): ...
"""

from __future__ import annotations

import copy
import itertools
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, PrivateAttr, ValidationError, field_validator

from common.errors import FieldError, SpecError, TestbedError, show_value
from common.provenance import Provenance
from common.validation import (
    SAFE_LABEL_ALLOWED,
    SAFE_NAME_ALLOWED,
    SpecFileError,
    SpecModel,
    check_depth,
    field_errors,
    is_safe_label,
    is_safe_name,
    load_yaml,
    safe_name,
    to_safe_name,
)
from testbed.background import BASE_PORT, IPERF3_MAX_TIME_S, IPERF3_MIN_RATE_BPS, MAX_FLOWS
from topologies.spec import MAX_HOSTS, MAX_INTERFACES, MAX_RATE_MBPS, TopologySpec
from traffic import rundir
from traffic.event_spec import ScheduledEvent, event_errors
from traffic.hostmodel import HostSpec
from traffic.spec import WorkloadSpec, option_errors

__all__ = [
    "Experiment",
    "CaptureSpec",
    "PcapSpec",
    "RunSpec",
    "BackgroundFlow",
    "ScheduledEvent",
    "TopologySpec",
    "WorkloadSpec",
    "from_dict",
    "load_spec",
    "parse_override",
    "expand_sweep",
    "dump_spec",
    "with_scale",
    "AUTO",
    "MAX_POINTS",
]

#: ``scale: auto``: the dilation chosen from the machine's cost model at planning
AUTO = "auto"

#: the most runs (variants x sweep points) one spec may ask for
MAX_POINTS = 1000

#: the longest ``run.timeout_s``, seconds: 2**31 - 1 ms, 24.8 days. Every time a run waits
#: for lies inside it (:meth:`Experiment.cross_errors`: capture periods, the pcap window,
#: events' ``at_s``, background flows' starts, link delays), and the longest of those, bwm-ng's
#: period ``-t`` in ms, is an unsigned int that bwm-ng doubles (``avg_length = 2 x delay + 1``,
#: src/options.c), which holds up to 2**31 - 1 ms. Python's waits (``threading.Timer``,
#: ``time.sleep``: at most ``threading.TIMEOUT_MAX``, 292 years) are far from it.
MAX_TIMEOUT_S = (2**31 - 1) / 1000


class BackgroundFlow(SpecModel):
    """One background flow: iperf3 from host ``src`` to host ``dst`` (:mod:`testbed.background`).

    Hosts must exist in the built topology (checked when the network is up). A flow still
    running when training ends is stopped with it.
    """

    src: str
    """Sending host, e.g. ``bg1``."""
    dst: str
    """Receiving host."""
    rate_mbps: float = Field(gt=0)
    """Sending rate in emulated Mbit/s (shaped at rate / ``scale`` like links): iperf3's
    ``-b``, in bit/s, must round to at least 1 (``-b 0`` is no limit) and be at most
    :data:`~topologies.spec.MAX_RATE_MBPS` (no link is faster)."""
    duration_s: float = Field(gt=0)
    """Emulated seconds; ``duration_s * scale`` must be whole seconds in [1, 86400] (iperf3
    ``-t``; :data:`testbed.background.IPERF3_MAX_TIME_S`)."""
    start_s: float = Field(0.0, ge=0)
    """Start in emulated seconds after the training processes are launched; ``start_s *
    scale`` below ``run.timeout_s`` (the flow would never start)."""
    protocol: Literal["tcp", "udp"] = "tcp"
    """``tcp`` (paced at the rate; backs off under congestion) or ``udp`` (constant rate)."""
    name: str | None = None
    """File name of its results (default ``bg<index>``): a safe name (letters, digits, ``_``,
    ``-``, ``.``; no leading ``.``)."""


class PcapSpec(SpecModel):
    """Header capture with tcpdump on chosen switch ports (:mod:`testbed.capture.pcap`), read by
    :func:`analysis.flows`. Off unless given."""

    ports: list[str] = Field(min_length=1)
    """``uplinks`` (the ToR end of every uplink), ``host:<name>`` (the ToR port facing that
    host) or switch port names (``tor1-eth3``); an unknown one is refused before anything is
    built."""
    snaplen_bytes: int = Field(128, ge=96, le=65535)
    """Bytes kept of each packet: 128 holds Ethernet, IP and TCP headers with options. Flow
    bytes come from the IP length, not from what was kept."""
    filter: str | None = "tcp"
    """A BPF filter expression (tcpdump's syntax, e.g. ``tcp and port 29500``) or null for
    every packet; checked with libpcap's compiler before anything is built."""
    start_s: float = Field(0.0, ge=0)
    """Start this many emulated seconds after the training processes are launched (a time
    window for runs whose whole capture would be too large to analyse); ``start_s x scale``
    below ``run.timeout_s`` (a window starting later captures nothing; its timer is a
    ``threading.Timer``, which overflows beyond ``threading.TIMEOUT_MAX``)."""
    duration_s: float | None = Field(None, gt=0)
    """Stop after this many emulated seconds (null: with the run); ``duration_s x scale`` at
    most ``run.timeout_s`` (for as long as the run, leave it null)."""

    @field_validator("filter")
    @classmethod
    def _bpf(cls, v):
        if v is None or not v.strip():
            return None
        from scapy.arch.common import compile_filter  # lazy: scapy is slow to import (docs/scaling.md)
        from scapy.error import Scapy_Exception  # lazy: as above

        try:
            compile_filter(v, linktype=1)  # DLT_EN10MB, as the switch ports
        except Scapy_Exception as e:
            raise ValueError(f"a BPF filter libpcap can compile ({e})") from None
        except (OSError, ImportError) as e:  # no libpcap: tcpdump is missing too
            raise ValueError(
                f"a BPF filter; none can be checked here without libpcap (apt-get install tcpdump): {e}"
            ) from None
        return v


class CaptureSpec(SpecModel):
    """What the harness records while a run trains (periods in milliseconds of wall clock,
    each at most ``run.timeout_s``: a longer period takes no sample before the run ends, and
    bwm-ng holds its period in a 32-bit count of ms, :data:`MAX_TIMEOUT_S`)."""

    interval_ms: int = Field(10, gt=0)
    """bwm-ng's period (10 ms, as P3's evaluation)."""
    qdisc: bool = True
    """Sample the uplinks' qdisc counters."""
    qdisc_interval_ms: int = Field(50, gt=0)
    """The qdisc sampler's period; every sample costs the harness's CPU (pyroute2 decodes every
    qdisc of the root namespace; measured in ``docs/scaling.md``), so the default is 50 ms; set
    10 for queue dynamics at bwm-ng's resolution on a run with CPU to spare."""
    cpu: bool = True
    """Sample per-core and per-process CPU use."""
    cpu_interval_ms: int = 100
    """The CPU sampler's period, an integer >= 10."""
    endpoints: bool = True
    """Record which training process owns which TCP endpoints (``traces/endpoints.csv``,
    :mod:`testbed.capture.endpoints`): what attributes captured flows to processes."""
    endpoints_interval_ms: int = Field(500, ge=50)
    """The endpoint sampler's period."""
    pcap: PcapSpec | None = None
    """Header capture on chosen ports (off by default)."""

    @field_validator("cpu_interval_ms")
    @classmethod
    def _cpu_period(cls, v):
        if v < 10:
            raise ValueError("an integer >= 10")
        return v


class RunSpec(SpecModel):
    """How the run is driven: time limit, where run directories go, an optional fixed id."""

    timeout_s: float = Field(600.0, gt=0, le=MAX_TIMEOUT_S)
    """Limit of the whole run, seconds of wall clock, at most :data:`MAX_TIMEOUT_S`
    (2,147,483.647 s); every time the run waits for (dilated) must fall inside it."""
    runs_dir: str = "runs"
    """Where run directories are created (nothing of a run is written outside it)."""
    id: str | None = None
    """A fixed run id (the run fails if its directory exists): a safe name (letters, digits,
    ``_``, ``-``, ``.``; no leading ``.`` or ``-``; at most 100 characters)."""
    master_port: int = 29500
    """The torch.distributed rendezvous port, in [1024, 65535], and no background flow's
    iperf3 port (:data:`testbed.background.BASE_PORT` + its index)."""
    launcher: Literal["zygote", "exec"] = "zygote"
    """How training processes start (:mod:`testbed.launch`): ``zygote`` forks each from one
    process per run that imported torch and the runtime once (start-up in seconds);
    ``exec`` runs ``python -m traffic.runtime`` per process (each imports everything)."""
    force: bool = False
    """Run even when the capacity check (:mod:`testbed.capacity`) estimates more memory than
    the machine has available: the refusal becomes a warning."""

    @field_validator("master_port")
    @classmethod
    def _port(cls, v):
        if not 1024 <= v < 65536:
            raise ValueError("a port in [1024, 65535]")
        return v

    @field_validator("id")
    @classmethod
    def _id(cls, v):
        return v if v is None else safe_name(v)


class ClusterSpec(SpecModel):
    """The machines an experiment spans."""

    machines: list[str] = Field(min_length=1)
    """SSH addresses (host names or IP addresses), each once; the first holds the core switch."""
    user: str = "root"
    """The user SSH logs in as on every machine (it must be root)."""
    placement: Literal["rack"] = "rack"
    """How nodes are placed: ``rack`` keeps each rack whole on one machine (only uplinks cross)."""
    tunnel: Literal["gre", "vxlan"] = "gre"
    """What carries a link between machines: ``gre`` (Mininet's RemoteGRELink, ``gretap``) or
    ``vxlan`` (for kernels without GRE); both leave a 1,450-byte MTU."""
    project_dir: str | None = None
    """Where this project is on the machines (its ``.venv`` inside); default: the same path as here."""
    ssh_port: int = Field(22, gt=0, lt=65536)
    """The machines' SSH port."""
    identity_file: str | None = None
    """A private key for SSH (``ssh -i``); default: SSH's own."""
    known_hosts_file: str | None = None
    """A known-hosts file for SSH (``UserKnownHostsFile``); default: SSH's own."""

    @field_validator("machines")
    @classmethod
    def _machines(cls, v: list[str]) -> list[str]:
        bad = [m for m in v if not re.fullmatch(r"[A-Za-z0-9_.:-]+", m)]
        if bad:
            raise ValueError(f"host names or IP addresses (letters, digits, '.', '-', '_', ':'; got {bad[0]!r})")
        local = [m for m in v if m == "localhost" or m.startswith("127.")]
        if local:
            raise ValueError(
                f"addresses the other machines reach (not {local[0]!r}: tunnels are addressed from the other end too)"
            )
        repeated = sorted({m for m in v if v.count(m) > 1})
        if repeated:
            raise ValueError(f"each machine once (repeated: {', '.join(repeated)})")
        return v

    @field_validator("user")
    @classmethod
    def _user(cls, v: str) -> str:
        if not re.fullmatch(r"[a-z_][a-z0-9_-]*", v):
            raise ValueError("a user name (lowercase letters, digits, '_', '-')")
        return v


class Experiment(SpecModel):
    """A whole experiment spec.

    ``scale`` is the time dilation factor s: every link runs at its bandwidth / s (and its
    delay * s) and emulated compute takes s times its profiled time, so the ratio of
    communication to computation is that of the emulated network while the machine runs s
    times slower. Everything reported is converted back to the emulated network's time.
    s != 1 needs ``workload.compute.mode: emulated`` (real compute cannot be slowed down).

    ``scale: auto`` (the default) is resolved when a run is planned, from this machine's
    measured cost model (:func:`testbed.capacity.auto_scale`): 1 with real compute;
    with emulated compute the smallest whole number >= 1 at which the run's CPU estimate
    keeps 35 % of the cores idle. The run's ``spec.yaml`` records the number it ran at.
    """

    name: str = "experiment"
    """Name of the experiment (run ids start with it): letters, digits, ``_``, ``-``, ``.``; no
    leading ``.`` or ``-``; at most 100 characters. Left out in a spec file: the file's name."""
    scale: Annotated[float, Field(gt=0)] | Literal["auto"] = "auto"
    """Time dilation factor (see above): a number > 0, or ``auto`` (the default)."""
    topology: TopologySpec = Field(default_factory=TopologySpec)
    """The emulated network."""
    workload: WorkloadSpec = Field(default_factory=WorkloadSpec)
    """What trains."""
    host: HostSpec = Field(default_factory=HostSpec)
    """The emulated host's non-network costs (a host profile and rates; :mod:`traffic.hostmodel`)."""
    capture: CaptureSpec = Field(default_factory=CaptureSpec)
    """What is recorded."""
    run: RunSpec = Field(default_factory=RunSpec)
    """How the run is driven."""
    sweep: dict[str, Any] = Field(default_factory=dict)
    """Dotted field paths -> lists of values; the runs are every combination."""
    variants: list[Any] = Field(default_factory=list)
    """Arms: each a mapping of dotted field paths to values (and an optional ``name``, a label
    such as ``D-Sync+T``: letters, digits and ``_-.+=@%,``, unique), for settings that go
    together (a scheme and its options); combined with every sweep point."""
    background: list[BackgroundFlow] = Field(default_factory=list)
    """iperf3 flows between hosts during the run, e.g. to load the core."""
    cluster: ClusterSpec | None = None
    """The machines the racks are spread over (:mod:`testbed.remote`): none (the
    default) builds everything on this machine."""
    events: list[ScheduledEvent] = Field(default_factory=list)
    """Scheduled events (:mod:`traffic.event_spec`): each one trigger (``at_s``: emulated
    seconds from the start of the first measured iteration; ``at_iteration``: a global
    iteration index) and one action (a link's rate ``{link, bw_mbps}``, ``{link, down:
    true}``, ``{link, up: true}``, a straggler ``{host, compute_slowdown}``, ``{kill:
    <process>}``); links are ``uplink:<tor>`` or ``host:<host>``. Applied by the harness
    (:mod:`testbed.event_applier`) and recorded in the run's ``schedule.jsonl``."""

    # the spec as given (before defaults), from which sweep and variant points are built
    _given: dict = PrivateAttr(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, v):
        return safe_name(v)

    def to_dict(self) -> dict:
        """The spec as a mapping, every default filled in (what ``spec.yaml`` holds); the
        ``host`` section with its rates resolved (:meth:`traffic.hostmodel.HostSpec.pinned`: a
        field left out would otherwise be written as an explicit null and, read back,
        override the profile's value)."""
        d = self.model_dump(mode="python")
        d["host"] = self.host.pinned()
        d["events"] = [e.given() for e in self.events]  # as written: no null fields
        return d

    def _cluster_errors(self) -> list[FieldError]:
        """What a cluster run cannot do: a placement that cannot be made (rack placement keeps
        racks whole and joins them through a core), and the parts of a run not yet carried
        across machines (pcap; a ``compute_slowdown`` of real compute, which throttles
        with a cgroup here)."""
        c = self.cluster
        if c is None:
            return []
        out = []
        n = len(c.machines)
        if n > self.topology.racks:
            out.append(
                FieldError(
                    "cluster.machines",
                    c.machines,
                    f"at most {self.topology.racks} machines (placement 'rack' keeps each rack whole on one machine)",
                )
            )
        if n > 1 and self.topology.kind != "rack_core":
            out.append(
                FieldError(
                    "topology.kind",
                    self.topology.kind,
                    "'rack_core' with a cluster of several machines "
                    "(racks on different machines are joined through the core)",
                )
            )
        real_slowdown = self.workload.compute.mode == "real" and any(e.kind == "compute_slowdown" for e in self.events)
        for path, used in (("events", real_slowdown), ("capture.pcap", self.capture.pcap is not None)):
            if used:
                out.append(
                    FieldError(
                        path,
                        "set",
                        "left out with a cluster (not yet carried across machines; "
                        "run it on one machine)"
                        + (
                            ": a compute_slowdown of real compute throttles a host with a cgroup of this machine"
                            if path == "events"
                            else ""
                        ),
                    )
                )
        return out

    def _size_errors(self) -> list[FieldError]:
        """Counts that size the network, checked before a scheme turns them into hosts: workers
        within the worker hosts, servers and their links within :data:`MAX_HOSTS` and
        :data:`MAX_INTERFACES` (the topology's own counts: :meth:`TopologySpec.cross_errors`)."""
        t, w = self.topology, self.workload
        out = []
        if w.workers > t.racks * t.hosts_per_rack:
            out.append(
                FieldError(
                    "workload.workers", w.workers, f"at most {t.racks * t.hosts_per_rack} (the topology's worker hosts)"
                )
            )
        if w.servers.count > MAX_HOSTS:
            out.append(FieldError("workload.servers.count", w.servers.count, f"at most {MAX_HOSTS}"))
        if w.servers.interfaces > MAX_INTERFACES:
            out.append(FieldError("workload.servers.interfaces", w.servers.interfaces, f"at most {MAX_INTERFACES}"))
        return out

    def _port_errors(self) -> list[FieldError]:
        """``run.master_port`` (rank 0's TCPStore, on the first process's host) apart from
        every fixed port a run listens on: flow i's iperf3 server on ``BASE_PORT + i``
        (:mod:`testbed.background`). The rest listen on ports the kernel picks (gloo's pairs,
        bound to port 0); ``testbed.remote``'s VXLAN port is UDP in the machines' root
        namespaces, never a host's."""
        i = self.run.master_port - BASE_PORT
        if 0 <= i < len(self.background):
            return [
                FieldError(
                    "run.master_port",
                    self.run.master_port,
                    f"a port no background flow listens on: background[{i}]'s iperf3 server listens on "
                    f"{self.run.master_port} (port {BASE_PORT} + its index; the flows take {BASE_PORT}.."
                    f"{BASE_PORT + len(self.background) - 1}), e.g. 29500",
                )
            ]
        return []

    def _timing_errors(self, scale: float) -> list[FieldError]:
        """Times the run waits for, each inside ``run.timeout_s`` (the run is stopped before a
        later one comes; ``run.timeout_s`` is far below what ``threading.Timer`` and
        ``time.sleep`` take): a link's one-way delay (x ``scale``, as every emulated time);
        the capture periods (wall-clock ms); the pcap window's start and length; the host's
        smallest costs (:class:`traffic.hostmodel.HostSpec`: one message, one pull request,
        one float32 element at each rate). Events' ``at_s``
        (:func:`traffic.event_spec.event_errors`) and background flows' starts
        (:func:`_background_errors`) are checked with them."""
        T, c, t = self.run.timeout_s, self.capture, self.topology
        out = []

        def within(field, value, seconds, what, strict=True):
            if not (seconds < T if strict else seconds <= T):
                out.append(
                    FieldError(
                        field,
                        value,
                        f"a value for which {what} ({seconds:g} s) is "
                        f"{'below' if strict else 'at most'} run.timeout_s ({T:g} s)",
                    )
                )

        within("topology.delay_ms", t.delay_ms, t.delay_ms * scale / 1000, f"a link's one-way delay x scale {scale:g}")
        periods = [
            ("interval_ms", True),
            ("qdisc_interval_ms", c.qdisc),
            ("cpu_interval_ms", c.cpu),
            ("endpoints_interval_ms", c.endpoints),
        ]
        for name, on in periods:
            if on:
                within(f"capture.{name}", getattr(c, name), getattr(c, name) / 1000, "the sampling period", False)
        if c.pcap is not None:
            within(
                "capture.pcap.start_s",
                c.pcap.start_s,
                c.pcap.start_s * scale,
                f"the capture window's start x scale {scale:g}",
            )
            if c.pcap.duration_s is not None:
                within(
                    "capture.pcap.duration_s",
                    c.pcap.duration_s,
                    c.pcap.duration_s * scale,
                    f"the capture window's length x scale {scale:g} (null: until the run ends)",
                    False,
                )
        try:
            h, given = self.host.resolve(), self.host.pinned()
        except (TestbedError, OSError, ValueError):  # an unreadable profile: host.cross_errors names it
            return out
        costs = [
            ("message_overhead_us", h.message_overhead_s, "one message's software cost"),
            ("request_startup_ms", h.request_startup_s, "one pull request's start-up cost"),
        ]
        costs += [
            (f, 4 / r if r else 0.0, "one float32 element's cost at this rate")
            for f, r in (
                ("aggregate_gb_per_s", h.aggregate_bytes_per_s),
                ("optimizer_gb_per_s", h.optimizer_bytes_per_s),
                ("codec_gb_per_s", h.codec_bytes_per_s),
            )
        ]
        for name, seconds, what in costs:
            within(f"host.{name}", given[name], seconds * scale, f"{what} x scale {scale:g}")
        return out

    def cross_errors(self) -> list[FieldError]:
        """Checks that involve several fields or sections (every field being valid).

        Under ``scale: auto`` the checks that only get stricter as the scale grows (shaped
        rates' minimum, dilated times inside ``run.timeout_s``, background flows' iperf3
        limits) are made at 1, the least ``auto`` resolves to; every check is made again at
        the scale it resolves to (:func:`with_scale`)."""
        out = self.topology.cross_errors() + self.workload.cross_errors() + self._size_errors()
        t, s = self.topology, self.scale
        low = 1.0 if s == AUTO else s
        out += event_errors(
            self.events,
            iterations=self.workload.iterations,
            topology_kind=t.kind,
            scale=s,
            timeout_s=self.run.timeout_s,
        )
        if self.workload.max_warmup_iterations is not None and self.events:
            out.append(
                FieldError(
                    "events",
                    f"{len(self.events)} event(s)",
                    "none with "
                    "workload.max_warmup_iterations (the measured iterations are chosen once the run "
                    "is analysed, so an event's time and the iterations around it would not be known "
                    "when it is applied), or leave max_warmup_iterations out",
                )
            )
        try:
            out += self.host.cross_errors()
        except (OSError, ValueError) as e:  # a profile path the OS refuses (too long, ...)
            out.append(
                FieldError(
                    "host.profile",
                    self.host.profile,
                    f"a shipped host profile or the path of a readable one ({type(e).__name__}: {e})",
                )
            )
        out += self._cluster_errors() + self._port_errors()
        if s == AUTO:  # resolved at planning (testbed.capacity.auto_scale), then checked again
            return out + t.rate_errors(low, upper=False) + self._timing_errors(low) + _background_errors(self)
        if not (math.isfinite(t.delay_ms * s) and t.host_bw_mbps / s > 0 and t.uplink_mbps() / s > 0):
            out.append(
                FieldError(
                    "scale",
                    s,
                    f"a factor that keeps the dilated links finite and non-zero "
                    f"(delay_ms x scale = {t.delay_ms * s:g}, host_bw_mbps / scale = "
                    f"{t.host_bw_mbps / s:g} Mbit/s)",
                )
            )
        else:
            out += t.rate_errors(s) + self._timing_errors(s)
        if self.scale != 1 and self.workload.compute.mode != "emulated":
            out.append(
                FieldError(
                    "scale",
                    self.scale,
                    "1 unless workload.compute.mode is 'emulated' (time "
                    "dilation slows emulated compute and links; real compute cannot be slowed)",
                )
            )
        out += _background_errors(self)
        return out


# ---------------------------------------------------------------------------- building


def _set_path(data: dict, path: str, value) -> None:
    """Set the dotted ``path`` of ``data`` to ``value``, creating mappings on the way.

    Raises:
        SpecError: an empty part in ``path``, or a part that is not a mapping.
    """
    keys = path.split(".")
    if not all(keys):
        raise SpecError(path, value, "a dotted path of field names with no empty part, e.g. workload.iterations")
    node = data
    for k in keys[:-1]:
        nxt = node.setdefault(k, {})
        if not isinstance(nxt, dict):
            raise SpecError(path, value, f"a path into a mapping, but '{k}' is {show_value(nxt)}")
        node = nxt
    node[keys[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """Parse ``path.to.field=value`` (value in YAML syntax) into ``(path, value)``.

    Raises:
        SpecError: no ``=``, an empty path, or a value that is not YAML; a key given twice in
            the value names its dotted path below ``path`` (:class:`~common.validation.DuplicateKeyError`).
    """
    if "=" not in text:
        raise SpecError("--set", text, "path.to.field=value, e.g. workload.iterations=20")
    path, raw = text.split("=", 1)
    if not path.strip():
        raise SpecError("--set", text, "a non-empty field path before '='")
    try:
        return path.strip(), load_yaml(raw, source=f"the --set value {text}", prefix=path.strip())
    except SpecError:
        raise
    except yaml.YAMLError as e:
        raise SpecError("--set", text, f"a value in YAML syntax ({e})") from None


def _validate(data: dict) -> Experiment:
    """One validation of a point (no sweep expansion): every error at once."""
    errors: list[FieldError] = []
    exp = None
    try:
        exp = Experiment.model_validate(data)
    except ValidationError as e:
        errors += field_errors(e, Experiment)
    errors += [e for e in option_errors(data.get("workload")) if e.field not in {x.field for x in errors}]
    if exp is not None and not errors:
        errors += exp.cross_errors()
    if errors:
        raise SpecError.of(errors)
    exp._given = data
    return exp


def from_dict(data: dict, overrides: list[str] | None = None) -> Experiment:
    """Validate a spec given as a mapping (plus ``--set`` overrides) into an Experiment,
    checking that every variant and sweep point is valid too. An override of a field the
    spec sweeps replaces that sweep axis (``--set workload.scheme=ps`` on a spec sweeping
    the scheme runs ``ps`` only).

    Raises:
        SpecError: every malformed field, by dotted path.
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError("<spec>", data, f"a YAML mapping with sections {', '.join(Experiment.model_fields)}")
    check_depth(data)
    data = copy.deepcopy(data)
    for text in overrides or []:
        path, value = parse_override(text)
        _set_path(data, path, value)
        if isinstance(data.get("sweep"), dict):
            data["sweep"].pop(path, None)  # an override of a swept field wins over the sweep axis
    check_depth(data)
    exp = _validate(data)
    _check_points(exp)
    return exp


def load_spec(path: str | Path, overrides: list[str] | None = None) -> Experiment:
    """Read a YAML spec file and validate it (see :func:`from_dict`).

    A spec without ``name`` is named after its file (made safe: ``my spec.yaml`` is
    ``my-spec``).

    Raises:
        SpecError: the file is missing or unreadable, is not YAML (:class:`~common.validation.SpecFileError`,
            naming the file, line and column) or not UTF-8, a key is given twice in a mapping (named by its dotted
            path, with both lines and the file:
            :class:`~common.validation.DuplicateKeyError`), or fields are malformed.
    """
    p = Path(path)
    try:
        if not p.is_file():
            raise SpecError("<file>", str(path), "the path of an existing YAML spec file")
        text = p.read_text()
    except (OSError, ValueError) as e:  # a path the OS refuses (too long, NUL), unreadable, not UTF-8
        raise SpecError("<file>", str(path), f"a readable UTF-8 YAML spec file ({type(e).__name__}: {e})") from None
    try:
        data = load_yaml(text, source=str(path))
    except SpecError:
        raise
    except yaml.YAMLError as e:
        raise SpecFileError(str(path), e) from None
    data = {} if data is None else data
    if isinstance(data, dict) and "name" not in data:
        data["name"] = to_safe_name(p.stem)
    _program_cwd(data, p.resolve().parent)
    _trace_path(data, p.resolve().parent)
    return from_dict(data, overrides)


def _program_cwd(data, folder: Path) -> None:
    """``workload.program.cwd`` of a spec file made absolute: relative to the file's
    ``folder``, which it is when left out (a malformed section is left to validation)."""
    w = data.get("workload") if isinstance(data, dict) else None
    prog = w.get("program") if isinstance(w, dict) else None
    if isinstance(prog, dict) and (prog.get("cwd") is None or isinstance(prog.get("cwd"), str)):
        try:
            prog["cwd"] = str(folder / prog["cwd"]) if prog.get("cwd") else str(folder)
        except (OSError, ValueError):  # a path the OS refuses: validation names it
            pass


def _trace_path(data, folder: Path) -> None:
    """``workload.trace.path`` of a spec file made absolute: relative to the file's ``folder``
    (a malformed section is left to validation)."""
    w = data.get("workload") if isinstance(data, dict) else None
    trace = w.get("trace") if isinstance(w, dict) else None
    if isinstance(trace, dict) and isinstance(trace.get("path"), str) and trace["path"]:
        try:
            trace["path"] = str(folder / Path(trace["path"]).expanduser())
        except (OSError, ValueError):  # a path the OS refuses: validation names it
            pass


def _background_errors(exp: Experiment) -> list[FieldError]:
    """Background flows: distinct endpoints, file-safe unique names, at most
    :data:`~testbed.background.MAX_FLOWS` (one port each), and iperf3's limits once dilated
    (:mod:`testbed.background`): ``-b`` (rate_mbps x 1e6 / scale, rounded) at least
    :data:`~testbed.background.IPERF3_MIN_RATE_BPS` (0 is no limit) and at most
    :data:`~topologies.spec.MAX_RATE_MBPS` (no link is faster), ``-t`` (duration_s x scale) a
    whole number of seconds in [1, :data:`~testbed.background.IPERF3_MAX_TIME_S`], and the
    start (start_s x scale) below ``run.timeout_s``. Under ``scale: auto`` the checks a larger
    scale cannot pass are made at 1 (the least it resolves to), the rest once it is resolved.
    (Whether the hosts exist depends on the topology and the scheme's hosts:
    :func:`testbed.runner.plan_point` checks it before anything is built.)"""
    out, names = [], set()
    auto = exp.scale == AUTO
    scale, timeout = 1.0 if auto else exp.scale, exp.run.timeout_s
    if len(exp.background) > MAX_FLOWS:
        out.append(
            FieldError(
                "background",
                f"{len(exp.background)} flows",
                f"at most {MAX_FLOWS} flows (flow i's iperf3 server listens on TCP port {BASE_PORT} + i, "
                f"at most 65535)",
            )
        )
    for i, f in enumerate(exp.background):
        path = f"background[{i}]"
        if f.src == f.dst:
            out.append(FieldError(f"{path}.dst", f.dst, f"a host other than src ({f.src})"))
        bps = f.rate_mbps * 1e6 / scale
        if not (math.isfinite(bps) and round(bps) >= IPERF3_MIN_RATE_BPS and (auto or bps <= MAX_RATE_MBPS * 1e6)):
            out.append(
                FieldError(
                    f"{path}.rate_mbps",
                    f.rate_mbps,
                    f"a rate whose shaped value (iperf3's -b: rate_mbps x 1e6 / scale {scale:g} = {bps:g} "
                    f"bit/s) is at least {IPERF3_MIN_RATE_BPS} bit/s once rounded (-b 0 is no limit at "
                    f"all) and at most {MAX_RATE_MBPS:g} Mbit/s (no link is faster)",
                )
            )
        if not f.start_s * scale < timeout:
            out.append(
                FieldError(
                    f"{path}.start_s",
                    f.start_s,
                    f"a start whose dilated value (start_s x scale {scale:g} = {f.start_s * scale:g} s) is "
                    f"below run.timeout_s ({timeout:g} s): the run is stopped before it comes",
                )
            )
        dilated = f.duration_s * scale
        if not (
            math.isfinite(dilated)
            and (auto or abs(dilated - round(dilated)) <= 1e-9)
            and 1 - 1e-9 <= dilated <= IPERF3_MAX_TIME_S + 1e-9
        ):
            out.append(
                FieldError(
                    f"{path}.duration_s",
                    f.duration_s,
                    f"a duration that is a whole number of seconds in [1, {IPERF3_MAX_TIME_S}] once "
                    f"dilated: duration_s x scale = {dilated:g} (iperf3 -t takes whole seconds, at most "
                    f"{IPERF3_MAX_TIME_S})",
                )
            )
        name = f.name if f.name is not None else f"bg{i}"
        if not is_safe_name(name):
            out.append(FieldError(f"{path}.name", f.name, f"a file name: {SAFE_NAME_ALLOWED}"))
        elif name in names:
            out.append(FieldError(f"{path}.name", f.name, f"a name no other flow has ({name!r} is taken)"))
        names.add(name)
    return out


def _point_data(exp: Experiment, settings: dict) -> dict:
    """The spec as given, without sweep and variants, with ``settings`` (path -> value) set."""
    d = copy.deepcopy(exp._given)
    d["sweep"], d["variants"] = {}, []
    for path, value in settings.items():
        _set_path(d, path, value)
    return d


_POINT_KEYS = ("sweep", "variants")


def _axis_error(where: str, path: str, value) -> FieldError | None:
    """A dotted path a variant or sweep axis may not set: the sweep and variants themselves."""
    if path.split(".", 1)[0] in _POINT_KEYS:
        return FieldError(
            where, value, "a field path outside 'sweep' and 'variants' (a point cannot hold another sweep)"
        )
    return None


def _check_points(exp: Experiment) -> None:
    """Every variant and every swept value must give a valid spec.

    Raises:
        SpecError: a malformed variant (not a mapping of dotted paths, an unsafe or repeated
            name) or sweep axis (not a non-empty list), more than :data:`MAX_POINTS` points,
            or the errors of the first bad point.
    """
    errors, names = [], set()
    for i, v in enumerate(exp.variants):
        if not isinstance(v, dict) or not [k for k in v if k != "name"]:
            errors.append(
                FieldError(f"variants[{i}]", v, "a mapping of dotted field paths to values (and an optional name)")
            )
            continue
        for k in v:
            if not isinstance(k, str):
                errors.append(
                    FieldError(f"variants[{i}]", k, "keys that are dotted field paths (strings), e.g. workload.scheme")
                )
            elif k != "name" and (err := _axis_error(f"variants[{i}].{k}", k, v[k])):
                errors.append(err)
        if "name" in v:
            if not is_safe_label(v["name"]):
                errors.append(FieldError(f"variants[{i}].name", v["name"], SAFE_LABEL_ALLOWED))
            elif v["name"] in names:
                errors.append(FieldError(f"variants[{i}].name", v["name"], "a name no other variant has"))
            else:
                names.add(v["name"])
    for path, values in exp.sweep.items():
        if not isinstance(values, list) or not values:
            errors.append(FieldError(f"sweep.{path}", values, "a non-empty list of values"))
        elif err := _axis_error(f"sweep.{path}", path, values):
            errors.append(err)
    if errors:
        raise SpecError.of(errors)
    n = max(1, len(exp.variants)) * math.prod(len(v) for v in exp.sweep.values())
    if n > MAX_POINTS:
        raise SpecError(
            "sweep" if exp.sweep else "variants",
            {"variants": len(exp.variants), **{p: len(v) for p, v in exp.sweep.items()}},
            f"at most {MAX_POINTS} runs in all (variants x swept values), not {n}: split the sweep",
        )
    for v in exp.variants:
        _validate(_point_data(exp, {k: x for k, x in v.items() if k != "name"}))
    for path, values in exp.sweep.items():
        for value in values:
            _validate(_point_data(exp, {path: value}))


def expand_sweep(exp: Experiment) -> list[tuple[dict, Experiment]]:
    """All points of the spec: every variant combined with every point of the sweep, as
    ``(point, experiment)`` pairs.

    ``point`` maps each set path to its value (a named variant adds ``variant: <name>``);
    every experiment has an empty sweep and no variants. With neither the result is
    ``[({}, exp)]``.
    """
    if not exp.sweep and not exp.variants:
        return [({}, exp)]
    paths = list(exp.sweep)
    out = []
    for variant in exp.variants or [{}]:
        for combo in itertools.product(*(exp.sweep[p] for p in paths)):
            point = {"variant": variant["name"]} if "name" in variant else {}
            point.update({k: v for k, v in variant.items() if k != "name"})
            point.update(zip(paths, combo))
            out.append((point, _validate(_point_data(exp, {p: v for p, v in point.items() if p != "variant"}))))
    return out


def with_scale(exp: Experiment, scale: float) -> Experiment:
    """``exp`` (one point: no sweep) with ``scale`` set, validated again (the checks that
    depend on the scale: dilated links, real compute, whole dilated background seconds).

    Raises:
        SpecError: the point is invalid at ``scale``, naming each field.
    """
    return _validate(_point_data(exp, {"scale": scale}))


def dump_spec(exp: Experiment, provenance: Provenance | None = None) -> str:
    """The resolved spec as YAML (what ``runs/<id>/spec.yaml`` holds), headed by
    ``provenance`` as a comment block (:meth:`common.provenance.Provenance.comment`) when
    given: the spec loads, and runs again, as without it."""
    head = provenance.comment() if provenance is not None else ""
    return head + yaml.safe_dump(exp.to_dict(), sort_keys=False)


def write_spec(path: str | Path, exp: Experiment, provenance: Provenance | None = None) -> None:
    """Write ``exp`` as :func:`dump_spec` gives it (a run's ``spec.yaml``, headed by the run's
    ``provenance``; a sweep's ``sweep.yaml``); readable by its owner only (0600) when it holds
    a program's environment, which may carry secrets.

    Raises:
        OSError: the file cannot be written.
    """
    text = dump_spec(exp, provenance)
    program = exp.workload.program
    if program is not None and program.env:
        rundir.write_private(path, text)
    else:
        Path(path).write_text(text)
