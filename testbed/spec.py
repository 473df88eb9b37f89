"""Experiment specs: YAML -> validated, typed :class:`Experiment`; overrides and sweeps.

A spec has five sections (``topology``, ``workload``, ``capture``, ``run``, ``sweep``) and a
``name``. Every field has a default, so ``{}`` is a valid spec. Validation happens before
anything is built; a bad field raises :class:`SpecError` naming the dotted field, the value
and what is allowed.

Example::

    exp = load_spec("experiments/quickstart.yaml", overrides=["workload.iterations=20"])
    for point, e in expand_sweep(exp): ...
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

import yaml

from topologies.errors import SpecError


def _check(pred, msg):
    """Field validator: ``pred(value)`` must hold, else the error says ``msg``."""
    return {"check": (pred, msg)}


_pos = _check(lambda v: v > 0, "a number > 0")
_nonneg = _check(lambda v: v >= 0, "a number >= 0")


@dataclass
class TopologySpec:
    """The emulated datacenter.

    ``rack``: ``hosts_per_rack`` hosts on one top-of-rack (ToR) switch (``racks`` must be 1).
    ``rack_core``: ``racks`` racks of ``hosts_per_rack`` hosts; each ToR has one uplink to a
    core switch of ``uplink_bw_mbps``, by default ``hosts_per_rack * host_bw_mbps /
    oversubscription`` (Mbit/s). ``mtu_bytes`` is set on every interface (1500 is standard
    Ethernet; datacenters often run 9000-byte jumbo frames, which cut per-packet overhead).
    ``interfaces_per_host``: links from every host to its ToR, each shaped at
    ``host_bw_mbps`` with its own address (see :class:`testbed.network.Network`).
    ``background_hosts_per_rack``: extra hosts ``bg1..`` per rack (numbered rack by rack)
    that run no training process: endpoints for ``background`` flows, so that a busy core
    can be emulated without loading the workers' own links.
    ``tcp_notsent_lowat_bytes``: the hosts' ``net.ipv4.tcp_notsent_lowat`` (per network
    namespace): how many not-yet-sent bytes a TCP socket accepts before a sender blocks.
    ``null`` keeps the kernel's default (unlimited: a send "completes" once it is in a socket
    buffer that autotuning grows up to ``tcp_wmem``'s max, 16 MB here, i.e. 32 ms of a
    4 Gbit/s link); a small value (e.g. 131072) makes a blocking send's completion follow
    the network's pace, which application-level schedulers (P3's priority queue, P3 Sec. 4.3)
    rely on.
    """
    kind: Literal["rack", "rack_core"] = "rack_core"
    racks: int = field(default=2, metadata=_pos)
    hosts_per_rack: int = field(default=4, metadata=_pos)
    host_bw_mbps: float = field(default=100.0, metadata=_pos)
    uplink_bw_mbps: Optional[float] = field(default=None, metadata=_pos)
    oversubscription: float = field(default=1.0, metadata=_check(lambda v: v >= 1, "a ratio >= 1"))
    delay_ms: float = field(default=0.0, metadata=_nonneg)
    loss_pct: float = field(default=0.0, metadata=_check(lambda v: 0 <= v < 100, "a percentage in [0, 100)"))
    max_queue_packets: Optional[int] = field(default=None, metadata=_pos)
    interfaces_per_host: int = field(default=1, metadata=_pos)
    background_hosts_per_rack: int = field(default=0, metadata=_nonneg)
    mtu_bytes: int = field(default=1500, metadata=_check(lambda v: 576 <= v <= 9000,
                                                          "an MTU in [576, 9000] bytes (9000: jumbo frames)"))
    tcp_notsent_lowat_bytes: Optional[int] = field(default=None, metadata=_pos)

    def uplink_mbps(self) -> float:
        """ToR->core uplink rate in Mbit/s (explicit, or derived from oversubscription)."""
        if self.uplink_bw_mbps is not None:
            return float(self.uplink_bw_mbps)
        return self.hosts_per_rack * self.host_bw_mbps / self.oversubscription


#: PS configurations of PHub (phub.txt Section 2.1, Figure 4): placement and whether the
#: keys are centralized on one server process or sharded over several.
PS_CONFIGS = {"CC": ("colocated", "centralized"), "CS": ("colocated", "sharded"),
              "NCC": ("dedicated", "centralized"), "NCS": ("dedicated", "sharded")}


@dataclass
class ServersSpec:
    """Where parameter servers run (PS-family schemes only; other schemes ignore it).

    ``count``: servers per scope (per rack if ``scope: per_rack``); 0 means one per worker.
    Default 1 (or what ``config`` implies).
    ``placement``: ``colocated`` (a server process on a worker's host) or ``dedicated``
    (extra hosts ``ps1..`` that run only servers, added to the topology). Default
    ``colocated`` (or what ``config`` implies).
    ``interfaces``: links of each dedicated server host to its ToR (>= 1), each shaped like
    a host link (``topology.host_bw_mbps``) with its own address; a dedicated host with
    k > 1 interfaces is a PBox (phub.txt Section 3.3, Figure 9). A host has at least
    ``topology.interfaces_per_host`` links. More than 1 needs ``placement: dedicated``.
    A scheme's plan binds each server process to one of them (``ProcessPlan.iface``).

    ``config``: shorthand for the four PS configurations of phub.txt Section 2.1 and
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
    phub.txt Section 3.4). ``count`` and ``placement`` may be given with ``config`` only if
    they agree with it.

    Raises:
        SpecError: ``count`` or ``placement`` contradicts ``config`` (naming
            ``workload.servers.count`` / ``.placement``), or ``interfaces`` > 1 with colocated
            servers.
    """
    count: Optional[int] = field(default=None, metadata=_nonneg)
    placement: Optional[Literal["colocated", "dedicated"]] = None
    scope: Literal["global", "per_rack"] = "global"
    interfaces: int = field(default=1, metadata=_pos)
    config: Optional[Literal["CC", "CS", "NCC", "NCS"]] = None

    def __post_init__(self):
        # what the spec gave (None: not given); Experiment.to_dict(as_given=True) keeps it so
        # that a sweep or variant may set ``config`` on a spec that set no count/placement
        self._given = {"count": self.count, "placement": self.placement}
        if self.config is not None:
            placement, kind = PS_CONFIGS[self.config]
            if self.placement is not None and self.placement != placement:
                raise SpecError("workload.servers.placement", self.placement,
                                f"{placement!r} for servers.config {self.config} (phub.txt Figure 4), or leave it out")
            if self.count is not None and kind == "centralized" and self.count != 1:
                raise SpecError("workload.servers.count", self.count,
                                f"1 for servers.config {self.config} (centralized: one server process), or leave it out")
            if self.count is not None and kind == "sharded" and self.count == 1:
                raise SpecError("workload.servers.count", self.count,
                                f"0 (one per worker) or >= 2 for servers.config {self.config} "
                                "(sharded: several server processes), or leave it out")
            self.placement = placement
            if self.count is None:
                self.count = 1 if kind == "centralized" else 0
        if self.count is None:
            self.count = 1
        if self.placement is None:
            self.placement = "colocated"
        if self.interfaces > 1 and self.placement != "dedicated":
            raise SpecError("workload.servers.interfaces", self.interfaces,
                            "1 unless workload.servers.placement is 'dedicated' (colocated servers use "
                            "their worker host's links; topology.interfaces_per_host sets those)")
        self._resolved = {"count": self.count, "placement": self.placement}

    def as_given(self) -> dict:
        """``count`` and ``placement`` as the spec gave them: None where they were left to
        the default or to ``config`` (and not changed since)."""
        return {k: self._given[k] if getattr(self, k) == v else getattr(self, k) for k, v in self._resolved.items()}


@dataclass
class BackgroundFlow:
    """One background flow: iperf3 from host ``src`` to host ``dst`` (``testbed.background``).

    ``rate_mbps``: sending rate in emulated Mbit/s (shaped at rate / ``scale`` like links).
    ``start_s``: start in emulated seconds after the training processes are launched (their
    start-up counts). ``duration_s``: emulated seconds; ``duration_s * scale`` must be whole
    seconds (iperf3 ``-t``). A flow still running when training ends is stopped with it.
    ``protocol``: ``tcp`` (paced at the rate; backs off under congestion) or ``udp``
    (constant rate). ``name``: file name of its results (default ``bg<index>``).
    Hosts must exist in the built topology (checked when the network is up).
    """
    src: str
    dst: str
    rate_mbps: float = field(metadata=_pos)
    duration_s: float = field(metadata=_pos)
    start_s: float = field(default=0.0, metadata=_nonneg)
    protocol: Literal["tcp", "udp"] = "tcp"
    name: Optional[str] = None


@dataclass
class OptimizerSpec:
    """SGD with momentum (torch.optim.SGD semantics): v = m*v + g + wd*p; p -= lr*v."""
    lr: float = field(default=0.05, metadata=_pos)
    momentum: float = field(default=0.9, metadata=_check(lambda v: 0 <= v < 1, "a number in [0, 1)"))
    weight_decay: float = field(default=0.0, metadata=_nonneg)


@dataclass
class ComputeSpec:
    """How workers compute.

    ``mode: real``: forward and backward of the real model on real data (accuracy and
    convergence experiments). ``mode: emulated``: every layer's forward and backward take the
    time a profile gives (times ``scale``), slept precisely without burning CPU, while
    parameters and gradients stay real tensors of the layers' true sizes (throughput
    experiments). ``profile``: ``zero`` (infinitely fast compute: communication only, like
    PHub's ZeroComputeEngine, phub.txt Section 4.4), a device name with a profile for
    (``workload.model``, ``workload.batch_size``) in ``traffic/profiles/data/`` (e.g.
    ``gtx1080ti``), or the path of a profile JSON file (``testbed profile`` writes one).
    """
    mode: Literal["real", "emulated"] = "real"
    profile: str = "zero"


@dataclass
class WorkloadSpec:
    """What trains: scheme, model, data, batch, iterations.

    ``batch_size`` is per worker; the global batch is ``batch_size * workers``.
    ``workers``: ``0`` means every (non-dedicated) host runs one worker.
    ``options``: scheme-specific settings, validated by the scheme.
    """
    scheme: str = "ps"
    model: str = "digits_mlp"
    dataset: str = "digits"
    compute: ComputeSpec = field(default_factory=ComputeSpec)
    batch_size: int = field(default=32, metadata=_pos)
    iterations: int = field(default=100, metadata=_pos)
    warmup_iterations: int = field(default=5, metadata=_nonneg)
    eval_every: int = field(default=0, metadata=_nonneg)
    seed: int = 0
    workers: int = field(default=0, metadata=_nonneg)
    save_params: bool = False
    optimizer: OptimizerSpec = field(default_factory=OptimizerSpec)
    servers: ServersSpec = field(default_factory=ServersSpec)
    options: dict = field(default_factory=dict)


@dataclass
class CaptureSpec:
    """What the harness records while a run trains (periods in milliseconds).

    ``interval_ms``: bwm-ng's period (10 ms, as P3's evaluation). ``qdisc_interval_ms``: the
    uplink qdisc sampler's period; it costs ~1-3 ms of the harness's CPU per sample
    (pyroute2 decodes every qdisc, see :mod:`testbed.capture`), so the default is 50 ms;
    set 10 for queue dynamics at bwm-ng's resolution on a run with CPU to spare.
    """
    interval_ms: int = field(default=10, metadata=_pos)
    qdisc: bool = True
    qdisc_interval_ms: int = field(default=50, metadata=_pos)
    cpu: bool = True
    cpu_interval_ms: int = field(default=100, metadata=_check(lambda v: v >= 10, "an integer >= 10"))


@dataclass
class RunSpec:
    """How the run is driven: time limit, where run directories go, an optional fixed id."""
    timeout_s: float = field(default=600.0, metadata=_pos)
    runs_dir: str = "runs"
    id: Optional[str] = None
    master_port: int = field(default=29500, metadata=_check(lambda v: 1024 <= v < 65536, "a port in [1024, 65535]"))


@dataclass
class Experiment:
    """A whole experiment spec. ``sweep`` maps dotted field paths to lists of values.

    ``variants`` is a list of arms, each a mapping of dotted field paths to values (and an
    optional ``name``), for settings that go together (a scheme and its options): the runs
    are every variant combined with every point of ``sweep``.

    ``scale`` is the time dilation factor s: every link runs at its bandwidth / s (and its
    delay * s) and emulated compute takes s times its profiled time, so the ratio of
    communication to computation is that of the emulated network while the machine runs s
    times slower. Everything reported is converted back to the emulated network's time.
    s != 1 needs ``workload.compute.mode: emulated`` (real compute cannot be slowed down).

    ``background`` lists :class:`BackgroundFlow` s: iperf3 traffic between hosts during the
    run, e.g. to load the core (``testbed.background``).
    """
    name: str = "experiment"
    scale: float = field(default=1.0, metadata=_pos)
    topology: TopologySpec = field(default_factory=TopologySpec)
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    capture: CaptureSpec = field(default_factory=CaptureSpec)
    run: RunSpec = field(default_factory=RunSpec)
    sweep: dict = field(default_factory=dict)
    variants: list = field(default_factory=list)
    background: list[BackgroundFlow] = field(default_factory=list)

    def to_dict(self, as_given: bool = False) -> dict:
        """The spec as a mapping, every default filled in (what ``spec.yaml`` holds).

        ``as_given``: ``workload.servers.count``/``placement`` are null where the spec left
        them to their default or to ``servers.config`` (sweeps and variants build their points
        from this form, so that they may set ``servers.config``).
        """
        d = dataclasses.asdict(self)
        if as_given:
            d["workload"]["servers"].update(self.workload.servers.as_given())
        return d


# ---------------------------------------------------------------------------- building


def _describe(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(_describe(a) for a in args) + " or null"
    if origin is list:
        (inner,) = typing.get_args(tp)
        what = f"mappings with fields {', '.join(_field_names(inner))}" if dataclasses.is_dataclass(inner) \
            else _describe(inner)
        return f"a list of {what}"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false",
            dict: "a mapping", list: "a list"}.get(tp, getattr(tp, "__name__", str(tp)))


def _coerce(tp, value, path):
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _coerce(inner, value, path)
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise SpecError(path, value, _describe(tp))
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise SpecError(path, value, f"a mapping with fields {', '.join(_field_names(tp))}")
        return _build(tp, value, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise SpecError(path, value, _describe(tp))
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(path, value, _describe(tp))
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SpecError(path, value, _describe(tp))
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise SpecError(path, value, _describe(tp))
        return value
    if tp is dict:
        if not isinstance(value, dict):
            raise SpecError(path, value, _describe(tp))
        return dict(value)
    if tp is list:
        if not isinstance(value, list):
            raise SpecError(path, value, _describe(tp))
        return list(value)
    if origin is list:
        (inner,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise SpecError(path, value, _describe(tp))
        return [_coerce(inner, v, f"{path}[{i}]") for i, v in enumerate(value)]
    raise TypeError(f"unsupported spec type {tp}")  # a bug in this module, not user input


def _field_names(cls):
    return [f.name for f in dataclasses.fields(cls)]


def _build(cls, data: dict, prefix: str = ""):
    hints = typing.get_type_hints(cls)
    names = _field_names(cls)
    for key in data:
        if key not in names:
            raise SpecError(f"{prefix}{'.' if prefix else ''}{key}", data[key],
                            f"a known field of {prefix or 'the spec'}: {', '.join(names)}")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise SpecError(f"{prefix}{'.' if prefix else ''}{f.name}", None,
                                f"{_describe(hints[f.name])} (required)")
            continue
        path = f"{prefix}{'.' if prefix else ''}{f.name}"
        value = _coerce(hints[f.name], data[f.name], path)
        check = f.metadata.get("check")
        if check and value is not None and not check[0](value):
            raise SpecError(path, data[f.name], check[1])
        kwargs[f.name] = value
    return cls(**kwargs)


def _set_path(data: dict, path: str, value):
    keys = path.split(".")
    node = data
    for k in keys[:-1]:
        nxt = node.setdefault(k, {})
        if not isinstance(nxt, dict):
            raise SpecError(path, value, f"a path into a mapping, but '{k}' is {nxt!r}")
        node = nxt
    node[keys[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """Parse ``path.to.field=value`` (value in YAML syntax) into ``(path, value)``.

    Raises:
        SpecError: no ``=`` or an empty path.
    """
    if "=" not in text:
        raise SpecError("--set", text, "path.to.field=value, e.g. workload.iterations=20")
    path, raw = text.split("=", 1)
    if not path.strip():
        raise SpecError("--set", text, "a non-empty field path before '='")
    return path.strip(), yaml.safe_load(raw)


def from_dict(data: dict, overrides: list[str] | None = None) -> Experiment:
    """Validate a spec given as a mapping (plus ``--set`` overrides) into an Experiment.

    Raises:
        SpecError: the first malformed field, by dotted path.
    """
    data = copy.deepcopy(data or {})
    if not isinstance(data, dict):
        raise SpecError("<spec>", data, "a YAML mapping with sections topology, workload, capture, run, sweep")
    for text in overrides or []:
        path, value = parse_override(text)
        _set_path(data, path, value)
    exp = _build(Experiment, data)
    _validate_cross(exp)
    return exp


def load_spec(path: str | Path, overrides: list[str] | None = None) -> Experiment:
    """Read a YAML spec file and validate it (see :func:`from_dict`).

    Raises:
        SpecError: the file is missing, is not YAML, or a field is malformed.
    """
    p = Path(path)
    if not p.is_file():
        raise SpecError("<file>", str(path), "the path of an existing YAML spec file")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise SpecError("<file>", str(path), f"valid YAML ({e})") from None
    if "name" not in data:
        data["name"] = p.stem
    return from_dict(data, overrides)


def _validate_cross(exp: Experiment) -> None:
    """Checks that involve several fields, and the scheme/model/dataset registries."""
    t, w = exp.topology, exp.workload
    if t.kind == "rack" and t.racks != 1:
        raise SpecError("topology.racks", t.racks, "1 for topology.kind 'rack' (use 'rack_core' for several racks)")
    if w.warmup_iterations >= w.iterations:
        raise SpecError("workload.warmup_iterations", w.warmup_iterations,
                        f"fewer than workload.iterations ({w.iterations})")
    from traffic.schemes import available_schemes, get_scheme
    if w.scheme not in available_schemes():
        raise SpecError("workload.scheme", w.scheme, "one of " + ", ".join(available_schemes()))
    from traffic.models import available_models
    if w.model not in available_models():
        raise SpecError("workload.model", w.model, "one of " + ", ".join(available_models()))
    from traffic.data import available_datasets
    if w.dataset not in available_datasets():
        raise SpecError("workload.dataset", w.dataset, "one of " + ", ".join(available_datasets()))
    get_scheme(w.scheme).validate_options(w.options)
    if exp.scale != 1 and w.compute.mode != "emulated":
        raise SpecError("scale", exp.scale, "1 unless workload.compute.mode is 'emulated' "
                        "(time dilation slows emulated compute and links; real compute cannot be slowed)")
    if w.compute.mode == "emulated":
        from topologies.errors import TestbedError
        from traffic.profiles import load_profile
        try:
            load_profile(w.compute.profile, w.model, w.batch_size)
        except TestbedError as e:
            raise SpecError("workload.compute.profile", w.compute.profile, str(e)) from None
    _validate_background(exp)
    for i, v in enumerate(exp.variants):
        if not isinstance(v, dict) or not [k for k in v if k != "name"]:
            raise SpecError(f"variants[{i}]", v, "a mapping of dotted field paths to values (and an optional name)")
        d = exp.to_dict(as_given=True)
        d["sweep"], d["variants"] = {}, []
        for path, value in v.items():
            if path != "name":
                _set_path(d, path, value)
        from_dict(d)
    for path, values in exp.sweep.items():
        if not isinstance(values, list) or not values:
            raise SpecError(f"sweep.{path}", values, "a non-empty list of values")
        if path.startswith("sweep"):
            raise SpecError(f"sweep.{path}", values, "a field path outside 'sweep'")
        base = exp.to_dict(as_given=True)
        for v in values:  # each point must itself be a valid spec
            d = copy.deepcopy(base)
            d["sweep"], d["variants"] = {}, []
            _set_path(d, path, v)
            from_dict(d)


_FLOW_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def _validate_background(exp: Experiment) -> None:
    """Background flows: distinct endpoints, whole dilated seconds, unique file-safe names.
    (Whether the hosts exist is checked against the built network: ``testbed.background``.)"""
    names = set()
    for i, f in enumerate(exp.background):
        path = f"background[{i}]"
        if f.src == f.dst:
            raise SpecError(f"{path}.dst", f.dst, f"a host other than src ({f.src})")
        dilated = f.duration_s * exp.scale
        if abs(dilated - round(dilated)) > 1e-9 or round(dilated) < 1:
            raise SpecError(f"{path}.duration_s", f.duration_s,
                            f"a duration that is a whole number (>= 1) of seconds once dilated: duration_s x scale "
                            f"= {dilated:g} (iperf3 -t takes whole seconds)")
        name = f.name if f.name is not None else f"bg{i}"
        if not name or not set(name) <= _FLOW_NAME_CHARS or name.startswith("."):
            raise SpecError(f"{path}.name", f.name, "letters, digits, '_', '.', '-' (a file name)")
        if name in names:
            raise SpecError(f"{path}.name", f.name, f"a name no other flow has ({name!r} is taken)")
        names.add(name)


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
            d = exp.to_dict(as_given=True)
            d["sweep"], d["variants"] = {}, []
            point = {"variant": variant["name"]} if "name" in variant else {}
            point.update({k: v for k, v in variant.items() if k != "name"})
            point.update(zip(paths, combo))
            for p, v in point.items():
                if p != "variant":
                    _set_path(d, p, v)
            out.append((point, from_dict(d)))
    return out


def dump_spec(exp: Experiment) -> str:
    """The resolved spec as YAML (what ``runs/<id>/spec.yaml`` holds)."""
    return yaml.safe_dump(exp.to_dict(), sort_keys=False)
