"""Measure this machine's cost model (:mod:`testbed.machine_costs`): what ``testbed profile
--machine`` and ``benchmarks/machine_costs.py`` run (:func:`measure`).

Measures every value :mod:`testbed.capacity` needs (:data:`testbed.machine_costs.COST_KEYS`,
and each built-in scheme's own ``<scheme>_message_cpu_s``), prints the figures and writes
them as YAML to ``OUT`` (refused if it exists, unless replacing it was asked for), each with
its unit and its source: the command, the step that measured it, the date and the machine
(cores, CPU, RAM, kernel); the file's ``machine`` section records the machine (what
:meth:`~testbed.machine_costs.CostModel.measured_elsewhere` compares). Steps:

1. *Base process*: 3 processes that import what a runtime process imports
   (``traffic.runtime.__main__``: torch and the project) and wait; ``psutil``'s
   ``memory_full_info`` of each: USS, PSS (3 sharers) and RSS. The harness: one process that
   imports ``testbed.cli`` and ``testbed.runner``.
2. *Loopback runs* (:func:`testbed.loopback.run_local`, 2 workers on ``kind: rack``; every
   process's USS/PSS/RSS sampled every 0.2 s, peak kept):
   ``ps`` and ``allreduce`` with ``digits_mlp`` and ``alexnet`` (emulated compute, profile
   ``zero``, the zygote launcher) give each role's USS at two model sizes: the line through
   them is its USS at zero parameters and its bytes per parameter byte; ``digits_mlp`` with
   ``run.launcher: exec`` gives the USS at zero parameters of a process that imports
   everything itself (a generic worker's figures are the larger of ``ps``'s and
   ``allreduce``'s); the zygote's RSS is sampled too; ``ps`` with ``digits_mlp`` in real
   compute gives the real mode's extra memory. ``ps`` and ``allreduce`` with ``alexnet`` at
   3 and 13 iterations give the runtime's user CPU per byte sent (difference of the runs'
   children user time, ``getrusage``, over the difference of the bytes sent on ``lo``).
   ``ps`` with ``digits_mlp`` and a profile of 0.2 s per layer forward and backward gives
   the CPU of a waiting process (``cpu_times`` of each process over iterations 1..n-2,
   from the event log).
3. *Networks* (:class:`testbed.network.Network`, ``kind: rack``, 100 Mbit/s links, torn
   down in a ``finally``): ``psutil.virtual_memory().used`` (settled) before and after
   building 10 and 100 hosts (and 100 hosts with 2 links each) gives the memory per host and
   per further link; on networks of 10 and 100 hosts :class:`testbed.capture.Capture` runs
   10 s with the default periods, with and without the qdisc sampler: bwm-ng's CPU (its
   process) and the samplers' (this process) per sample, against the port count.
4. *Forwarding*: iperf3 (TCP, 10 s) between two namespaces over one bridge (``kind: rack``,
   2 hosts) and over three (``rack_core``, 2 racks of 1 host: ToR, core, ToR), each at 1000,
   3000 and 6000 Mbit/s (rates at which the CPU a byte costs is well above the noise); busy
   CPU of the machine from ``psutil.cpu_times`` deltas (busy = all time but idle and
   iowait, as the capture's CPU sampler counts it). The slope of busy cores over received
   bytes/s is the CPU per byte; (3-bridge slope - 1-bridge slope) / 2 per further bridge.
5. *Per-message CPU* (``message``): two processes on 127.0.0.1 in a gloo group
   (:func:`traffic.hostmodel.measure.run_pair`, 1 torch thread each, as the runtime's), each
   with the runtime's :class:`~traffic.runtime.transport.Transport` and an event log, as in
   a run, and a host model that charges no per-message cost (``HostModel()``: overhead 0,
   so nothing is charged and nothing waits: this machine's real CPU, not emulated
   waiting). Rank 0 sends ``N`` float32 messages to rank 1 with ``isend`` in windows of
   :data:`MESSAGE_WINDOW` (then ``wait`` on each, as ``ps`` pushes a layer); rank 1 keeps
   :data:`MESSAGE_WINDOW` ``irecv`` posted ahead (as P3's and PHub's servers) and ``wait``
   s them in order. Sizes :data:`MESSAGE_SIZES`, two counts each
   (:data:`MESSAGE_COUNTS`), every configuration :data:`MESSAGE_REPEATS` times
   (interleaved; median). CPU = user + system of both processes (``psutil`` ``cpu_times``,
   every thread, gloo's included) between two barriers. The least-squares fit
   ``CPU = a x messages + b x bytes + c`` over the configurations gives
   ``runtime_message_cpu_s`` = ``a`` (both ends); ``b`` (which the model already counts
   as ``path_cpu_s_per_byte`` and ``runtime_user_cpu_s_per_byte``) and ``c`` (a run's fixed
   part: barriers, timers) are printed and named in the source.
6. *Each scheme's own CPU per message* (``scheme``): for each scheme of :data:`SCHEMES`,
   :data:`SCHEME_REPEATS` runs (interleaved with the other schemes') of
   :func:`~testbed.loopback.run_local` with :data:`SCHEME_MODEL` (many tensors: many messages),
   :data:`SCHEME_WORKERS` workers (and a server colocated with each, for the schemes that
   have servers), :data:`SCHEME_ITERATIONS` iterations of emulated compute with profile
   ``zero``, scale 1 and ``host: {}`` (no per-message overhead, aggregation and optimizer
   not modelled: the real sums and optimizer steps run, nothing is waited). Within the window
   from the last process's start of iteration :data:`SCHEME_FIRST` to the first process's
   end of iteration ``SCHEME_ITERATIONS - 2`` (start-up and the last iteration's tail
   outside): ``C`` = user + system CPU of every process (``psutil`` ``cpu_times``, every
   thread, sampled every :data:`SCHEME_SAMPLE_S` s, interpolated), ``M`` = the transport
   messages sent and ``B`` their payload bytes (the events: each ``dir: tx``; an
   ``all_reduce`` as gloo's ring sends). ``<scheme>_message_cpu_s`` = ``(C - a x M -
   b x B - runtime_user_cpu_s_per_byte x B - process_idle_cores x processes x window) / M``
   (median run, floored at 0) with step 5's ``a`` (``runtime_message_cpu_s``) and ``b`` (the
   loopback transport's CPU per byte, mostly the kernel's copies: what a network run counts
   in ``path_cpu_s_per_byte``): the CPU a scheme spends per message beyond every term
   :mod:`testbed.capacity` already charges. The real training math is in ``C``: its
   per-byte part (sums, optimizer steps over whole tensors) is what
   ``runtime_user_cpu_s_per_byte`` (step 2, the larger of ``ps``'s and ``allreduce``'s)
   charges and is subtracted with it; what is left is per message (P3's queues, threads and
   per-slice update calls, PHub's per-chunk checks and charges, the events), and negative
   where the model's per-byte charge exceeds the scheme's real work. Step 6 uses steps 2 and
   5's values (this invocation's, else ``OUT``'s; ``b`` is read from the source of
   ``runtime_message_cpu_s``).

Steps 3-4 need root (network namespaces). ``quiet_flag``: before every measurement, wait
(polling every 20 s) until that file exists (a machine kept quiet for measuring), and
measure again when it vanished during the measurement. The values of every finished step
are kept in ``OUT.partial.json`` until ``OUT`` is written; ``resume`` skips the steps it
holds. Run ``testbed clean`` afterwards if the measurement was killed.

``only`` (step names: ``base``, ``loopback``, ``networks``, ``forwarding``, ``message``,
``scheme``) measures only those steps and merges their values into the existing ``OUT``
(which must exist): every other value, and the file's ``machine`` section, stay as they
are; each new value's source names its own command, date and machine.

    sudo testbed profile --machine [OUT.yaml] [--force]
    sudo .venv/bin/python benchmarks/machine_costs.py OUT.yaml [--quiet-flag FILE] [--seconds 10] [--resume]
    .venv/bin/python benchmarks/machine_costs.py OUT.yaml --only message
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import psutil
import torch
import torch.distributed as dist
import yaml

from common.errors import RunFailed, TestbedError
from common.provenance import PROJECT_DIR
from testbed.capture import Capture
from testbed.ledger import Ledger, NetworkLock
from testbed.loopback import local_entries, local_hosts, run_local
from testbed.machine_costs import COST_KEYS, SCHEME_MESSAGE_UNIT, STEP_NAMES, Machine, check_target, scheme_message_key
from testbed.network import Network
from testbed.site import switch_ports
from testbed.spec import CaptureSpec, from_dict
from topologies import TopologySpec
from traffic.compute_profiles.profile import LayerProfile, Profile, load_profile
from traffic.hostmodel import HostModel
from traffic.hostmodel.costs import HostCosts
from traffic.hostmodel.measure import run_pair
from traffic.models import model_info
from traffic.rundir import read_json
from traffic.runtime.events import EventLog
from traffic.runtime.transport import Transport
from traffic.schemes import get as get_scheme
from traffic.schemes.allreduce import gloo_ring_sends

__all__ = ["STEPS", "measure"]

SMALL, BIG = "digits_mlp", "alexnet"
IMPORT_RUNTIME = "import time, traffic.runtime.__main__; print('ready', flush=True); time.sleep(600)"
IMPORT_HARNESS = "import time, testbed.cli, testbed.runner; print('ready', flush=True); time.sleep(600)"
SLOW_LAYER_S = 0.2
LONG = 13  # iterations of the longer alexnet runs (the shorter: 3)
KIB, MIB = 1024, 1024 * 1024
#: step 5: payload bytes of the messages (float32 tensors)
MESSAGE_SIZES = (4 * KIB, 64 * KIB, 256 * KIB, MIB)
#: step 5: the two message counts at each size (about 0.4-2.5 s of CPU each on this machine;
#: CPU times tick at 10 ms)
MESSAGE_COUNTS = {4 * KIB: (5000, 20000), 64 * KIB: (3000, 12000), 256 * KIB: (1000, 4000), MIB: (400, 1600)}
#: step 5: sends in flight (rank 0) and receives posted ahead (rank 1)
MESSAGE_WINDOW = 16
#: step 5: runs of every (size, count), interleaved; the median is kept
MESSAGE_REPEATS = 3
#: step 5: the tag of every message (one tag, as P3's pushes)
MESSAGE_TAG = 7
#: step 6: the schemes measured (the built-in schemes that run the runtime; ``program`` runs
#: a researcher's own processes, not the runtime, and has no figure)
SCHEMES = ("ps", "allreduce", "p3", "phub", "pipe_sgd", "stanza", "ibatch")
#: step 6: the model (161 parameter tensors, 102 MB: many messages of every scheme)
SCHEME_MODEL = "resnet50"
#: step 6: workers of each run (parameter servers: one colocated with each)
SCHEME_WORKERS = 4
#: step 6: iterations of each run; the measured window runs from the last process's start of
#: iteration SCHEME_FIRST to the first process's end of iteration SCHEME_ITERATIONS - 2 (start-up,
#: the first iterations and the last one's tail are outside it)
SCHEME_ITERATIONS = 14
SCHEME_FIRST = 2
#: step 6: period of the processes' CPU samples, s
SCHEME_SAMPLE_S = 0.1
#: step 6: runs of every scheme (interleaved); the median is kept
SCHEME_REPEATS = 3


class Bench:
    """Shared state: the output file, the command, the machine, the quiet flag, the measured
    values."""

    def __init__(self, out: Path, command: str, seconds: float = 10.0, quiet_flag: str | None = None):
        self.out, self.command, self.seconds, self.quiet_flag = Path(out), command, seconds, quiet_flag
        self.date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
        here = Machine.current()
        self.machine = {
            "cores": here.cores,
            "cpu": here.cpu,
            "memory_total_bytes": here.total_bytes,
            "kernel": platform.release(),
            "date": self.date,
        }
        self.values: dict[str, dict] = {}
        self.transport_per_byte: float | None = None  # step 5's b (CPU per byte), for step 6
        self._absent_at = -1.0  # time.monotonic() when the quiet flag was last seen missing
        self._runs = 0
        if quiet_flag:
            threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while True:
            if not Path(self.quiet_flag).exists():
                self._absent_at = time.monotonic()
            time.sleep(0.5)

    def quiet(self, what: str, fn):
        """``fn()``, measured while the quiet flag exists throughout: measured again when the
        flag vanished meanwhile (someone else may have loaded the machine)."""
        while True:
            self.wait_quiet(what)
            t0 = time.monotonic()
            out = fn()
            time.sleep(0.6)  # one period of the watcher
            if self._absent_at < t0:
                return out
            print(f"  ({self.quiet_flag} vanished during: {what}; measuring it again)", flush=True)

    def label(self, what: str) -> str:
        """A unique directory name for one attempt of a measurement."""
        self._runs += 1
        return f"{what}-{self._runs}"

    def wait_quiet(self, what: str) -> None:
        flag = self.quiet_flag
        if not flag:
            return
        while not Path(flag).exists():
            print(f"  (waiting for {flag} before: {what})", flush=True)
            time.sleep(20)

    def put(self, key: str, value: float, step: str) -> None:
        unit = COST_KEYS[key][0] if key in COST_KEYS else SCHEME_MESSAGE_UNIT
        m = self.machine
        self.values[key] = {
            "value": float(value),
            "unit": unit,
            "source": f"{self.command} [{step}] on {self.date}; machine: {m['cores']} cores ({m['cpu']}), "
            f"{m['memory_total_bytes'] / 2**30:.1f} GiB RAM, kernel {m['kernel']}",
        }
        print(f"  {key} = {value:.6g} {unit}", flush=True)


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


# ------------------------------------------------------------------------------ 1. base process


def idle_processes(code: str, n: int) -> list[dict]:
    """Start ``n`` processes running ``code`` (which prints 'ready' then sleeps); once all are
    ready, their memory_full_info (uss, pss, rss); they are killed afterwards."""
    procs = []
    try:
        for _ in range(n):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", code], cwd=PROJECT_DIR, stdout=subprocess.PIPE, start_new_session=True
                )
            )
        for p in procs:
            if p.stdout.readline().strip() != b"ready":
                raise RunFailed(f"probe process failed: {code}")
        time.sleep(2)
        out = []
        for p in procs:
            mi = psutil.Process(p.pid).memory_full_info()
            out.append({"uss": mi.uss, "pss": mi.pss, "rss": mi.rss})
        return out
    finally:
        for p in procs:
            p.kill()
            p.wait()


def base_process(b: Bench) -> None:
    print("1. base process memory", flush=True)
    rt = b.quiet("base process", lambda: idle_processes(IMPORT_RUNTIME, 3))
    for i, r in enumerate(rt):
        print(f"  runtime process {i}: USS {mib(r['uss'])}, PSS {mib(r['pss'])}, RSS {mib(r['rss'])}")
    uss = sum(r["uss"] for r in rt) / len(rt)
    pss = sum(r["pss"] for r in rt) / len(rt)
    shared = sum(r["rss"] - r["uss"] for r in rt) / len(rt)
    how = (
        "3 processes 'python -c \"import traffic.runtime.__main__\"' (torch + the project) idle; "
        "psutil memory_full_info, mean of the 3"
    )
    b.put("process_uss_bytes", uss, f"step 1: {how}: USS")
    b.put("process_pss_bytes", pss, f"step 1: {how}: PSS (3 sharers)")
    b.put("process_shared_bytes", shared, f"step 1: {how}: RSS - USS")
    (h,) = b.quiet("harness process", lambda: idle_processes(IMPORT_HARNESS, 1))
    print(f"  harness: USS {mib(h['uss'])}, PSS {mib(h['pss'])}, RSS {mib(h['rss'])}")
    b.put("harness_uss_bytes", h["uss"], "step 1: one process 'import testbed.cli, testbed.runner' idle; USS")


# ------------------------------------------------------------------------------ 2. loopback runs


def loopback(b: Bench, spec: dict, label: str, tmp: Path) -> dict:
    """Run ``spec`` with run_local; per process the peak USS/PSS/RSS and (t, cpu s) samples;
    the children's rusage delta, wall time, bytes sent (results, and on ``lo``), and the
    worker0 event log."""
    return b.quiet(f"loopback {label}", lambda: _loopback(spec, b.label(label), tmp))


def _loopback(spec: dict, label: str, tmp: Path) -> dict:
    exp = from_dict(spec)
    launched, peaks, cpu = [], {}, {}
    stop = threading.Event()
    me = psutil.Process()

    def sample_one(name: str, role: str, pid: int) -> None:
        try:
            p = psutil.Process(pid)
            ct = p.cpu_times()
            t = time.time()
            mi = p.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return
        cpu.setdefault(name, []).append((t, ct.user + ct.system))
        pk = peaks.setdefault(name, {"role": role, "uss": 0, "pss": 0, "rss": 0})
        pk["uss"], pk["pss"], pk["rss"] = max(pk["uss"], mi.uss), max(pk["pss"], mi.pss), max(pk["rss"], mi.rss)

    def sample():
        while not stop.is_set():
            for l in list(launched):
                sample_one(l.info["name"], l.info["role"], l.popen.pid)
            for c in me.children():  # the zygote (run.launcher: zygote)
                try:
                    if any("traffic.runtime.zygote" in a for a in c.cmdline()):
                        sample_one("zygote", "zygote", c.pid)
                except psutil.Error:
                    pass
            stop.wait(0.2)

    th = threading.Thread(target=sample, daemon=True)
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    lo0 = psutil.net_io_counters(pernic=True)["lo"].bytes_sent
    t0 = time.perf_counter()
    th.start()
    try:
        run_dir = run_local(exp, tmp / label, on_start=launched.append)
    finally:
        stop.set()
        th.join()
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    lo1 = psutil.net_io_counters(pernic=True)["lo"].bytes_sent
    results = [read_json(p) for p in sorted((run_dir / "results").glob("*.json"))]
    events = [json.loads(l) for l in (run_dir / "events" / "worker0.jsonl").read_text().splitlines() if l.strip()]
    out = {
        "peaks": peaks,
        "cpu": cpu,
        "user_s": r1.ru_utime - r0.ru_utime,
        "system_s": r1.ru_stime - r0.ru_stime,
        "wall_s": wall,
        "bytes_sent": sum(r["bytes_sent"] for r in results),
        "lo_bytes": lo1 - lo0,
        "events": events,
    }
    roles = ", ".join(
        f"{n} USS {mib(p['uss'])} PSS {mib(p['pss'])} RSS {mib(p['rss'])}" for n, p in sorted(peaks.items())
    )
    print(
        f"  {label} ({exp.run.launcher}): {wall:.1f} s, user {out['user_s']:.1f} s, system {out['system_s']:.1f} s, "
        f"sent {out['bytes_sent'] / 1e6:.1f} MB (lo {out['lo_bytes'] / 1e6:.1f} MB); peaks: {roles}",
        flush=True,
    )
    return out


def role_peak(run: dict, role: str) -> float:
    """Mean peak USS of the processes of ``role``."""
    v = [p["uss"] for p in run["peaks"].values() if p["role"] == role]
    return sum(v) / len(v)


def workload(
    scheme: str, model: str, iterations: int, mode: str = "emulated", profile: str = "zero", launcher: str = "zygote"
) -> dict:
    w = {
        "scheme": scheme,
        "model": model,
        "iterations": iterations,
        "workers": 2,
        "compute": {"mode": mode} if mode == "real" else {"mode": mode, "profile": profile},
    }
    return {
        "name": "machine-costs",
        "topology": {"kind": "rack", "hosts_per_rack": 2},
        "workload": w,
        "run": {"timeout_s": 900, "launcher": launcher},
    }


def slow_profile(path: Path) -> str:
    """A profile of SMALL at batch 32: SLOW_LAYER_S per layer forward and backward."""
    zero = load_profile("zero", SMALL, 32)
    Profile(
        model=SMALL,
        device="slow",
        batch_size=32,
        derived=False,
        method="synthetic: a fixed time per layer (a temporary profile of this benchmark)",
        source=f"testbed.machine_costs.measure: {SLOW_LAYER_S} s per layer, to keep processes waiting",
        layers=[LayerProfile(l.index, l.name, SLOW_LAYER_S, SLOW_LAYER_S) for l in zero.layers],
    ).save(path)
    return str(path)


def cpu_in_window(samples: list[tuple[float, float]], ta: float, tb: float) -> float | None:
    """CPU seconds between ``ta`` and ``tb`` from (t, cumulative cpu s) samples (interpolated)."""

    def at(t):
        for (t0, c0), (t1, c1) in zip(samples, samples[1:]):
            if t0 <= t <= t1:
                return c0 + (c1 - c0) * (t - t0) / (t1 - t0) if t1 > t0 else c0
        return None

    a, z = at(ta), at(tb)
    return None if a is None or z is None else z - a


def loopback_runs(b: Bench, tmp: Path) -> None:
    print("2. loopback runs", flush=True)
    small, big = model_info(SMALL)["param_bytes"], model_info(BIG)["param_bytes"]
    runs = {}
    for scheme in ("ps", "allreduce"):
        for launcher in ("zygote", "exec"):
            runs[(scheme, SMALL, launcher)] = loopback(
                b, workload(scheme, SMALL, 5, launcher=launcher), f"{scheme}-{SMALL}-5-{launcher}", tmp
            )
        for it in (3, LONG):
            runs[(scheme, BIG, it)] = loopback(b, workload(scheme, BIG, it), f"{scheme}-{BIG}-{it}", tmp)
    real = loopback(b, workload("ps", SMALL, 5, mode="real"), f"ps-{SMALL}-5-real", tmp)
    prof = slow_profile(tmp / "slow-profile.json")
    n_it = 10
    slow = loopback(b, workload("ps", SMALL, n_it, profile=prof), f"ps-{SMALL}-{n_it}-slow", tmp)

    run_desc = (
        "run_local of {workload: {scheme: %s, model: M, workers: 2, iterations: 5 (alexnet: 3 and "
        f"{LONG}), "
        "compute: {mode: emulated, profile: zero}}, topology: {kind: rack, hosts_per_rack: 2}, run: {launcher: "
        f"L}}}} for M = {SMALL} ({small} parameter bytes, L = zygote and exec) and {BIG} ({big}, L = zygote); "
        "peak USS of each process sampled every 0.2 s (psutil memory_full_info)"
    )
    fits = {}
    for scheme, role in (("ps", "worker"), ("ps", "server"), ("allreduce", "worker")):
        lo = role_peak(runs[(scheme, SMALL, "zygote")], role)
        lo_exec = role_peak(runs[(scheme, SMALL, "exec")], role)
        hi = max(role_peak(runs[(scheme, BIG, 3)], role), role_peak(runs[(scheme, BIG, LONG)], role))
        slope = (hi - lo) / (big - small)
        fits[(scheme, role)] = {"per": slope, "base": lo - slope * small, "exec": lo_exec - slope * small}
        print(
            f"  {scheme} {role}: USS {mib(lo)} ({SMALL}; exec {mib(lo_exec)}), {mib(hi)} ({BIG}): {slope:.3f} bytes "
            f"per parameter byte; at 0 parameters {mib(lo - slope * small)} (exec {mib(lo_exec - slope * small)})"
        )

    def put_role(prefix: str, f: dict, scheme: str, role: str, note: str = "") -> None:
        d = run_desc % scheme
        b.put(f"{prefix}_bytes_per_param_byte", f["per"], f"step 2: {d}: {role} slope (M = {BIG} vs {SMALL}){note}")
        b.put(
            f"{prefix}_base_uss_bytes",
            f["base"],
            f"step 2: {d}: {role} intercept at 0 parameter bytes, L = zygote{note}",
        )
        b.put(
            f"{prefix}_exec_base_uss_bytes",
            f["exec"],
            f"step 2: {d}: {role} intercept at 0 parameter bytes, "
            f"L = exec (USS at {SMALL} minus the slope's share){note}",
        )

    put_role("ps_worker", fits[("ps", "worker")], "ps", "worker")
    put_role("allreduce_worker", fits[("allreduce", "worker")], "allreduce", "worker")
    put_role("server", fits[("ps", "server")], "ps", "server (1, holding the whole model)")
    pw, aw = fits[("ps", "worker")], fits[("allreduce", "worker")]
    put_role(
        "worker",
        {k: max(pw[k], aw[k]) for k in pw},
        "ps|allreduce",
        "worker",
        " (for schemes not measured on their own: the larger of ps's and allreduce's)",
    )
    zyg = max(r["peaks"]["zygote"]["rss"] for r in runs.values() if "zygote" in r["peaks"])
    b.put(
        "zygote_bytes",
        zyg,
        f"step 2: {run_desc % 'ps|allreduce'}: RSS of the zygote (largest of the L = zygote "
        f"runs): its pages, shared with every process it forks, resident once",
    )
    extra = role_peak(real, "worker") - role_peak(runs[("ps", SMALL, "zygote")], "worker")
    b.put(
        "real_compute_worker_bytes",
        max(extra, 0.0),
        f"step 2: peak worker USS of run_local {{scheme: ps, model: {SMALL}, workers: 2, iterations: 5, compute: "
        f"{{mode: real}}, dataset: digits, batch_size: 32}} minus that of the same run with emulated compute "
        f"(launcher zygote): measured {extra:.0f}; a negative value is floored at 0",
    )

    per_byte = []
    for scheme in ("ps", "allreduce"):
        a, z = runs[(scheme, BIG, 3)], runs[(scheme, BIG, LONG)]
        u = (z["user_s"] - a["user_s"]) / (z["lo_bytes"] - a["lo_bytes"])
        per_byte.append((u, scheme))
        print(
            f"  {scheme}: runtime user CPU {u * 1e9:.3f} ns per byte sent "
            f"({z['user_s'] - a['user_s']:.2f} s for {(z['lo_bytes'] - a['lo_bytes']) / 1e6:.0f} MB on lo)"
        )
    u, which = max(per_byte)
    b.put(
        "runtime_user_cpu_s_per_byte",
        u,
        f"step 2: run_local of {{scheme: S, model: {BIG}, workers: 2, compute: {{mode: emulated, profile: zero}}}} "
        f"at 3 and {LONG} iterations: (children user CPU, getrusage, of the {LONG}-iteration run - the 3-iteration "
        f"run) / (bytes sent on lo, psutil.net_io_counters, difference); the larger of S = ps, allreduce ({which}; "
        + ", ".join(f"{s} {v:.3g}" for v, s in per_byte)
        + ")",
    )

    its = [e for e in slow["events"] if e["kind"] == "iteration"]
    first = next(e for e in its if e["iteration"] == 1)
    last = next(e for e in its if e["iteration"] == n_it - 2)
    ta, tb = first["ts"], last["ts"] + last["dur"]
    rates = {}
    for name, smp in slow["cpu"].items():
        c = cpu_in_window(smp, ta, tb)
        if c is not None and name != "zygote":
            rates[name] = c / (tb - ta)
    print(f"  waiting processes over {tb - ta:.1f} s: " + ", ".join(f"{n} {r * 100:.2f}%" for n, r in rates.items()))
    b.put(
        "process_idle_cores",
        sum(rates.values()) / len(rates),
        f"step 2: run_local of {{scheme: ps, model: {SMALL}, workers: 2, iterations: {n_it}, compute: {{mode: "
        f"emulated, profile: {SLOW_LAYER_S} s per layer forward and backward}}}}: mean over its 3 processes of "
        f"(user + system CPU, psutil cpu_times sampled every 0.2 s) / wall time over iterations 1..{n_it - 2}",
    )


# ------------------------------------------------------------------------------ 3-4. networks


@contextlib.contextmanager
def network(spec: TopologySpec, label: str, tmp: Path):
    """A built Network (run directory under ``tmp``), always stopped."""
    run_dir = tmp / label
    (run_dir / "logs").mkdir(parents=True)
    with NetworkLock():
        ledger = Ledger.create(f"machine-costs-{label}", run_dir)
        net = Network(spec, [], run_dir, ledger)
        try:
            net.start()
            yield net
        finally:
            left = net.stop()
            if left:
                print(f"  teardown removed leftovers: {', '.join(left)}")


def busy_s() -> float:
    """Busy CPU seconds of the machine so far (all cores; idle and iowait count as idle)."""
    t = psutil.cpu_times()
    total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
    return total - t.idle - getattr(t, "iowait", 0.0)


def capture_cost(net, label: str, tmp: Path, seconds: float, qdisc: bool) -> dict:
    """Run Capture on every switch port for ``seconds``: bwm-ng's and this process's CPU, the
    samples each recorder took, bwm-ng's USS."""
    ports = switch_ports(net.topology)
    run_dir = tmp / label
    me = psutil.Process()
    cap = Capture(run_dir, ports=ports, qdisc_ifaces=ports, spec=CaptureSpec(qdisc=qdisc))
    with cap:
        bwm = psutil.Process(cap.bwm.pid)
        time.sleep(1)
        c0, m0, t0 = bwm.cpu_times(), me.cpu_times(), time.perf_counter()
        time.sleep(seconds)
        c1, m1, t1 = bwm.cpu_times(), me.cpu_times(), time.perf_counter()
        uss = bwm.memory_full_info().uss
    dt = t1 - t0
    bwm_cpu = (c1.user + c1.system - c0.user - c0.system) / dt
    me_cpu = (m1.user + m1.system - m0.user - m0.system) / dt
    traces = run_dir / "traces"

    def per_s(name: str, sep: str, header: bool, only: str | None = None) -> float:
        """Samples per second of a trace: distinct timestamps (first field) over their span
        (``only``: of the lines whose second field is that)."""
        p = traces / name
        lines = p.read_text().splitlines()[1 if header else 0 :] if p.exists() else []
        ts = sorted({float(l.split(sep)[0]) for l in lines if sep in l and (only is None or l.split(sep)[1] == only)})
        return (len(ts) - 1) / (ts[-1] - ts[0]) if len(ts) > 1 else 0.0

    out = {
        "ports": len(ports),
        "bwm_cores": bwm_cpu,
        "harness_cores": me_cpu,
        "bwm_uss": uss,
        "bwm_samples_per_s": per_s("bwm-ng.csv", ";", False, only="total"),
        "qdisc_samples_per_s": per_s("qdisc.csv", ",", True),
        "cpu_samples_per_s": per_s("cpu.csv", ",", True),
    }
    print(
        f"  capture {label}: {len(ports)} ports, qdisc {qdisc}: bwm-ng {bwm_cpu * 100:.2f}% of a core "
        f"({out['bwm_samples_per_s']:.0f} samples/s), harness {me_cpu * 100:.2f}% "
        f"(qdisc {out['qdisc_samples_per_s']:.1f}/s, cpu {out['cpu_samples_per_s']:.1f}/s), bwm-ng USS {mib(uss)}",
        flush=True,
    )
    return out


