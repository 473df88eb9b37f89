"""The machine cost model: the file of measured costs the capacity check and ``scale: auto``
estimate a run with (:mod:`testbed.capacity`), where it is found, and which machine it was
measured on. Measuring it: :mod:`testbed.machine_costs.measure` (``testbed profile
--machine``).

The file (YAML)::

    machine: {cores: 2, cpu: AMD EPYC, memory_total_bytes: 25276510208, kernel: ..., date: ...}
    values:
      process_uss_bytes: {value: 1.9e8, unit: bytes, source: "testbed profile --machine ... [step 1: ...]"}
      ...

``values`` holds every key of :data:`COST_KEYS` (each with its unit and the command, date and
machine that measured it) and, optionally, each scheme's own CPU per message
(:func:`scheme_message_key`) and the keys of :data:`OPTIONAL_KEYS`. ``machine`` is the machine that measured them.

Which file a run uses (:func:`costs_path`), the first that applies:

1. ``TESTBED_MACHINE_COSTS=PATH`` (:data:`COSTS_ENV`), when set and not empty: that file
   (missing: an error, never a fall-back);
2. the user's cost model, ``$XDG_CONFIG_HOME/dl-netbed/machine_costs.yaml`` (``XDG_CONFIG_HOME``
   unset, empty or relative: ``~/.config``), when it exists;
3. the one shipped with the package, :data:`COSTS_PATH`: measured on the development machine
   (2 vCPUs of an AMD EPYC, 23.5 GiB).

``testbed profile --machine`` writes to :func:`user_costs_path` (the file of 1., else of 2.)
by default. Under ``sudo`` ``~`` is root's home, as it is for ``testbed run``.

A model measured on another machine than this one (:meth:`CostModel.measured_elsewhere`: its
CPU model, logical cores, or total memory beyond :data:`MEMORY_TOLERANCE`) gives
approximate estimates: ``testbed run`` and ``testbed check`` say so in one line, with the
command that measures this machine. Importing this module imports neither torch nor Mininet
(``testbed check`` reads it).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil
import yaml

from common.errors import CapacityError, MissingRequirement, TestbedError
from common.provenance import CostModelSource, cpu_model
from common.validation import load_yaml

__all__ = [
    "COST_KEYS",
    "COSTS_ENV",
    "COSTS_PATH",
    "MEASURE_COMMAND",
    "MEMORY_TOLERANCE",
    "OPTIONAL_KEYS",
    "SCHEME_MESSAGE_UNIT",
    "STEP_NAMES",
    "Cost",
    "CostModel",
    "Machine",
    "check_target",
    "costs_path",
    "in_use",
    "scheme_message_key",
    "user_costs_path",
]

#: the measured cost model shipped with the package (the development machine's)
COSTS_PATH = Path(__file__).resolve().parents[1] / "data" / "machine_costs.yaml"
#: the environment variable naming the cost model file to use (and to write by default)
COSTS_ENV = "TESTBED_MACHINE_COSTS"
#: the user's cost model, under the XDG configuration directory
USER_COSTS = Path("dl-netbed") / "machine_costs.yaml"
#: the command that measures this machine's cost model
MEASURE_COMMAND = "testbed profile --machine"
#: the measurement's steps in the order they run (:data:`testbed.machine_costs.measure.STEPS`)
STEP_NAMES = ("base", "loopback", "networks", "forwarding", "message", "scheme")
#: a recorded total memory this far from this machine's (a fraction of it) is another machine's
MEMORY_TOLERANCE = 0.1

GIB = 1024**3


def user_costs_path() -> Path:
    """The user's cost model file: ``$TESTBED_MACHINE_COSTS`` when set and not empty, else
    ``$XDG_CONFIG_HOME/dl-netbed/machine_costs.yaml`` (``XDG_CONFIG_HOME`` unset, empty or
    relative: ``~/.config``, as the XDG Base Directory specification says). It may not exist."""
    named = os.environ.get(COSTS_ENV)
    if named:
        return Path(named).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME", "")
    base = Path(config) if os.path.isabs(config) else Path.home() / ".config"
    return base / USER_COSTS


def costs_path() -> Path:
    """The cost model file a run uses: ``$TESTBED_MACHINE_COSTS`` when set and not empty
    (whether or not it exists), else the user's file when it exists, else the shipped
    :data:`COSTS_PATH` (module docstring)."""
    user = user_costs_path()
    return user if os.environ.get(COSTS_ENV) or _visible_file(user) else COSTS_PATH


def _visible_file(path: Path) -> bool:
    """Whether ``path`` is a file this process can see. A location it may not search counts
    as no file: a user's ``HOME`` can still be root's (``sudo -E``, ``setpriv``), and a run
    refused for not being root must say so, not fail on root's folder."""
    try:
        return path.is_file()
    except OSError:
        return False


