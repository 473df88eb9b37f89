"""Run every process of a run on this machine over loopback (no Mininet, no root).

Tests and developers run schemes with it::

    from testbed.spec import from_dict
    from testbed.loopback import run_local
    exp = from_dict({"workload": {"scheme": "ps", "iterations": 20, "workers": 4}})
    run_dir = run_local(exp, "runs/try-ps")

It builds the spec's Topo (a plain graph, no root needed) with the hosts the scheme asks
for (:meth:`Scheme.hosts`), reads its hosts (:func:`topologies.hosts_of`: the same names,
racks, kinds and interfaces as the real network), asks the scheme for its plan, gives every
process ip ``127.0.0.1`` and iface ``lo``, picks a free master port, and starts and watches
the processes with :mod:`testbed.launch` exactly as the harness does (forked from a zygote
unless ``run.launcher`` is ``exec``; inside :func:`shared_zygote` the runs share one). Nothing is shaped,
nothing is captured and no ``background`` flow runs (``scale: auto`` runs at 1): the run directory gets
provenance.json, spec.yaml,
processes.json, events/, results/, params/ and logs/ (no topology.json, traces/ or
summary.json).

Command line: ``python -m testbed.loopback SPEC.yaml [--set path=value ...] [--run-dir DIR]``.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from common.errors import FieldError, RunFailed, SpecError, TestbedError
from testbed import launch
from testbed.spec import AUTO, Experiment, load_spec, with_scale, write_spec
from topologies import HostInfo, build_topo, hosts_of
from traffic import rundir, schemes

__all__ = ["local_hosts", "local_entries", "free_port", "run_local", "shared_zygote"]

LOCAL_IP = "127.0.0.1"
LOCAL_IFACE = "lo"

#: the zygote that :func:`shared_zygote` keeps for the runs started inside it
_shared: launch.Zygote | None = None


@contextlib.contextmanager
def shared_zygote() -> Iterator[launch.Zygote]:
    """Every :func:`run_local` run inside this context that forks its processes forks them
    from one zygote, started here (torch's import and the warm-up paid once, as a sweep's
    points share theirs) and ended on leaving. A run whose zygote died meanwhile starts
    its own, as outside the context. Not reentrant: an inner context keeps the outer's."""
    global _shared
    if _shared is not None:
        yield _shared
        return
    _shared = launch.Zygote(netns=False).start()
    try:
        yield _shared
    finally:
        zygote, _shared = _shared, None
        zygote.close()


def local_hosts(exp: Experiment) -> list[HostInfo]:
    """The hosts the network of ``exp`` would have (the Topo graph's), worker and requested
    hosts only (background hosts carry no training process)."""
    scheme = schemes.get(exp.workload.scheme)
    topo = build_topo(exp.topology, scheme.hosts(exp.workload, exp.topology))
    return [h for h in hosts_of(topo) if h.kind != "background"]


def local_entries(exp: Experiment) -> list[dict]:
    """``processes.json`` entries (without ranks) of the scheme's plan on the local hosts.

    Every process gets ip 127.0.0.1 and iface ``lo`` whatever interface it is planned on
    (``iface_index`` records ``ProcessPlan.iface``).

    Raises:
        SpecError: the plan does not fit the topology (too many workers or servers, or an
            interface its host would not have).
    """
    hosts = {h.name: h for h in local_hosts(exp)}
    plan = schemes.get(exp.workload.scheme).plan(exp.workload, list(hosts.values()))
    for p in plan:
        if not 0 <= p.iface < hosts[p.host].interfaces:
            raise SpecError(
                f"plan of {p.name}", p.iface, f"interfaces 0..{hosts[p.host].interfaces - 1} of host {p.host}"
            )
    program = launch.program_entry(exp.workload.program) if exp.workload.program else {}
    return [
        {
            "name": p.name,
            "role": p.role,
            "index": p.index,
            "host": p.host,
            "rack": hosts[p.host].rack,
            "ip": LOCAL_IP,
            "iface": LOCAL_IFACE,
            "iface_index": p.iface,
            **program,
        }
        for p in plan
    ]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the OS's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOCAL_IP, 0))
        return s.getsockname()[1]


