"""Fuzzed user input: no traceback for anything a user can give to spec loading and validation.

Hypothesis generates specs from the real field names of the spec models (valid values,
out-of-range values, wrong types, unknown keys, junk sections), ``--set`` overrides, sweep
and variant axes, spec files of any bytes or nasty YAML, names that try to leave the runs
directory, and run paths for ``show``/``plot``/``timeline``/``report``. Properties:

* validation and planning (:func:`testbed.spec.from_dict` / :func:`~testbed.spec.load_spec`
  then :func:`testbed.runner.plan_experiment`, what ``testbed run`` does before it builds
  anything) either succeed or raise :class:`~common.errors.SpecError`, nothing else;
* at the limits the plan-time checks enforce (values at and around the shaper's rates, a
  bridge's ports, iperf3's limits, ports, seeds and times inside ``run.timeout_s``, at a
  number ``scale`` and at ``auto``), planning still succeeds or raises ``SpecError``, and what
  it accepts is inside every one of those limits;
* ``testbed run --dry-run`` (the CLI's ``main``) exits 0 or 2 with no traceback and writes
  nothing; ``testbed show/plot/timeline/report`` on a path that is not a run exit 2;
* a name validation accepts gives a run directory directly inside the runs directory;
* nothing is built: ``ip netns list`` and the testbed's links, processes and ledgers are the
  same before and after.

Every property runs a bounded number of examples by default (the file takes well under a
minute); ``-m fuzz_long`` selects the same properties with 2000 examples each. Examples are
derandomized (the same inputs every run). With ``FUZZ_CENSUS=<file.json>`` no property fails:
each records every input's outcome (``ok``, ``SpecError``, ... or the unexpected exception's
type), and the counts are written to that file (a census of how the inputs end, to compare
two versions of the validation).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import types
import typing
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from leftovers import leftovers
from pydantic import BaseModel

from common.errors import SpecError
from common.validation import load_yaml
from testbed import cli
from testbed.background import IPERF3_MAX_TIME_S, plan_flows
from testbed.runner import plan_experiment, time_errors
from testbed.spec import MAX_TIMEOUT_S, Experiment, from_dict, load_spec
from topologies import build_topo
from topologies.spec import MAX_BRIDGE_PORTS, MAX_DELAY_MS, MAX_RATE_MBPS, MIN_RATE_MBPS
from traffic import rundir, schemes
from traffic.data import available_datasets
from traffic.hostmodel import available_host_profiles
from traffic.spec import MAX_ITERATIONS, MAX_SEED

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_EXAMPLES = 300
LONG_EXAMPLES = 2000
CENSUS_FILE = os.environ.get("FUZZ_CENSUS")
_CENSUS: dict[str, Counter] = defaultdict(Counter)


def _long_selected(config) -> bool:
    expr = " ".join((config.getoption("markexpr") or "").split())
    return re.search(r"(?<!not )\bfuzz_long\b", expr) is not None


def _profile(examples: int):
    return settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        print_blob=True,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
            HealthCheck.large_base_example,
            HealthCheck.function_scoped_fixture,
        ],
    )


# ------------------------------------------------------------------ outcomes and the census


def _outcome(fn, allowed: tuple[type[BaseException], ...] = (SpecError,)) -> tuple[str, BaseException | None]:
    """``("ok", None)``, ``(<allowed exception's type>, None)`` or, for anything else,
    ``("crash: <type>", exception)``."""
    try:
        fn()
    except allowed as e:
        return type(e).__name__, None
    except Exception as e:  # noqa: BLE001 - what the property is about
        return f"crash: {type(e).__name__}", e
    return "ok", None


def _record(prop: str, outcome: str, exc: BaseException | None, what) -> None:
    """Count the outcome (census mode) or fail on an unexpected exception (test mode)."""
    _CENSUS[prop][outcome] += 1
    if exc is not None and not CENSUS_FILE:
        raise AssertionError(f"{prop}: {outcome} for input {what!r}") from exc


@pytest.fixture(scope="module", autouse=True)
def _census_file():
    yield
    if CENSUS_FILE:
        Path(CENSUS_FILE).write_text(json.dumps({p: dict(c) for p, c in _CENSUS.items()}, indent=2, sort_keys=True))


def _netns() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


@pytest.fixture
def nothing_built(tmp_path_factory, monkeypatch):
    """Network namespaces and testbed objects (links, processes, ledgers) unchanged, and
    nothing written in the working directory (an empty temporary one, where a relative
    ``runs`` would go)."""
    cwd = tmp_path_factory.mktemp("cwd")
    monkeypatch.chdir(cwd)

    def snapshot():
        return _netns(), sorted(leftovers()), sorted(str(p) for p in cwd.rglob("*"))

    before = snapshot()
    yield
    assert snapshot() == before


# ------------------------------------------------------------------ strategies from the spec models

NAMES = [
    "quick",
    "a.b-c_1",
    "X9",
    "_x",
    "../../etc/evil",
    "/abs",
    "a/b",
    "..",
    ".",
    ".hidden",
    "x\x00y",
    "line\nbreak",
    "-opt",
    "",
    " ",
    "a b",
    "é",
    "x" * 101,
    "x" * 300,
    "runs/../..",
    "~root",
    "a\\b",
]
SCHEME_NAMES = schemes.available() + ["magic", "a:b", ":x", "..:x", "x:", "os:path", "PS", "ps "]
MODELS = ["digits_mlp", "digits_cnn", "mnist_mlp", "vgg19", "resnet50", "gpt9", ""]
PROFILES = ["zero", "gtx1080ti", "v100", "nope", "x" * 300, "/nonexistent/p.json", "a/b", "/etc/passwd", ""]
HOST_PROFILES = available_host_profiles() + ["nope", "x" * 300, "/nonexistent.yaml", "/etc/passwd", ""]
HOSTS = ["h1", "h2", "h3", "bg1", "bg2", "ps1", "core1", "nohost", ""]
#: integer fields that size the network: kept small (huge ones are the capacity check's)
SIZE_FIELDS = {
    "topology.racks",
    "topology.hosts_per_rack",
    "topology.interfaces_per_host",
    "topology.background_hosts_per_rack",
    "workload.workers",
    "workload.servers.count",
    "workload.servers.interfaces",
}
STRINGS = {
    "name": NAMES,
    "run.id": NAMES,
    "workload.scheme": SCHEME_NAMES,
    "workload.model": MODELS,
    "workload.dataset": available_datasets() + ["imagenet", ""],
    "workload.compute.profile": PROFILES,
    "host.profile": HOST_PROFILES,
    "background.src": HOSTS,
    "background.dst": HOSTS,
    "background.name": NAMES,
    "run.runs_dir": ["runs", "/nonexistent/runs", "", "x" * 300],
}

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=12),
    st.sampled_from([10**30, -1, 0, 1e12, "1e12", "5", "true", "yes", "~", "rack"]),
)
JUNK = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.one_of(st.text(max_size=8), st.integers()), inner, max_size=3)
    ),
    max_leaves=8,
)
# mostly values of the right kind and range (so that many specs are valid and get planned),
# sometimes edge values and out-of-range ones
INTS = st.one_of(
    st.integers(1, 40),
    st.integers(1, 40),
    st.integers(-3, 40),
    st.sampled_from([0, 1, 100, 576, 1500, 9000, 29500, 65536, 2**63, -(2**63)]),
)
SMALL_INTS = st.one_of(st.integers(1, 4), st.integers(1, 4), st.integers(-2, 5))
FLOATS = st.one_of(
    st.floats(0.01, 1e4),
    st.floats(0.01, 1e4),
    st.floats(-5, 1e4, allow_nan=False),
    st.floats(),
    st.sampled_from([0.0, -0.0, 0.5, 1.0, 2.0, 1e12, 1e300, -1e300, math.inf, -math.inf, math.nan]),
)


def _option_fields() -> dict[str, object]:
    """Every scheme's option names with their annotations (the ``workload.options`` keys)."""
    out = {}
    for name in schemes.available():
        for f, info in schemes.get(name).Options.model_fields.items():
            out.setdefault(f, info.annotation)
    return out


OPTION_FIELDS = _option_fields()


def _value(ann, path: str) -> st.SearchStrategy:
    """Values for the field at dotted ``path`` of annotation ``ann``: mostly of its type
    (valid or not), sometimes junk of any type."""
    return (
        st.one_of(_typed(ann, path), _typed(ann, path), _typed(ann, path), JUNK)
        if not path.startswith("workload.options.")
        else st.one_of(_typed(ann, path), _scalars)
    )


def _typed(ann, path: str) -> st.SearchStrategy:
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    key = re.sub(r"^background\[\d+\]", "background", path)
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return _section(ann, path)
    if origin is typing.Literal:
        return st.sampled_from(args)
    if origin is typing.Union or origin is types.UnionType:
        return st.one_of(*[_typed(a, path) for a in args])
    if ann is type(None):
        return st.none()
    if ann is bool:
        return st.booleans()
    if ann is int:
        return SMALL_INTS if key in SIZE_FIELDS else INTS
    if ann is float:
        return FLOATS
    if ann is str and key not in STRINGS:
        return st.text(max_size=12)
    if ann is str:
        return st.one_of(
            st.sampled_from(STRINGS[key]),
            st.sampled_from(STRINGS[key]),
            st.text(max_size=10).filter(lambda s: ":" not in s),
        )
    if path == "sweep":
        return SWEEPS
    if path == "variants":
        return VARIANTS
    if path == "workload.options":
        option_types = dict.fromkeys(OPTION_FIELDS.values())  # in a fixed order (a set's is not)
        values = st.deferred(lambda: st.one_of(*[_typed(a, "workload.options.x") for a in option_types], _scalars))
        return st.dictionaries(
            st.one_of(st.sampled_from(sorted(OPTION_FIELDS)), st.text(max_size=6)), values, max_size=3
        )
    if origin is list and args and isinstance(args[0], type) and issubclass(args[0], BaseModel):
        return st.lists(_section(args[0], f"{path}[0]"), max_size=2)
    return JUNK


def _section(model: type[BaseModel], path: str) -> st.SearchStrategy:
    """A mapping of some of ``model``'s fields (each a value for it), sometimes with an
    unknown key, sometimes replaced by junk."""
    fields = {
        f: st.deferred(lambda f=f, a=info.annotation: _value(a, f"{path}.{f}" if path else f))
        for f, info in model.model_fields.items()
    }
    known = st.fixed_dictionaries({}, optional=fields)
    unknown = st.dictionaries(st.sampled_from(["bogus", "Racks", "racks ", "1", "kind.x"]), JUNK, max_size=1)
    with_unknown = st.builds(lambda a, b: {**a, **b}, known, unknown)
    return st.one_of(known, known, known, with_unknown) if path == "" else st.one_of(*[known] * 8, with_unknown, JUNK)


def _leaf_paths(model: type[BaseModel], prefix: str = "") -> dict[str, object]:
    """Every dotted field path of ``model`` (nested sections walked) -> annotation."""
    out = {}
    for f, info in model.model_fields.items():
        path = f"{prefix}{f}"
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out.update(_leaf_paths(ann, f"{path}."))
        else:
            out[path] = ann
    return out


LEAVES = {p: a for p, a in _leaf_paths(Experiment).items() if p not in ("sweep", "variants")}
LEAVES.update({f"workload.options.{f}": a for f, a in OPTION_FIELDS.items()})
REAL_PATHS = st.sampled_from(sorted(LEAVES))
PATHS = st.one_of(
    REAL_PATHS,
    REAL_PATHS,
    REAL_PATHS,
    st.sampled_from(
        [
            "nope",
            "topology..racks",
            "topology.racks.x",
            "sweep",
            "variants",
            "sweep.x",
            "name.x",
            "workload.options",
            "topology",
            "",
            ".",
        ]
    ),
    st.text(max_size=12),
)


def _path_value(path: str) -> st.SearchStrategy:
    return _value(LEAVES[path], path) if path in LEAVES else JUNK


AXIS = PATHS.flatmap(
    lambda p: st.tuples(
        st.just(p),
        st.one_of(st.lists(_path_value(p), min_size=1, max_size=3), st.lists(_path_value(p), max_size=0), JUNK),
    )
)
SWEEPS = st.one_of(st.lists(AXIS, max_size=3).map(dict), JUNK)
VARIANT = st.one_of(
    st.builds(
        lambda items, name: {**dict(items), **name},
        st.lists(PATHS.flatmap(lambda p: st.tuples(st.just(p), _path_value(p))), max_size=3),
        st.one_of(st.just({}), st.builds(lambda n: {"name": n}, st.one_of(st.sampled_from(NAMES), JUNK))),
    ),
    JUNK,
)
VARIANTS = st.one_of(st.lists(VARIANT, max_size=3), JUNK)
#: valid specs to mutate: every shipped experiment, and a small one of every scheme
BASES = [load_yaml(p.read_text()) for p in sorted((ROOT / "experiments").glob("*.yaml"))] + [
    {
        "topology": {"kind": "rack", "hosts_per_rack": 4},
        "workload": {"scheme": s, "iterations": 3, "model": "digits_cnn"},
    }
    for s in schemes.available()
]


def _mutated(base: dict, changes: list, drop: str | None) -> dict:
    """``base`` with each ``(dotted path, value)`` of ``changes`` set (a part that is not a
    mapping is replaced by one) and the top-level key ``drop`` removed."""
    out = copy.deepcopy(base)
    for path, value in changes:
        node = out
        keys = path.split(".")
        for k in keys[:-1]:
            if not isinstance(node.get(k), dict):
                node[k] = {}
            node = node[k]
        node[keys[-1]] = value
    out.pop(drop, None)
    return out


MUTATED = st.builds(
    _mutated,
    st.sampled_from(BASES),
    st.lists(PATHS.flatmap(lambda p: st.tuples(st.just(p), _path_value(p))), max_size=2),
    st.one_of(st.none(), st.sampled_from(["sweep", "variants", "topology", "workload", "name"])),
)
SPECS = st.one_of(MUTATED, MUTATED, _section(Experiment, ""), _section(Experiment, ""), JUNK)


def _yaml_text(value) -> str:
    try:
        return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()
    except yaml.YAMLError:
        return str(value)


OVERRIDE = st.one_of(
    st.builds(lambda p, v: f"{p}={v}", PATHS, PATHS.flatmap(_path_value).map(_yaml_text)),
    st.builds(lambda p, t: f"{p}={t}", PATHS, st.text(max_size=12)),
    st.sampled_from(
        [
            "workload.iterations",
            "=5",
            "topology.host_bw_mbps=1e12",
            "topology=[1, 2",
            "topology.racks=1" + "0" * 5000,
            "workload.seed=2001-13-01",
            "name=!!python/object:os.system x",
            "topology.kind=rack",
            "sweep={topology.racks: [1, 2]}",
            "variants=[[1]]",
        ]
    ),
    st.text(max_size=16),
)
OVERRIDES = st.lists(OVERRIDE, max_size=3)

NASTY_YAML = [
    "- a\n- b\n",
    "42\n",
    "just a string\n",
    "~\n",
    "",
    "---\na: 1\n---\nb: 2\n",
    "[" * 400 + "]" * 400,
    "a: " + "[" * 60 + "]" * 60,
    "a: &a [*a]\n",
    "topology: &t {racks: *t}\n",
    "x: &x [1,1,1,1,1,1,1,1,1]\ny: &y [*x,*x,*x,*x,*x,*x,*x,*x,*x]\nz: &z [*y,*y,*y,*y,*y,*y,*y,*y,*y]\n"
    "topology: {kind: *z}\n",
    "topology: {racks: 1" + "0" * 5000 + "}\n",
    "workload: {seed: 2001-13-01}\n",
    "workload: {seed: !!int x}\n",
    "name: !!python/object/apply:os.system [echo]\n",
    "? [a]\n: 1\n",
    "{1: 2, null: 3, true: 4}\n",
    "topology: {host_bw_mbps: 1e12}\n",
    "topology: {kind: rack, hosts_per_rack: 4, delay_ms: 1}\n",
    "name: ../../etc/evil\n",
    "run: {id: /abs}\n",
    "sweep: 5\n",
    "sweep: {workload.scheme: []}\n",
    "variants: {a: 1}\n",
    "variants: [{1: 2}]\n",
    "topology: {kind: rack_core, racks: 200, hosts_per_rack: 2}\n",
    "\t- tab\n",
    "a: b: c\n",
    "\xff\xfe",
    "key: 'unterminated\n",
    "!!binary aGVsbG8=\n",
    "!!set {a, b}\n",
    "topology: {racks: 2, racks: 3}\n",
    "name: a\nname: b\n",
    "background:\n- {src: h1, src: h2}\n",
    "base: &b {x: 1}\nm: {<<: *b, x: 2}\n",
    "!!set {a, a}\n",
    "a: {? [x]: 1, ? [x]: 2}\n",
]
FILE_TEXTS = st.one_of(
    st.sampled_from(NASTY_YAML), SPECS.map(lambda d: yaml.safe_dump(d) if _dumpable(d) else ""), st.text(max_size=60)
)
FILE_BYTES = st.one_of(FILE_TEXTS.map(lambda t: t.encode("utf-8", "surrogatepass")), st.binary(max_size=80))
FILE_NAMES = st.sampled_from(
    ["spec.yaml", "my spec.yaml", ".hidden.yaml", "-x.yaml", "a..b.yaml", "ä.yaml", "x" * 200 + ".yaml", "noext"]
)


def _dumpable(d) -> bool:
    try:
        yaml.safe_dump(d)
        return True
    except (yaml.YAMLError, ValueError):
        return False


# ------------------------------------------------------------------ the plan-time checks at their limits


def _flow(**kw) -> dict:
    return {"src": "bg1", "dst": "bg2", "rate_mbps": 10, "duration_s": 10, **kw}


#: values at and around every limit validation and planning enforce
AT_LIMITS = {
    "scale": ["auto", "auto", 1, 4, 1000, 1e-3],
    "workload.compute.mode": ["real", "emulated", "emulated"],
    "topology.host_bw_mbps": [
        MIN_RATE_MBPS,
        MIN_RATE_MBPS * 0.999,
        1e-7,
        0.01,
        1,
        100,
        MAX_RATE_MBPS,
        MAX_RATE_MBPS * 1.001,
        1e12,
    ],
    "topology.uplink_bw_mbps": [None, MIN_RATE_MBPS, 1e-6, MAX_RATE_MBPS * 2],
    "topology.oversubscription": [1, 3, 1e6],
    "topology.delay_ms": [0, 1, MAX_DELAY_MS, MAX_DELAY_MS * 1.0001, 1e12],
    "topology.max_queue_packets": [None, 1, 2**32 - 1, 2**32],
    "topology.tcp_notsent_lowat_bytes": [None, 2**32 - 1, 2**32],
    "topology.hosts_per_rack": [1, 2, 4, 511, 1022, 1023, 1100],
    "topology.racks": [1, 2, 3, 1023, 1024],
    "topology.interfaces_per_host": [1, 2, 64],
    "topology.background_hosts_per_rack": [0, 1, 2, 1021],
    "workload.seed": [0, -1, MAX_SEED, MAX_SEED + 1, 10**30],
    "workload.iterations": [1, 3, 100, MAX_ITERATIONS, MAX_ITERATIONS + 1],
    "workload.workers": [0, 1, 2],
    "run.timeout_s": [1e-3, 1, 240, 600, MAX_TIMEOUT_S, MAX_TIMEOUT_S * 1.0001, 1e12],
    "run.master_port": [29500, 5201, 5202, 65535],
    "capture.interval_ms": [1, 10, 240_000, 600_001, 2**31, 10**18],
    "capture.cpu_interval_ms": [10, 10**9],
    "capture.qdisc": [True, False],
    "capture.qdisc_interval_ms": [50, 10**9],
    "capture.pcap": [
        None,
        {"ports": ["uplinks"]},
        {"ports": ["uplinks"], "start_s": 1e12},
        {"ports": ["uplinks"], "start_s": 239.9, "duration_s": 0.01},
        {"ports": ["uplinks"], "duration_s": 1e12},
    ],
    "background": [
        [],
        [_flow()],
        [_flow(), _flow(src="bg2", dst="bg1")],
        [_flow(rate_mbps=1e-7)],
        [_flow(rate_mbps=4e-6, start_s=1e-3)],
        [_flow(duration_s=IPERF3_MAX_TIME_S)],
        [_flow(duration_s=IPERF3_MAX_TIME_S + 1)],
        [_flow(start_s=599.99)],
        [_flow(start_s=1e300)],
        [_flow(rate_mbps=1e12)],
    ],
    "events": [
        [],
        [{"at_s": 1, "link": "host:h1", "bw_mbps": 1e-5}],
        [{"at_s": 1e12, "kill": "worker1"}],
        [{"at_s": 0.5, "link": "host:h2", "bw_mbps": MAX_RATE_MBPS}],
        [{"at_iteration": 1, "link": "host:h1", "bw_mbps": 1000}],
    ],
    "host.message_overhead_us": [None, 0, 1e12],
    "host.aggregate_gb_per_s": [None, 1e-15, 10],
}
LIMIT_BASES = [
    {
        "topology": {"kind": "rack_core", "racks": 2, "hosts_per_rack": 2, "background_hosts_per_rack": 1},
        "workload": {"scheme": s, "iterations": 3, "model": "digits_cnn"},
    }
    for s in schemes.available()
    if s != "program"
] + [load_yaml((ROOT / "experiments" / "quickstart.yaml").read_text())]
LIMIT_SPECS = st.builds(
    _mutated,
    st.sampled_from(LIMIT_BASES),
    st.lists(
        st.sampled_from(sorted(AT_LIMITS)).flatmap(lambda p: st.tuples(st.just(p), st.sampled_from(AT_LIMITS[p]))),
        max_size=5,
    ),
    st.none(),
)


def _planned_within_limits(data) -> None:
    """Plan ``data`` and check that every point accepted is inside every limit."""
    for pr in plan_experiment(from_dict(data)):
        e, s = pr.exp, pr.exp.scale
        t, T = e.topology, e.run.timeout_s
        assert isinstance(s, float) and T <= MAX_TIMEOUT_S
        rates = [t.host_bw_mbps] + ([t.uplink_mbps()] if t.kind == "rack_core" else [])
        rates += [ev.bw_mbps for ev in e.events if ev.kind == "link_rate"]
        assert all(MIN_RATE_MBPS <= r / s <= MAX_RATE_MBPS for r in rates), (rates, s)
        assert t.delay_ms * s <= MAX_DELAY_MS and t.delay_ms * s / 1000 < T
        scheme = schemes.get(e.workload.scheme)
        topo = build_topo(t, scheme.hosts(e.workload, t))
        ports = {sw: 0 for sw in topo.switches()}
        for a, b in topo.links():
            for n in (a, b):
                if n in ports:
                    ports[n] += 1
        assert max(ports.values()) <= MAX_BRIDGE_PORTS
        hosts = {"hosts": [{"name": h.name, "ip": "10.0.0.1"} for h in pr.hosts]}
        for fp in plan_flows(e.background, hosts, scale=s):
            assert fp.shaped_bps >= 1 and 1 <= fp.seconds <= IPERF3_MAX_TIME_S and fp.delay_s < T
            assert fp.port != e.run.master_port and fp.port <= 65535
        assert 0 <= e.workload.seed <= MAX_SEED and e.workload.iterations <= MAX_ITERATIONS
        assert all(ev.at_s * s < T for ev in e.events if ev.at_s is not None)
        c = e.capture
        assert c.interval_ms <= T * 1000 and (not c.cpu or c.cpu_interval_ms <= T * 1000)
        if c.pcap is not None:
            assert c.pcap.start_s * s < T and (c.pcap.duration_s is None or c.pcap.duration_s * s <= T)
        assert time_errors(e, pr.hosts, pr.processes) == []


def _check_limits(data) -> None:
    outcome, exc = _outcome(lambda: _planned_within_limits(data))
    _record("plan at the limits", outcome, exc, data)


# ------------------------------------------------------------------ properties


def _check_validation(data, overrides) -> None:
    outcome, exc = _outcome(lambda: plan_experiment(from_dict(data, overrides)))
    _record("validate+plan", outcome, exc, (data, overrides))


def _check_file(content: bytes, fname: str, overrides) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / fname
        p.write_bytes(content)
        outcome, exc = _outcome(lambda: plan_experiment(load_spec(p, overrides)))
    _record("spec file", outcome, exc, (content, fname, overrides))


def _main(argv: list[str]) -> tuple[int | str, str, str]:
    """``testbed.cli.main(argv)`` in this process: (exit status or ``crash: <type>``, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(argv)
        except SystemExit as e:  # argparse: bad command-line syntax (usage message, status 2)
            rc = e.code
        except Exception as e:  # noqa: BLE001 - a traceback the user would see
            rc = f"crash: {type(e).__name__}"
            import traceback

            traceback.print_exc(file=err)
    return rc, out.getvalue(), err.getvalue()


def _check_cli(content: bytes, overrides) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "spec.yaml"
        spec.write_bytes(content)
        rc, out, err = _main(
            ["run", "--dry-run", str(spec), *[f"--set={o}" for o in overrides], "--runs-dir", str(Path(tmp) / "runs")]
        )
        written = sorted(os.listdir(tmp))
    ok = rc in (0, 2) and "Traceback" not in err and written == ["spec.yaml"]
    outcome = f"exit {rc}" if isinstance(rc, int) else rc
    _record(
        "cli run --dry-run",
        outcome if ok else f"bad: {outcome}, wrote {written}",
        None if ok else AssertionError(f"exit {rc}, wrote {written}, stderr:\n{err}"),
        (content, overrides),
    )


def _check_name(name) -> None:
    """A name validation accepts (as ``name`` and as ``run.id``) makes a run directory
    directly inside the runs directory (checked on the path; created outside census mode)."""
    for spec in ({"name": name}, {"run": {"id": name}}):
        outcome, exc = _outcome(lambda: from_dict(spec))
        if outcome == "ok":
            run_id = name if "run" in spec else rundir.new_run_id(name)
            with tempfile.TemporaryDirectory() as tmp:
                runs = Path(tmp, "a", "b", "runs")  # deep: a '..' that slipped through stays in tmp
                target = runs / run_id
                inside = (
                    "/" not in run_id
                    and "\x00" not in run_id
                    and run_id not in (".", "..")
                    and target.resolve().parent == runs.resolve()
                )
                if not inside:
                    outcome, exc = "crash: accepted a name that leaves the runs directory", AssertionError(run_id)
                elif not CENSUS_FILE:
                    made = rundir.create(runs, run_id)
                    assert made.parent == runs and made.is_dir()
        _record("names", outcome, exc, spec)


# the default profile ...


@_profile(DEFAULT_EXAMPLES)
@given(data=SPECS, overrides=OVERRIDES)
def test_fuzz_validation_and_planning_raise_only_spec_errors(data, overrides):
    _check_validation(data, overrides)


@_profile(DEFAULT_EXAMPLES)
@given(content=FILE_BYTES, fname=FILE_NAMES, overrides=OVERRIDES)
def test_fuzz_spec_files_of_any_bytes(content, fname, overrides):
    _check_file(content, fname, overrides)


@_profile(DEFAULT_EXAMPLES // 2)
@given(content=FILE_BYTES, overrides=OVERRIDES)
def test_fuzz_cli_dry_run_exits_0_or_2_and_writes_nothing(nothing_built, content, overrides):
    _check_cli(content, overrides)


@_profile(DEFAULT_EXAMPLES)
@given(data=LIMIT_SPECS)
def test_fuzz_plan_at_the_limits_refuses_with_spec_errors_and_accepts_only_what_fits(data):
    _check_limits(data)


@_profile(DEFAULT_EXAMPLES)
@given(name=st.one_of(st.sampled_from(NAMES), st.text(max_size=12), st.text(alphabet="./-_a\x00\n", max_size=8)))
def test_fuzz_names_accepted_stay_inside_the_runs_dir(name):
    _check_name(name)


# ... and the long one (-m fuzz_long)


@pytest.fixture
def long_profile(request):
    if not _long_selected(request.config):
        pytest.skip("the long fuzz profile: select it with -m fuzz_long")


@pytest.mark.fuzz_long
@_profile(LONG_EXAMPLES)
@given(data=SPECS, overrides=OVERRIDES)
def test_fuzz_long_validation_and_planning(long_profile, data, overrides):
    _check_validation(data, overrides)


@pytest.mark.fuzz_long
@_profile(LONG_EXAMPLES)
@given(content=FILE_BYTES, fname=FILE_NAMES, overrides=OVERRIDES)
def test_fuzz_long_spec_files(long_profile, content, fname, overrides):
    _check_file(content, fname, overrides)


@pytest.mark.fuzz_long
@_profile(LONG_EXAMPLES)
@given(content=FILE_BYTES, overrides=OVERRIDES)
def test_fuzz_long_cli_dry_run(long_profile, nothing_built, content, overrides):
    _check_cli(content, overrides)


@pytest.mark.fuzz_long
@_profile(LONG_EXAMPLES)
@given(data=LIMIT_SPECS)
def test_fuzz_long_plan_at_the_limits(long_profile, data):
    _check_limits(data)


@pytest.mark.fuzz_long
@_profile(LONG_EXAMPLES)
@given(name=st.text(max_size=16))
def test_fuzz_long_names(long_profile, name):
    _check_name(name)


# ------------------------------------------------------------------ run paths and the CLI as a user runs it


def _run_paths(tmp: Path) -> dict[str, Path]:
    """Paths that are not runs, and runs that are incomplete."""
    (tmp / "file.txt").write_text("x")
    (tmp / "empty").mkdir()
    (tmp / "junk").mkdir()
    (tmp / "junk" / "spec.yaml").write_text("- not a mapping")
    (tmp / "sweep").mkdir()
    (tmp / "sweep" / "sweep.yaml").write_text("{}")
    return {
        "missing": tmp / "missing",
        "a file": tmp / "file.txt",
        "an empty dir": tmp / "empty",
        "a dir with only spec.yaml": tmp / "junk",
        "a sweep with no run yet": tmp / "sweep",
        "a name too long": tmp / ("x" * 300),
        "the empty string": Path(""),
    }


@pytest.mark.parametrize("command", [["show"], ["plot"], ["timeline"], ["report", "p3"], ["report", "phub"]])
def test_run_paths_that_are_not_runs_exit_2_without_traceback(tmp_path, command):
    for what, path in _run_paths(tmp_path).items():
        rc, out, err = _main([*command, str(path)])
        ok = rc == 2 and err.startswith("testbed: error: ") and "Traceback" not in err
        _record(
            f"run path: {' '.join(command)}",
            "exit 2" if ok else f"exit {rc}",
            None if ok else AssertionError(err),
            (what, str(path)),
        )


def test_show_of_a_run_without_or_with_a_broken_summary_is_an_error(tmp_path):
    run = rundir.create(tmp_path, "r")
    (run / "spec.yaml").write_text("{}")
    (run / "processes.json").write_text("{}")
    rc, _, err = _main(["show", str(run)])
    assert rc == 2 and "no summary.json yet" in err
    (run / "summary.json").write_text("{not json")
    rc, _, err = _main(["show", str(run)])
    assert rc == 2 and "not readable JSON" in err and "Traceback" not in err
    rc, out, _ = _main(["ls", str(tmp_path)])
    assert rc == 0 and "unreadable" in out


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("- a\n- b\n", "'<spec>'"),
        ("name: ../../etc/evil\n", "'name'"),
        ("\xff\xfe\x00garbage", "'<file>'"),
    ],
)
def test_cli_in_a_subprocess_exits_2_without_traceback(tmp_path, nothing_built, text, fragment):
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(text.encode("latin-1"))
    before = sorted(os.listdir(tmp_path))
    # --dry-run: were validation to let the spec through, still nothing would be built
    out = subprocess.run(
        [sys.executable, "-m", "testbed.cli", "run", "--dry-run", str(spec)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    assert fragment in out.stderr
    assert sorted(os.listdir(tmp_path)) == before  # no runs/ made, nothing written


def test_cli_dry_run_of_a_valid_spec_plans_and_writes_nothing(tmp_path, nothing_built):
    spec = tmp_path / "rack.yaml"
    spec.write_text("topology: {kind: rack, hosts_per_rack: 4, delay_ms: 1}\nworkload: {iterations: 3}\n")
    rc, out, err = _main(
        ["run", "--dry-run", str(spec), "--set", "topology.host_bw_mbps=40000", "--runs-dir", str(tmp_path / "runs")]
    )
    assert (rc, err) == (0, "")
    assert (
        "rack x1, scale 1 (auto), hosts 4 worker" in out
        and "5 processes: worker0@h1 worker1@h2 worker2@h3 worker3@h4 server0@h1" in out
    )
    assert sorted(os.listdir(tmp_path)) == ["rack.yaml"]
    # a link faster than the shaper's highest rate is refused at planning, as the build would
    rc, out, err = _main(
        ["run", "--dry-run", str(spec), "--set", "topology.host_bw_mbps=1e12", "--runs-dir", str(tmp_path / "runs")]
    )
    assert rc == 2 and "topology.host_bw_mbps" in err and "at most 40000 Mbit/s" in err
    assert sorted(os.listdir(tmp_path)) == ["rack.yaml"]
    rc, out, err = _main(["run", "--dry-run", str(ROOT / "experiments" / "quickstart.yaml")])
    assert rc == 0 and "2 run(s) valid and planned" in out


def test_a_plan_that_does_not_fit_is_refused_before_anything_is_built():
    rack2 = {"kind": "rack", "hosts_per_rack": 2}
    with pytest.raises(SpecError) as e:  # more workers than worker hosts: refused by validation
        from_dict({"topology": rack2, "workload": {"workers": 3}})
    assert e.value.field == "workload.workers" and "at most 2" in str(e.value)
    with pytest.raises(SpecError) as e:  # more colocated servers than workers: refused by the plan
        plan_experiment(from_dict({"topology": rack2, "workload": {"servers": {"count": 3}}}))
    assert e.value.field == "workload.servers.count" and "at most 2" in str(e.value)
    with pytest.raises(SpecError) as e:
        plan_experiment(from_dict({"background": [{"src": "bg1", "dst": "h1", "rate_mbps": 10, "duration_s": 1}]}))
    assert e.value.field == "background[0].src" and "background_hosts_per_rack" in str(e.value)
    with pytest.raises(SpecError) as e:
        plan_experiment(from_dict({"topology": rack2, "sweep": {"workload.servers.count": [1, 3]}}))
    assert e.value.field == "workload.servers.count" and "in the point count=3" in str(e.value)
    planned = plan_experiment(from_dict({"topology": rack2, "sweep": {"workload.servers.count": [1, 2]}}))
    assert [[p.name for p in pr.processes] for pr in planned] == [
        ["worker0", "worker1", "server0"],
        ["worker0", "worker1", "server0", "server1"],
    ]


@pytest.mark.parametrize(
    "spec, field",
    [
        ({"topology": {"racks": 2000, "hosts_per_rack": 4}}, "topology"),
        ({"topology": {"interfaces_per_host": 1000}}, "topology.interfaces_per_host"),
        ({"workload": {"servers": {"count": 10**12, "placement": "dedicated"}}}, "workload.servers.count"),
        ({"workload": {"workers": 10**12, "servers": {"config": "NCS"}}}, "workload.workers"),
    ],
)
def test_sizes_no_machine_could_emulate_are_refused_before_planning(spec, field):
    with pytest.raises(SpecError) as e:
        from_dict(spec)
    assert e.value.field == field and "at most" in str(e.value)