def check_target(out: Path, *, merge: bool = False, replace: bool = False, needs_root: bool = True) -> None:
    """Refuse a measurement of the cost model into ``out`` before it starts.

    Args:
        out: the file to write.
        merge: the measurement merges into ``out`` (``--only``): it must exist.
        replace: an existing ``out`` may be replaced (``--force``).
        needs_root: a step to measure builds networks.

    Raises:
        TestbedError: ``out`` exists and neither ``merge`` nor ``replace``; ``merge`` and
            ``out`` does not exist.
        MissingRequirement: ``needs_root`` and this process is not root.
    """
    if merge and not out.is_file():
        raise TestbedError(f"--only merges into an existing cost model; {out} does not exist")
    if not merge and not replace and out.exists():
        raise TestbedError(
            f"{out} exists; earlier measurements are never overwritten: name another file, or "
            f"pass --force to replace it"
        )
    if needs_root and os.geteuid() != 0:
        raise MissingRequirement(
            "measuring the cost model builds Mininet networks (steps networks and forwarding): run as root (sudo)"
        )


def _remedy(path: Path) -> str:
    """What to do about a cost model file that cannot be used."""
    named = f"{COSTS_ENV} names it; " if os.environ.get(COSTS_ENV) and path == user_costs_path() else ""
    return (
        f"{named}measure this machine with `{MEASURE_COMMAND}` (as root): it writes {user_costs_path()} "
        f"(--force replaces an existing file)"
    )