def run_local(
    exp: Experiment,
    run_dir: str | Path | None = None,
    *,
    timeout_s: float | None = None,
    env: dict[str, str] | None = None,
    poll_s: float = 0.2,
    on_start: Callable[[launch.Launched], None] | None = None,
) -> Path:
    """Run ``exp`` (no sweep) on loopback and wait for every process to finish.

    Args:
        exp: a validated experiment (``testbed.spec.from_dict`` / ``load_spec``).
        run_dir: directory to create (must not exist); default ``<run.runs_dir>/<run.id or
            name-timestamp>``.
        timeout_s: overall limit in seconds (default ``run.timeout_s``).
        env: extra environment variables for every process (e.g. ``TESTBED_CRASH_AT``).
        poll_s: how often exit codes are polled, in seconds.
        on_start: called with each process as soon as it is started (e.g. to record pids).

    Returns:
        The run directory.

    Raises:
        TestbedError: the run directory exists, or the spec has a sweep.
        SpecError: the plan does not fit the topology.
        RunFailed: a process exited non-zero (message: its log tail) or the timeout passed;
            every process of the run has been killed by then.
    """
    if exp.sweep:
        raise TestbedError("run_local runs one experiment; expand the sweep first (testbed.spec.expand_sweep)")
    bad = [
        FieldError(
            f"events[{i}]",
            e.given(),
            "a compute_slowdown on loopback (testbed.loopback builds no network "
            "and kills nothing: link and kill events need testbed run)",
        )
        for i, e in enumerate(exp.events)
        if e.kind != "compute_slowdown"
    ]
    if bad:
        raise SpecError.of(bad)
    if exp.scale == AUTO:  # no emulated network and no capture to keep within the CPU: undilated
        exp = with_scale(exp, 1.0)
    if run_dir is None:
        run_dir = rundir.create(
            exp.run.runs_dir, exp.run.id or rundir.new_run_id(exp.name), exclusive_id=exp.run.id is not None
        )
    else:
        run_dir = Path(run_dir)
        run_dir = rundir.create(run_dir.parent, run_dir.name)
    write_spec(run_dir / "spec.yaml", exp, rundir.write_provenance(run_dir))
    entries = local_entries(exp)
    doc = launch.write_processes(run_dir, entries, LOCAL_IP, free_port(), exp.run.timeout_s)
    extra = dict(env or {})

    program = exp.workload.program  # a researcher's program runs its own command: no zygote
    zygote = own = None
    if exp.run.launcher == "zygote" and program is None:
        zygote = _shared if _shared is not None and _shared.alive() else None
        if zygote is None:
            zygote = own = launch.Zygote(netns=False).start()

    def env_for(info: dict) -> dict:
        return {**(launch.program_env(info, doc, run_dir, program) if program else launch.process_env(info)), **extra}

    procs: list[launch.Launched] = []

    def started(batch: list[launch.Launched]) -> None:
        procs.extend(batch)  # known at once: an interrupted start still kills what it started
        for l in batch if on_start else ():
            on_start(l)

    try:
        launch.start(
            run_dir,
            doc,
            on_start=started,
            env_for=env_for,
            fork=launch.Fork(zygote, lambda info: (None, None)) if zygote is not None else None,
        )
        launch.watch(procs, exp.run.timeout_s if timeout_s is None else timeout_s, poll_s=poll_s)
    finally:
        launch.kill_all(procs)  # no-op when all exited; on any error nothing is left running
        if own is not None:
            own.close()
    return run_dir


def main(argv: list[str] | None = None) -> int:
    """Command line: run a spec locally, print the run directory. Exit status 1 when the run
    failed (a process died or timed out), 2 for any other TestbedError (a bad spec, file or
    argument), as ``testbed``."""
    ap = argparse.ArgumentParser(prog="python -m testbed.loopback", description=__doc__.split("\n")[0])
    ap.add_argument("spec")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE")
    ap.add_argument("--run-dir")
    a = ap.parse_args(argv)
    try:
        run_dir = run_local(load_spec(a.spec, a.overrides), a.run_dir)
    except RunFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except TestbedError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