def settled_used(limit_s: float = 60.0) -> int:
    """``psutil.virtual_memory().used`` once it has settled (the last 5 one-second samples
    within 2 MiB: the kernel frees the namespaces of a stopped network asynchronously)."""
    samples, t0 = [], time.monotonic()
    while True:
        samples.append(psutil.virtual_memory().used)
        last = samples[-5:]
        if len(last) == 5 and max(last) - min(last) < 2 * 2**20 or time.monotonic() - t0 > limit_s:
            return int(sum(last) / len(last))
        time.sleep(1)


def network_memory(b: Bench, n: int, k: int, tmp: Path) -> tuple[int, int]:
    """(used after - used before, host shells' USS) of building ``n`` hosts of ``k`` links."""
    spec = TopologySpec(kind="rack", hosts_per_rack=n, host_bw_mbps=100, interfaces_per_host=k)
    before = settled_used()
    with network(spec, b.label(f"net{n}x{k}"), tmp) as net:
        after = settled_used()
        shells = sum(psutil.Process(h.pid).memory_full_info().uss for h in net.net.hosts)
    print(f"  {n} hosts x {k} links: used +{mib(after - before)} (host shells' USS {mib(shells)})", flush=True)
    return after - before, shells


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares line through (x, y) points: (intercept, slope)."""
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return my - slope * mx, slope


def networks(b: Bench, tmp: Path) -> None:
    print("3. network memory and capture CPU", flush=True)
    small, big = 10, 100
    mem = {
        (n, k): b.quiet(f"network of {n} hosts x {k} links", lambda n=n, k=k: network_memory(b, n, k, tmp))[0]
        for n, k in ((small, 1), (big, 1), (big, 2))
    }
    how = (
        "testbed.network.Network of TopologySpec(kind=rack, hosts_per_rack=N, host_bw_mbps=100, "
        "interfaces_per_host=K); psutil.virtual_memory().used once settled (5 one-second samples within 2 MiB) "
        "after the build minus before it"
    )
    b.put(
        "network_host_bytes",
        (mem[(big, 1)] - mem[(small, 1)]) / (big - small),
        f"step 3: {how}: (N={big} - N={small}, K=1) / {big - small} (+{mem[(small, 1)]} bytes for {small} hosts, "
        f"+{mem[(big, 1)]} for {big})",
    )
    link = (mem[(big, 2)] - mem[(big, 1)]) / big
    b.put(
        "network_link_bytes",
        max(link, 0.0),
        f"step 3: {how}: (K=2 - K=1 at N={big}) / {big} (+{mem[(big, 2)]} bytes with K=2; measured {link:.0f} "
        f"per link; a negative value is floored at 0)",
    )
    cap = {}
    for n in (small, big):
        spec = TopologySpec(kind="rack", hosts_per_rack=n, host_bw_mbps=100)
        with network(spec, b.label(f"capnet{n}"), tmp) as net:
            for q in (True, False):
                cap[(n, q)] = b.quiet(
                    f"capture on {n} hosts, qdisc {q}",
                    lambda q=q: capture_cost(net, b.label(f"cap{n}{'q' if q else ''}"), tmp, b.seconds, q),
                )
    b.put(
        "bwm_ng_uss_bytes",
        max(c["bwm_uss"] for c in cap.values()),
        "step 3: USS of bwm-ng sampling the switch ports every 10 ms (largest of the capture runs)",
    )
    capd = (
        "testbed.capture.Capture(ports=switch ports, qdisc_ifaces=switch ports, CaptureSpec(qdisc=Q)) on the "
        f"Network of N hosts (kind rack, 1 link each), {b.seconds:g} s, no training processes; CPU from "
        "psutil cpu_times of bwm-ng and of this process (the samplers' threads); samples per second from the "
        "traces' timestamps (bwm-ng: its 'total' lines)"
    )
    bwm = [
        (cap[(n, True)]["ports"], cap[(n, q)]["bwm_cores"] / cap[(n, q)]["bwm_samples_per_s"])
        for n in (small, big)
        for q in (True, False)
    ]
    icpt, slope = fit(bwm)
    listing = ", ".join(f"{p} ports: {v:.3g}" for p, v in bwm)
    b.put(
        "bwm_ng_cpu_s_per_sample_port",
        max(slope, 0.0),
        f"step 3: {capd}: bwm-ng CPU per sample, "
        f"least-squares slope over ports, N={small} and N={big}, Q both ({listing} s per sample)",
    )
    b.put("bwm_ng_cpu_s_per_sample", max(icpt, 0.0), f"step 3: {capd}: bwm-ng CPU per sample, intercept at 0 ports")
    q = [
        (
            cap[(n, True)]["ports"],
            (cap[(n, True)]["harness_cores"] - cap[(n, False)]["harness_cores"])
            / cap[(n, True)]["qdisc_samples_per_s"],
        )
        for n in (small, big)
    ]
    qi, qs = fit(q)
    b.put(
        "qdisc_cpu_s_per_sample_port",
        max(qs, 0.0),
        f"step 3: {capd}: (harness CPU with Q=true - with Q=false) "
        f"per qdisc sample, slope over ports between N={small} and N={big} ({q[0][1]:.3g} and {q[1][1]:.3g} s per "
        f"sample)",
    )
    b.put("qdisc_cpu_s_per_sample", max(qi, 0.0), f"step 3: {capd}: qdisc sampler CPU per sample, intercept at 0 ports")
    cs = [cap[(n, False)]["harness_cores"] / cap[(n, False)]["cpu_samples_per_s"] for n in (small, big)]
    b.put(
        "cpu_sampler_cpu_s_per_sample",
        sum(cs) / 2,
        f"step 3: {capd}: harness CPU with Q=false per CPU sample (mean of N={small} and N={big}: {cs[0]:.3g}, "
        f"{cs[1]:.3g})",
    )


def iperf_busy(net, src: str, dst: str, seconds: float) -> tuple[float, float]:
    """(received bytes/s, busy cores of the machine) of one iperf3 TCP flow src -> dst."""
    server = net.hosts[dst].popen(["iperf3", "-s", "-1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1)
        client = net.hosts[src].popen(
            ["iperf3", "-c", net.hosts[dst].IP(), "-t", str(int(seconds)), "-J"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        b0, t0 = busy_s(), time.perf_counter()
        out, err = client.communicate(timeout=seconds + 60)
        b1, t1 = busy_s(), time.perf_counter()
        if client.returncode != 0:
            raise RunFailed(f"iperf3 failed: {err.decode()[-1000:]}")
        end = json.loads(out)["end"]["sum_received"]
        return end["bytes"] / end["seconds"], (b1 - b0) / (t1 - t0)
    finally:
        server.kill()
        server.wait()


def idle_busy(seconds: float) -> float:
    b0, t0 = busy_s(), time.perf_counter()
    time.sleep(seconds)
    return (busy_s() - b0) / (time.perf_counter() - t0)


def forwarding(b: Bench, tmp: Path) -> None:
    print("4. forwarding CPU", flush=True)
    rates = (1000.0, 3000.0, 6000.0)
    slopes = {}
    for bridges, spec_kw in (
        (1, dict(kind="rack", hosts_per_rack=2)),
        (3, dict(kind="rack_core", racks=2, hosts_per_rack=1)),
    ):
        pts = []
        for rate in rates:
            spec = TopologySpec(host_bw_mbps=rate, **spec_kw)
            with network(spec, b.label(f"fwd{bridges}-{rate:g}"), tmp) as net:
                base, (bps, busy) = b.quiet(
                    f"iperf3 over {bridges} bridge(s) at {rate:g} Mbit/s",
                    lambda net=net: (idle_busy(5), iperf_busy(net, "h1", "h2", b.seconds)),
                )
            pts.append((bps, busy, base))
            print(
                f"  {bridges} bridge(s), {rate:g} Mbit/s: received {bps * 8 / 1e6:.1f} Mbit/s, busy {busy:.3f} cores "
                f"(idle network {base:.3f}): {(busy - base) / bps * 1e9:.3f} ns per byte above idle",
                flush=True,
            )
        slopes[bridges] = (fit([(x, y) for x, y, _ in pts])[1], pts)
    how = (
        "iperf3 -c (TCP, {s:g} s) from h1 to h2 of a testbed.network.Network ({desc}) with host_bw_mbps "
        + ", ".join(f"{r:g}" for r in rates)
        + "; busy cores from psutil.cpu_times deltas over the client's run "
        "(busy = all but idle and iowait); least-squares slope of busy cores over received bytes/s"
    )
    one, three = slopes[1][0], slopes[3][0]

    def fmt(pts):
        return "; ".join(f"{x * 8 / 1e6:.0f} Mbit/s: {y:.3f} cores (idle {z:.3f})" for x, y, z in pts)

    b.put(
        "path_cpu_s_per_byte",
        one,
        "step 4: " + how.format(s=b.seconds, desc="kind rack, 2 hosts: 1 bridge") + f" ({fmt(slopes[1][1])})",
    )
    extra = (three - one) / 2
    b.put(
        "extra_bridge_cpu_s_per_byte",
        max(extra, 0.0),
        "step 4: "
        + how.format(s=b.seconds, desc="kind rack_core, 2 racks of 1 host: 3 bridges")
        + f" ({fmt(slopes[3][1])}): (3-bridge slope {three:.4g} - 1-bridge slope {one:.4g}) / 2"
        + ("" if extra >= 0 else " floored at 0"),
    )


# ------------------------------------------------------------------------------ 5. per-message CPU


def _cpu_s() -> float:
    """User + system CPU seconds of this process so far (every thread)."""
    t = psutil.Process().cpu_times()
    return t.user + t.system


def _message_stream(rank: int, plan: list[tuple[int, int]], log_dir: str) -> list[dict] | None:
    """:func:`traffic.hostmodel.measure.run_pair` target: for each ``(nbytes, n)`` of ``plan``,
    rank 0 sends ``n`` float32 messages of ``nbytes`` to rank 1 through :class:`Transport`
    (``isend`` in windows of :data:`MESSAGE_WINDOW`, then ``wait`` on each); rank 1 keeps
    :data:`MESSAGE_WINDOW` ``irecv`` posted ahead and waits them in order. Each process's
    user + system CPU between two barriers; rank 1 hands its figures to rank 0 afterwards.

    Returns (rank 0): per plan entry ``{"nbytes", "n", "cpu_s": [rank 0's, rank 1's],
    "wall_s"}``; rank 1: None.
    """
    events = EventLog(Path(log_dir) / f"p{rank}.jsonl", f"p{rank}", "worker" if rank == 0 else "server", rank)
    # a host model stating no per-message overhead: the transport charges nothing, waits for nothing
    tr = Transport(events, rank, 2, costs=HostCosts(HostModel()))
    out = []
    for nbytes, n in plan:
        bufs = [torch.zeros(nbytes // 4) for _ in range(MESSAGE_WINDOW)]
        pending = (
            [tr.irecv(bufs[k], 0, tag=MESSAGE_TAG, kind="push") for k in range(min(MESSAGE_WINDOW, n))]
            if rank == 1
            else []
        )
        dist.barrier()
        c0, t0 = _cpu_s(), time.perf_counter()
        if rank == 0:
            for lo in range(0, n, MESSAGE_WINDOW):
                tr.wait_all(
                    [tr.isend(bufs[k], 1, tag=MESSAGE_TAG, kind="push") for k in range(min(MESSAGE_WINDOW, n - lo))]
                )
        else:
            for i in range(n):
                k = i % MESSAGE_WINDOW
                pending[k].wait()
                if i + MESSAGE_WINDOW < n:
                    pending[k] = tr.irecv(bufs[k], 0, tag=MESSAGE_TAG, kind="push")
        c1, t1 = _cpu_s(), time.perf_counter()
        dist.barrier()
        mine = torch.tensor([c1 - c0, t1 - t0], dtype=torch.float64)
        if rank == 1:
            dist.send(mine, 0)
        else:
            other = torch.empty(2, dtype=torch.float64)
            dist.recv(other, 1)
            out.append(
                {
                    "nbytes": nbytes,
                    "n": n,
                    "cpu_s": [float(mine[0]), float(other[0])],
                    "wall_s": max(float(mine[1]), float(other[1])),
                }
            )
    events.close()
    return out if rank == 0 else None


def fit_messages(runs: list[dict]) -> tuple[float, float, float]:
    """Least squares ``CPU = a x messages + b x bytes + c`` over runs (``n``, ``nbytes``,
    summed ``cpu_s``): ``(a, b, c)`` in CPU seconds per message, per byte and per run.

    Raises:
        ValueError: fewer than 3 runs, or fewer than 2 sizes (a and b not separable).
    """
    if len(runs) < 3 or len({r["nbytes"] for r in runs}) < 2:
        raise ValueError("need at least 3 runs at 2 or more message sizes")
    x = np.array([[r["n"], r["n"] * r["nbytes"], 1.0] for r in runs], dtype=float)
    y = np.array([sum(r["cpu_s"]) for r in runs], dtype=float)
    (a, b, c), *_ = np.linalg.lstsq(x, y, rcond=None)
    return float(a), float(b), float(c)


def message_cpu(b: Bench, tmp: Path) -> None:
    print("5. per-message CPU of the runtime's transport", flush=True)
    configs = [(nb, n) for nb in MESSAGE_SIZES for n in MESSAGE_COUNTS[nb]]
    warm = [(64 * KIB, 200)]  # connections, allocator, event log opened: not measured
    log_dir = tmp / b.label("messages")
    log_dir.mkdir(parents=True)

    def measure():
        return run_pair(_message_stream, (warm + configs * MESSAGE_REPEATS, str(log_dir)), threads=1, timeout_s=900)[
            len(warm) :
        ]

    load = os.getloadavg()[0]
    raw = b.quiet("per-message CPU", measure)
    med = []
    for nb, n in configs:
        mine = [r for r in raw if (r["nbytes"], r["n"]) == (nb, n)]
        tot = sorted(mine, key=lambda r: sum(r["cpu_s"]))
        m = tot[len(tot) // 2]  # the median run (by summed CPU)
        med.append(m)
        print(
            f"  {n} x {nb // KIB} KiB: CPU {sum(m['cpu_s']):.3f} s (sender {m['cpu_s'][0]:.3f}, receiver "
            f"{m['cpu_s'][1]:.3f}) in {m['wall_s']:.2f} s; runs: " + ", ".join(f"{sum(r['cpu_s']):.3f}" for r in mine),
            flush=True,
        )
    a, per_byte, c = fit_messages(med)
    resid = [sum(r["cpu_s"]) - (a * r["n"] + per_byte * r["n"] * r["nbytes"] + c) for r in med]
    print(
        f"  fit: {a * 1e6:.1f} us per message + {per_byte * 1e9:.3f} ns per byte + {c * 1e3:.1f} ms per run "
        f"(largest residual {max(abs(x) for x in resid) * 1e3:.1f} ms)",
        flush=True,
    )
    if a <= 0:
        raise RunFailed(f"per-message CPU fit is not positive ({a:.3g} s): the machine was too noisy; run again")
    b.transport_per_byte = per_byte
    listing = "; ".join(f"{r['n']} x {r['nbytes']} B: {sum(r['cpu_s']):.3f} s" for r in med)
    b.put(
        "runtime_message_cpu_s",
        a,
        "step 5: traffic.hostmodel.measure.run_pair (2 processes, gloo over TCP on 127.0.0.1, 1 torch thread each), "
        "traffic.runtime.transport.Transport with an EventLog and HostCosts(HostModel()) (per-message overhead 0: "
        f"nothing charged, nothing waited); rank 0 isends N float32 messages to rank 1 in windows of "
        f"{MESSAGE_WINDOW} (wait each), rank 1 keeps {MESSAGE_WINDOW} irecvs posted ahead; CPU = user + system "
        f"of both processes (psutil cpu_times, all threads) between barriers; sizes and counts "
        + ", ".join(f"{nb} B x {MESSAGE_COUNTS[nb]}" for nb in MESSAGE_SIZES)
        + f", each {MESSAGE_REPEATS} times interleaved, median; least-squares CPU = a x messages + b x bytes "
        f"+ c: a (this value, both ends), b = {per_byte:.4g} s/byte, c = {c:.4g} s ({listing}); 1-minute load "
        f"average {load:.2f} at the start",
    )


# ------------------------------------------------------------------------------ 6. schemes' own CPU per message


def scheme_spec(scheme: str, iterations: int) -> dict:
    """The step-6 run of ``scheme``: :data:`SCHEME_MODEL`, :data:`SCHEME_WORKERS` workers,
    emulated compute of profile ``zero``, a host model stating no cost (``host: {}``: no
    per-message overhead, aggregation and optimizer not modelled: real work, nothing waited),
    scale 1, a server colocated with each worker for the schemes that have servers."""
    w = {
        "scheme": scheme,
        "model": SCHEME_MODEL,
        "workers": SCHEME_WORKERS,
        "iterations": iterations,
        "warmup_iterations": 0,
        "compute": {"mode": "emulated", "profile": "zero"},
    }
    spec = {
        "name": "machine-costs",
        "scale": 1,
        "host": {},
        "topology": {"kind": "rack", "hosts_per_rack": 8},
        "workload": w,
        "run": {"timeout_s": 600, "launcher": "zygote"},
    }
    if any(e["role"] == "server" for e in local_entries(from_dict(spec))):
        w["servers"] = {"count": 0, "placement": "colocated"}
    return spec


def read_run_events(run_dir: Path) -> list[dict]:
    """Every event of a run (all ``events/*.jsonl``)."""
    return [
        json.loads(line)
        for f in sorted((run_dir / "events").glob("*.jsonl"))
        for line in f.read_text().splitlines()
        if line.strip()
    ]


def iteration_window(events: list[dict], first: int, last: int) -> tuple[float, float]:
    """``(ta, tb)`` (unix s): the latest start of iteration ``first`` and the earliest end of
    iteration ``last`` over the processes that log ``iteration`` events.

    Raises:
        ValueError: a process lacks one of them, or the window is empty.
    """
    its: dict[str, dict[int, dict]] = {}
    for e in events:
        if e["kind"] == "iteration":
            its.setdefault(e["proc"], {})[e["iteration"]] = e
    if not its or any(first not in v or last not in v for v in its.values()):
        raise ValueError(f"iterations {first} and {last} are not in every process's events")
    ta = max(v[first]["ts"] for v in its.values())
    tb = min(v[last]["ts"] + v[last]["dur"] for v in its.values())
    if tb <= ta:
        raise ValueError(f"empty window: iteration {first} starts at {ta:.3f} after iteration {last} ends at {tb:.3f}")
    return ta, tb


def count_messages(events: list[dict], ta: float, tb: float) -> tuple[float, float]:
    """Transport messages and payload bytes sent between ``ta`` and ``tb`` (unix s, by each
    event's ``ts``: a send's posting) by every process: each point-to-point send (``dir: tx``)
    is one message of its ``bytes``; a gloo ``all_reduce`` (the only collective a scheme issues
    per iteration) is its ring's messages and bytes
    (:func:`~traffic.schemes.allreduce.gloo_ring_sends`), counted once (each member logs it:
    1/``group_size`` per event).

    Raises:
        ValueError: another collective in the window (not counted here).
    """
    msgs = sent = 0.0
    for e in events:
        if not ta <= e["ts"] < tb:
            continue
        if e.get("dir") == "tx":
            msgs, sent = msgs + 1, sent + e["bytes"]
        elif "group_size" in e and not e["kind"].startswith("host_") and e["kind"] != "barrier":
            if e["kind"] != "allreduce":
                raise ValueError(f"a collective {e['kind']!r} in the window: only all_reduce is counted")
            m, nb = gloo_ring_sends(int(e["bytes"]), int(e["group_size"]))
            msgs, sent = msgs + m / e["group_size"], sent + nb / e["group_size"]
    return msgs, sent


def cpu_at(samples: list[tuple[float, float, float]], t: float) -> tuple[float, float]:
    """(user, system) CPU seconds of one process at ``t`` from its ``(t, user, system)``
    samples, interpolated.

    Raises:
        ValueError: ``t`` outside the samples.
    """
    for (t0, u0, s0), (t1, u1, s1) in zip(samples, samples[1:]):
        if t0 <= t <= t1:
            f = (t - t0) / (t1 - t0) if t1 > t0 else 0.0
            return u0 + (u1 - u0) * f, s0 + (s1 - s0) * f
    raise ValueError(f"no CPU samples around {t:.3f}")


def scheme_run(b: Bench, scheme: str, tmp: Path) -> dict:
    """One step-6 run of ``scheme`` (:func:`scheme_spec`): every process's user and system CPU
    (``psutil`` ``cpu_times``, all threads, sampled every :data:`SCHEME_SAMPLE_S` s,
    interpolated), the messages and bytes sent (:func:`count_messages`), both within the
    window of :func:`iteration_window`; its length and the processes."""
    exp = from_dict(scheme_spec(scheme, SCHEME_ITERATIONS))

    def run():
        label = b.label(scheme)
        launched, samples, procs = [], {}, {}
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                for l in list(launched):
                    name = l.info["name"]
                    try:
                        p = procs.get(name) or procs.setdefault(name, psutil.Process(l.popen.pid))
                        ct = p.cpu_times()
                    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                        continue
                    samples.setdefault(name, []).append((time.time(), ct.user, ct.system))
                stop.wait(SCHEME_SAMPLE_S)

        th = threading.Thread(target=sample, daemon=True)
        th.start()
        try:
            run_dir = run_local(exp, tmp / label, on_start=launched.append)
        finally:
            stop.set()
            th.join()
        events = read_run_events(run_dir)
        ta, tb = iteration_window(events, SCHEME_FIRST, SCHEME_ITERATIONS - 2)
        user = system = 0.0
        for _name, smp in samples.items():
            (ua, sa), (ub, sb) = cpu_at(smp, ta), cpu_at(smp, tb)
            user, system = user + ub - ua, system + sb - sa
        msgs, sent = count_messages(events, ta, tb)
        shutil.rmtree(run_dir, ignore_errors=True)
        return {
            "user_s": user,
            "system_s": system,
            "window_s": tb - ta,
            "messages": msgs,
            "bytes": sent,
            "processes": len(samples),
        }

    return b.quiet(f"{scheme}, {SCHEME_ITERATIONS} iterations", run)


def _model_value(b: Bench, key: str) -> float:
    """A cost-model value: this invocation's, else the existing OUT's."""
    if key in b.values:
        return b.values[key]["value"]
    doc = yaml.safe_load(b.out.read_text()) if b.out.exists() else {}
    v = (doc.get("values") or {}).get(key)
    if not isinstance(v, dict):
        raise TestbedError(f"step scheme needs {key} (steps loopback and message): measure them first")
    return float(v["value"])


def _transport_per_byte(b: Bench) -> float:
    """Step 5's per-byte CPU of the transport on loopback (the fit's ``b``): this invocation's,
    else read from the source of ``runtime_message_cpu_s`` (the same fit as its value; resumed
    from OUT.partial.json, else OUT's)."""
    if b.transport_per_byte is not None:
        return b.transport_per_byte
    if "runtime_message_cpu_s" in b.values:
        src = b.values["runtime_message_cpu_s"]["source"]
    else:
        doc = yaml.safe_load(b.out.read_text()) if b.out.exists() else {}
        src = ((doc.get("values") or {}).get("runtime_message_cpu_s") or {}).get("source", "")
    m = re.search(r"\bb = ([0-9.eE+-]+) s/byte", src)
    if m is None:
        raise TestbedError(
            "step scheme needs step message's per-byte fit (b = ... s/byte in the source of "
            "runtime_message_cpu_s): run --only message --only scheme"
        )
    return float(m.group(1))


def scheme_message_cpu(b: Bench, tmp: Path) -> None:
    print("6. each scheme's own CPU per message", flush=True)
    a = _model_value(b, "runtime_message_cpu_s")
    per_byte_rt = _model_value(b, "runtime_user_cpu_s_per_byte")
    idle = _model_value(b, "process_idle_cores")
    per_byte_lo = _transport_per_byte(b)
    load = os.getloadavg()[0]
    runs: dict[str, list[dict]] = {s: [] for s in SCHEMES}
    for rep in range(SCHEME_REPEATS):
        for scheme in SCHEMES:
            r = scheme_run(b, scheme, tmp)
            cpu, msgs, sent, wall = r["user_s"] + r["system_s"], r["messages"], r["bytes"], r["window_s"]
            transport = a * msgs + per_byte_lo * sent
            math_bytes = per_byte_rt * sent
            waiting = idle * r["processes"] * wall
            r.update(
                cpu=cpu,
                transport=transport,
                math=math_bytes,
                waiting=waiting,
                own=(cpu - transport - math_bytes - waiting) / msgs,
                own_no_lo=(cpu - a * msgs - math_bytes - waiting) / msgs,
            )
            runs[scheme].append(r)
            print(
                f"  {scheme} (repeat {rep + 1}): {wall:.2f} s window: CPU {cpu:.3f} s (user {r['user_s']:.3f}, "
                f"system {r['system_s']:.3f}), {msgs:.0f} messages, {sent / 1e6:.1f} MB ({sent / msgs / 1e3:.1f} kB "
                f"each); transport {transport:.3f} s, per-byte runtime {math_bytes:.3f} s, waiting {waiting:.3f} s: "
                f"own {r['own'] * 1e6:.1f} us per message ({r['own_no_lo'] * 1e6:.1f} without the loopback "
                f"per-byte part)",
                flush=True,
            )
    for scheme in SCHEMES:
        rs = sorted(runs[scheme], key=lambda r: r["own"])
        m = rs[len(rs) // 2]
        spec = scheme_spec(scheme, SCHEME_ITERATIONS)
        exp = from_dict(spec)
        model_bytes = get_scheme(scheme).message_bytes(exp.workload, _plan_of(exp))
        servers = ", servers: {count: 0, placement: colocated}" if "servers" in spec["workload"] else ""
        floored = "" if m["own"] >= 0 else f" (measured {m['own']:.4g}, floored at 0)"
        listing = ", ".join(f"{r['own'] * 1e6:.1f}" for r in runs[scheme])
        b.put(
            scheme_message_key(scheme),
            max(m["own"], 0.0),
            f"step 6: run_local of {{scheme: {scheme}, model: {SCHEME_MODEL}, workers: {SCHEME_WORKERS}{servers}, "
            f"iterations: {SCHEME_ITERATIONS}, compute: {{mode: emulated, profile: zero}}}}, scale 1, host: {{}} "
            f"(no per-message overhead; aggregation and optimizer real, not waited), launcher zygote; window from "
            f"the last process's start of iteration {SCHEME_FIRST} to the first one's end of iteration "
            f"{SCHEME_ITERATIONS - 2}: C = user + system CPU of every process (psutil cpu_times, all threads, "
            f"sampled every {SCHEME_SAMPLE_S:g} s, interpolated), M = transport messages and B = payload bytes "
            f"sent (events by ts: each dir tx; an all_reduce as gloo's ring sends); own = (C - "
            f"runtime_message_cpu_s {a:.4g} x M - step 5's loopback transport {per_byte_lo:.4g} s/byte x B (what a "
            f"network run counts in path_cpu_s_per_byte) - runtime_user_cpu_s_per_byte {per_byte_rt:.4g} x B (the "
            f"per-byte work: gloo's copies and sums, aggregation and optimizer on real tensors) - "
            f"process_idle_cores {idle:.4g} x {m['processes']} processes x window) / M: median of "
            f"{SCHEME_REPEATS} runs interleaved with the other schemes' ({listing} us){floored}; median run: "
            f"{m['window_s']:.2f} s, C {m['cpu']:.3f} s (user {m['user_s']:.3f}), M {m['messages']:.0f} "
            f"({m['bytes'] / m['messages']:.0f} B each; Scheme.message_bytes {model_bytes:.0f}), B "
            f"{m['bytes'] / 1e6:.1f} MB; without subtracting the loopback per-byte part "
            f"{m['own_no_lo'] * 1e6:.1f} us; 1-minute load average {load:.2f} at the start",
        )


def _plan_of(exp):
    """The scheme's plan on the run's local hosts (as run_local plans it)."""
    return get_scheme(exp.workload.scheme).plan(exp.workload, local_hosts(exp))


#: the steps: name (:data:`testbed.machine_costs.STEP_NAMES`, in that order), function, whether it
#: needs root, keys that show it is done (``resume``)
STEPS = (
    ("base", base_process, False, ("process_uss_bytes", "harness_uss_bytes")),
    ("loopback", loopback_runs, False, ("worker_bytes_per_param_byte", "process_idle_cores")),
    ("networks", networks, True, ("network_host_bytes", "cpu_sampler_cpu_s_per_sample")),
    ("forwarding", forwarding, True, ("path_cpu_s_per_byte", "extra_bridge_cpu_s_per_byte")),
    ("message", message_cpu, False, ("runtime_message_cpu_s",)),
    ("scheme", scheme_message_cpu, False, tuple(scheme_message_key(s) for s in SCHEMES)),
)
HEADER = "# Measured cost model of this machine for testbed.capacity; written by testbed profile --machine.\n"


def merge(out: Path, values: dict[str, dict]) -> None:
    """Replace or add ``values`` in the cost model file ``out``; every other value and the
    ``machine`` section stay as they are (values in :data:`COST_KEYS` order, others after)."""
    doc = yaml.safe_load(out.read_text())
    old = doc.get("values") or {}
    merged = {**old, **values}
    doc["values"] = {
        **{k: merged[k] for k in COST_KEYS if k in merged},
        **{k: v for k, v in merged.items() if k not in COST_KEYS},
    }
    _write(out, doc, replace=True)


def _write(out: Path, doc: dict, replace: bool) -> None:
    """Write the cost model ``doc`` to ``out``: created (never over an existing file), or with
    ``replace`` written beside it and renamed over it."""
    text = HEADER + yaml.safe_dump(doc, sort_keys=False, width=120)
    if not replace:
        with open(out, "x") as f:
            f.write(text)
        return
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(out)


def measure(
    out: str | Path,
    *,
    command: str,
    only: Sequence[str] = (),
    resume: bool = False,
    replace: bool = False,
    seconds: float = 10.0,
    quiet_flag: str | None = None,
) -> Path:
    """Measure this machine's cost model (module docstring) and write it to ``out``, printing
    each step's figures as it goes.

    Args:
        out: the YAML file to write (its directory is created); with ``only``, the existing
            file to merge into.
        command: the command line named in every value's source (``testbed profile
            --machine ...``).
        only: measure only these steps (:data:`STEP_NAMES`) and merge their values into
            ``out``; empty: every step.
        resume: keep the values of ``OUT.partial.json`` (the steps a failed invocation
            finished) and measure only the rest.
        replace: replace an existing ``out`` once every value is measured (without it, an
            existing ``out`` is refused before measuring).
        seconds: length of each CPU measurement of steps 3 and 4, s.
        quiet_flag: a file that must exist during every measurement (see the module docstring).

    Returns:
        ``out``.

    Raises:
        TestbedError: a step name not in :data:`STEP_NAMES`; ``out`` exists (without
            ``replace`` or ``only``), or is missing with ``only``; step ``scheme`` without the
            values it needs.
        MissingRequirement: not root, and a step to measure builds networks (networks,
            forwarding).
        RunFailed: a measurement failed (a probe process, iperf3, a fit the noise broke),
            or a value was not measured.
    """
    out = Path(out)
    unknown = [s for s in only if s not in STEP_NAMES]
    if unknown:
        raise TestbedError(f"unknown step {', '.join(map(repr, unknown))}: one of {', '.join(STEP_NAMES)}")
    steps = [s for s in STEPS if not only or s[0] in only]
    check_target(out, merge=bool(only), replace=replace, needs_root=any(root for _, _, root, _ in steps))
    b = Bench(out, command, seconds=seconds, quiet_flag=quiet_flag)
    print(f"machine: {b.machine}", flush=True)
    if only:
        with tempfile.TemporaryDirectory(prefix="machine-costs-") as d:
            for _, step, _, _ in steps:
                step(b) if step is base_process else step(b, Path(d))
        merge(out, b.values)
        print(f"merged {', '.join(b.values)} into {out}")
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial.json")
    if resume and partial.exists():  # values of the steps a failed invocation finished
        b.values.update(json.loads(partial.read_text()))
        print(f"resumed {len(b.values)} values from {partial}")
    with tempfile.TemporaryDirectory(prefix="machine-costs-") as d:
        tmp = Path(d)
        for _, step, _, keys in steps:
            if all(k in b.values for k in keys):
                continue
            step(b) if step is base_process else step(b, tmp)
            partial.write_text(json.dumps(b.values, indent=1))
    missing = [k for k in COST_KEYS if k not in b.values]
    if missing:
        raise RunFailed(f"not measured: {', '.join(missing)} (the values measured so far are in {partial})")
    doc = {
        "machine": b.machine,
        "values": {**{k: b.values[k] for k in COST_KEYS}, **{k: v for k, v in b.values.items() if k not in COST_KEYS}},
    }
    _write(out, doc, replace)
    partial.unlink(missing_ok=True)
    print(f"wrote {out}")
    return out