#: every value of the cost model: key -> (unit, what it is)
COST_KEYS: dict[str, tuple[str, str]] = {
    "process_uss_bytes": ("bytes", "USS of a process that imported torch and the project, idle (reference)"),
    "process_pss_bytes": ("bytes", "PSS of the same process with 3 such processes alive (reference)"),
    "process_shared_bytes": ("bytes", "RSS - USS of that process: library pages every process maps, resident once"),
    "zygote_bytes": ("bytes", "RSS of the zygote: pages every process it forks shares, resident once"),
    "worker_base_uss_bytes": (
        "bytes",
        "USS of a running worker at zero model size, forked by the zygote "
        "(schemes without their own figures: the larger of the measured schemes')",
    ),
    "worker_exec_base_uss_bytes": ("bytes", "the same for a worker started with exec"),
    "worker_bytes_per_param_byte": ("bytes/byte", "a worker's USS per byte of model parameters"),
    "ps_worker_base_uss_bytes": ("bytes", "worker_base_uss_bytes of scheme ps"),
    "ps_worker_exec_base_uss_bytes": ("bytes", "worker_exec_base_uss_bytes of scheme ps"),
    "ps_worker_bytes_per_param_byte": ("bytes/byte", "worker_bytes_per_param_byte of scheme ps"),
    "allreduce_worker_base_uss_bytes": ("bytes", "worker_base_uss_bytes of scheme allreduce"),
    "allreduce_worker_exec_base_uss_bytes": ("bytes", "worker_exec_base_uss_bytes of scheme allreduce"),
    "allreduce_worker_bytes_per_param_byte": ("bytes/byte", "worker_bytes_per_param_byte of scheme allreduce"),
    "server_base_uss_bytes": ("bytes", "USS of a running parameter server at zero model size, forked"),
    "server_exec_base_uss_bytes": ("bytes", "the same for a server started with exec"),
    "server_bytes_per_param_byte": ("bytes/byte", "a server's USS per byte of parameters it holds"),
    "real_compute_worker_bytes": ("bytes", "extra USS of a worker in compute.mode real over emulated"),
    "harness_uss_bytes": ("bytes", "USS of the harness process after importing testbed.cli"),
    "bwm_ng_uss_bytes": ("bytes", "USS of bwm-ng while it samples"),
    "network_host_bytes": ("bytes", "memory per Mininet host with one shaped link"),
    "network_link_bytes": ("bytes", "memory per further shaped link of a host"),
    "process_idle_cores": ("cores", "CPU of a runtime process waiting (emulated compute, small messages)"),
    "runtime_user_cpu_s_per_byte": ("cpu-s/byte", "runtime processes' user CPU per byte they send"),
    "runtime_message_cpu_s": (
        "cpu-s/message",
        "runtime CPU per point-to-point message, sender and receiver "
        "together (Transport over gloo, no emulated per-message cost)",
    ),
    "path_cpu_s_per_byte": ("cpu-s/byte", "busy CPU per byte between two namespaces over one htb-shaped bridge"),
    "extra_bridge_cpu_s_per_byte": ("cpu-s/byte", "busy CPU per byte for each further bridge of a path"),
    "bwm_ng_cpu_s_per_sample": ("cpu-s/sample", "bwm-ng CPU per sample, fixed part"),
    "bwm_ng_cpu_s_per_sample_port": ("cpu-s/sample/port", "bwm-ng CPU per sample per switch port"),
    "qdisc_cpu_s_per_sample": ("cpu-s/sample", "the harness's qdisc sampler CPU per sample, fixed part"),
    "qdisc_cpu_s_per_sample_port": ("cpu-s/sample/port", "the qdisc sampler CPU per sample per switch port"),
    "cpu_sampler_cpu_s_per_sample": ("cpu-s/sample", "the harness's CPU sampler CPU per sample"),
}

#: values a cost model may hold, key -> (unit, what it is); absent, a value counts as 0. They
#: are not measured by ``testbed profile --machine`` but fitted to finished runs by the
#: benchmark each one's source names.
OPTIONAL_KEYS: dict[str, tuple[str, str]] = {
    "path_cpu_s_per_byte_per_host": (
        "cpu-s/byte/host",
        "busy CPU per byte sent, for each host sending at once, "
        "beyond path_cpu_s_per_byte (benchmarks/fit_host_cost.py)",
    ),
}

#: unit of a scheme's own CPU per message (:func:`scheme_message_key`)
SCHEME_MESSAGE_UNIT = "cpu-s/message"


def scheme_message_key(scheme: str) -> str:
    """The cost-model key of scheme ``scheme``'s own CPU per message beyond the runtime's
    (``<scheme>_message_cpu_s``, unit :data:`SCHEME_MESSAGE_UNIT`). Optional: a scheme
    without it (one a researcher adds, or one not measured) adds nothing per message beyond
    ``runtime_message_cpu_s``."""
    return f"{scheme}_message_cpu_s"


def _is_scheme_message_key(key: str) -> bool:
    return key.endswith("_message_cpu_s") and key not in COST_KEYS and key != "_message_cpu_s"


@dataclass(frozen=True)
class Cost:
    """One measured value: ``value`` in ``unit``, and ``source``: the command that measured it,
    the date and the machine (cores, RAM, kernel)."""

    value: float
    unit: str
    source: str


class CostModel:
    """The measured costs of this machine (:data:`COST_KEYS`), read from a YAML file::

        machine: {cores: 2, memory_total_bytes: ..., kernel: ..., cpu: ..., date: ...}
        values:
          process_uss_bytes: {value: 1.9e8, unit: bytes, source: "testbed profile --machine ..."}
          ...

    Besides :data:`COST_KEYS` (all required) it may hold each scheme's own CPU per message,
    ``<scheme>_message_cpu_s`` (:func:`scheme_message_key`; unit ``cpu-s/message``), which
    is optional: a scheme without it adds nothing beyond ``runtime_message_cpu_s``; and the
    keys of :data:`OPTIONAL_KEYS` (:meth:`optional`: 0 when absent).

    ``model[key]`` is the value of ``key``; ``model.costs[key]`` the :class:`Cost`;
    ``model.machine`` the machine that measured them.
    """

    def __init__(self, costs: dict[str, Cost], machine: dict, path: str | Path = "<memory>"):
        self.costs = dict(costs)
        self.machine = dict(machine)
        self.path = str(path)

    def __getitem__(self, key: str) -> float:
        return self.costs[key].value

    def optional(self, key: str) -> float:
        """The value of ``key``, one of :data:`OPTIONAL_KEYS`; 0.0 when the model has none.

        Raises:
            KeyError: ``key`` is not one of :data:`OPTIONAL_KEYS`.
        """
        if key not in OPTIONAL_KEYS:
            raise KeyError(f"{key} is not an optional cost key (one of {', '.join(OPTIONAL_KEYS)})")
        c = self.costs.get(key)
        return c.value if c is not None else 0.0

    def scheme_message_cpu_s(self, scheme: str) -> float:
        """Scheme ``scheme``'s own CPU per message beyond the runtime's (cpu-s/message): the
        value of :func:`scheme_message_key`, 0.0 when the model has none for it."""
        c = self.costs.get(scheme_message_key(scheme))
        return c.value if c is not None else 0.0

    @classmethod
    def load(cls, path: str | Path | None = None) -> CostModel:
        """Read and check a cost model (default :func:`costs_path`: ``$TESTBED_MACHINE_COSTS``,
        else the user's file when it exists, else the shipped :data:`COSTS_PATH`).

        Raises:
            CapacityError: the file is missing or unreadable, not YAML, or a value of
                :data:`COST_KEYS` is missing, not a finite number, in another unit or without
                a source, or a scheme's ``<scheme>_message_cpu_s`` or a key of
                :data:`OPTIONAL_KEYS` that is present is not a finite number >= 0, in
                another unit or without a source; the message names
                the file, the key and the remedy (measure this machine with ``testbed
                profile --machine``).
        """
        path = Path(path) if path is not None else costs_path()
        remedy = _remedy(path)
        try:
            doc = load_yaml(path.read_text(), source=str(path))
        except (OSError, ValueError, yaml.YAMLError) as e:
            raise CapacityError(
                f"cannot read the machine cost model {path} ({type(e).__name__}: {e}); {remedy}"
            ) from None
        if not isinstance(doc, dict) or not isinstance(doc.get("values"), dict):
            raise CapacityError(f"the machine cost model {path} has no 'values' mapping; {remedy}")
        costs, bad = {}, []
        optional = {k: SCHEME_MESSAGE_UNIT for k in doc["values"] if isinstance(k, str) and _is_scheme_message_key(k)}
        optional.update({k: u for k, (u, _) in OPTIONAL_KEYS.items() if k in doc["values"]})
        for key, unit in [*((k, u) for k, (u, _) in COST_KEYS.items()), *optional.items()]:
            v = doc["values"].get(key)
            if not isinstance(v, dict):
                bad.append(f"{key}: missing" if v is None else f"{key}: not a mapping of value, unit, source")
                continue
            value, got_unit, source = v.get("value"), v.get("unit"), v.get("source")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                bad.append(f"{key}: value {value!r} is not a finite number")
            elif key in optional and value < 0:
                bad.append(f"{key}: value {value!r} is negative")
            elif got_unit != unit:
                bad.append(f"{key}: unit {got_unit!r}, expected {unit!r}")
            elif not isinstance(source, str) or not source.strip():
                bad.append(f"{key}: no source")
            else:
                costs[key] = Cost(float(value), unit, source)
        if bad:
            raise CapacityError(f"the machine cost model {path} is incomplete ({'; '.join(bad)}); {remedy}")
        machine = doc.get("machine") if isinstance(doc.get("machine"), dict) else {}
        return cls(costs, machine, path)

    def measured_elsewhere(self, here: Machine | None = None) -> str | None:
        """One line when this model was measured on another machine than ``here`` (default
        :meth:`Machine.current`), else None.

        Compared: the CPU model (``machine.cpu``), the logical cores (``machine.cores``) and
        the total memory (``machine.memory_total_bytes``; another machine's when more than
        :data:`MEMORY_TOLERANCE` of this one's apart); a field the file does not record, or
        that ``here`` does not know, is not compared (a model without a ``machine`` section
        is never flagged). The line names the file (saying so when it is the one shipped with
        the package), what differs and the command that measures this machine.
        """
        here = here if here is not None else Machine.current()
        diffs = _differences(self.machine, here)
        if not diffs:
            return None
        which = f"shipped with dl-netbed ({self.path})" if self.path == str(COSTS_PATH) else self.path
        return (
            f"the cost model {which} was measured on another machine ({'; '.join(diffs)}): its memory and CPU "
            f"estimates and scale: auto are approximate here; measure this machine with `{MEASURE_COMMAND}` "
            f"(as root)"
        )


@dataclass(frozen=True)
class Machine:
    """What this machine offers: logical cores, total and available memory (bytes), and its
    CPU model (``None``: unknown, not compared with a cost model's)."""

    cores: int
    total_bytes: int
    available_bytes: int
    cpu: str | None = None

    @classmethod
    def current(cls) -> Machine:
        """This machine now (``psutil.cpu_count()``, ``psutil.virtual_memory()``,
        :func:`common.provenance.cpu_model`)."""
        vm = psutil.virtual_memory()
        return cls(int(psutil.cpu_count() or 1), int(vm.total), int(vm.available), cpu_model())


def _differences(recorded: Mapping, here: Machine) -> list[str]:
    """What differs between the machine a cost model ``recorded`` and ``here``, one phrase each
    (``"CPU AMD EPYC there, Intel Xeon here"``); fields either side lacks are skipped."""
    out = []
    cpu = recorded.get("cpu")
    if isinstance(cpu, str) and cpu.strip() and here.cpu and cpu.strip() != here.cpu.strip():
        out.append(f"CPU {cpu.strip()} there, {here.cpu.strip()} here")
    cores = recorded.get("cores")
    if isinstance(cores, int) and not isinstance(cores, bool) and cores != here.cores:
        out.append(f"{cores} cores there, {here.cores} here")
    total = recorded.get("memory_total_bytes")
    if (
        isinstance(total, (int, float))
        and not isinstance(total, bool)
        and math.isfinite(total)
        and here.total_bytes > 0
        and abs(total - here.total_bytes) > MEMORY_TOLERANCE * here.total_bytes
    ):
        out.append(f"{total / GIB:.1f} GiB there, {here.total_bytes / GIB:.1f} GiB here")
    return out


def in_use() -> CostModelSource:
    """The cost model a run uses now (:func:`costs_path`) and the machine the file says
    measured it (None when the file cannot be read), for the run's provenance."""
    path = costs_path()
    try:
        machine = CostModel.load(path).machine
    except CapacityError:
        machine = None
    return CostModelSource(path=str(path), measured_on=machine)
