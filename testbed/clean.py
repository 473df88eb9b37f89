"""``testbed clean``: remove what killed runs left on the machine.

First every stale ledger (see :mod:`testbed.ledger`) is swept: its processes killed, its
interfaces and bridges deleted. Then, in case a ledger itself was lost, a pattern sweep
removes objects that only this testbed makes (the name patterns of :mod:`topologies.hosts`,
and cgroups named ``testbed-*``, :mod:`testbed.cgroups` and :mod:`testbed.lifetime`, whose
processes are killed):
bridges ``torN``/``coreN``, interfaces ``<node>-ethK`` (``hN``, ``psN``, ``fcN``, ``bgN``,
``torN``, ``coreN``) in the root namespace, and processes running ``-m traffic.runtime``, or
a bwm-ng, a tcpdump or a background iperf3 (or the ``sh`` that delays it) writing into a
run's ``traces/``. Mininet host namespaces are unnamed: they vanish with their shell process
(recorded in the ledger) or when their last interface's peer is deleted and no process holds
them.

A run whose runner died leaves a run directory without ``summary.json``; ``clean`` writes it
from whatever the run had written (its ``provenance.json`` too), with status ``killed``
(:func:`mark_killed`).

While a run is live (its harness holds the network lock), ``clean`` refuses; ``clean --force``
then removes only what dead runs left, and never touches the live run's objects: the
bridges and interfaces its ledger lists and every process descended from its harness.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
from pyroute2 import IPRoute

from common.errors import TestbedError
from testbed.cgroups import testbed_cgroups
from testbed.ledger import (
    Ledger,
    NetworkLock,
    _kill_tree,
    delete_link,
    describe_holder,
    live_ledgers,
    lock_holder,
    stale_ledgers,
)
from testbed.lifetime import kill_cgroup
from topologies.hosts import BRIDGE_RE, INTF_RE, NODE_RE
from traffic.rundir import is_run


def _in_other_netns(pid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
    except OSError:
        return False


def _our_process(p: psutil.Process) -> bool:
    """A training process inside a Mininet host, or a capture process of a run."""
    try:
        cmd = p.cmdline()
    except psutil.Error:  # gone, zombie or not ours to read
        return False
    text = " ".join(cmd)
    if cmd and cmd[0] == "bash" and any(NODE_RE.match(a[len("mininet:") :]) for a in cmd if a.startswith("mininet:")):
        return True  # a Mininet node's shell (holds a host's network namespace)
    if "traffic.runtime" in text and "-m" in cmd and _in_other_netns(p.pid):
        return True  # (processes of the local launcher live in the root namespace: not ours to kill)
    if "traffic.runtime.zygote" in cmd and "--netns" in cmd:
        return True  # the harness's zygote (the local launcher's, without --netns, is not ours to kill)
    if cmd and Path(cmd[0]).name == "bwm-ng" and "/traces/" in text:
        return True
    if cmd and Path(cmd[0]).name == "tcpdump" and "/traces/pcap/" in text:
        return True
    if cmd and Path(cmd[0]).name == "iperf3" and "--logfile" in text and "/traces/" in text:
        return True
    if cmd and Path(cmd[0]).name == "sh" and "iperf3" in text and "/traces/background/" in text:
        return True  # a background flow's client still sleeping until its start
    return False


def mark_killed(led: Ledger) -> str | None:
    """Write ``summary.json`` of the run of a stale ledger if its runner died before writing
    it: status ``killed``, the error saying so, and every figure the run's files still give
    (:func:`analysis.metrics.summarize`). Nothing the run wrote is removed or changed.

    Returns:
        a line for the clean report, or None when there was nothing to mark.
    """
    d = Path(led.run_dir) if led.run_dir else None
    if d is None or not is_run(d) or (d / "summary.json").exists():
        return None
    from analysis.metrics import summarize  # lazy: pandas, only when a killed run needs its summary

    when = time.strftime("%Y-%m-%d %H:%M:%S")
    summarize(
        d,
        status="killed",
        error=f"the runner (pid {led.owner_pid}) died before the run ended; "
        f"'testbed clean' removed what it left on the machine at {when}",
    )
    return f"run {d} marked killed (its files are kept)"


def sweep_dead_runs(net_dir: Path = Path("/sys/class/net")) -> list[str]:
    """What a new run does first, holding the network lock: sweep the ledger of every run
    whose runner died (its cgroup's processes, its host shells, interfaces and bridges) and
    mark its run directory ``killed``; then refuse if interfaces or bridges named as this
    testbed's remain in ``net_dir`` without a ledger (the killed runner's ledger was lost).

    Returns:
        one line per dead run swept, saying what was removed (empty when there was none).

    Raises:
        TestbedError: interfaces or bridges named as the testbed's are on the machine
            without a ledger; the message names them and ``testbed clean``.
    """
    lines = []
    for led in stale_ledgers():
        removed = led.sweep()
        marked = mark_killed(led)
        if not removed and not marked:
            continue
        counts: dict[str, int] = {}
        for line in removed:
            kind = line.split()[0] if line.split() else "object"
            counts[kind] = counts.get(kind, 0) + 1
        what = (
            ", ".join(
                f"{n} {kind}{'es' if n > 1 and kind.endswith('s') else 's' if n > 1 else ''}"
                for kind, n in counts.items()
            )
            or "nothing left"
        )
        lines.append(
            f"the run {led.run_dir or led.path.name} had died (runner pid {led.owner_pid}): removed what it "
            f"left ({what}){'; marked killed' if marked else ''}"
        )
    ours = [p.name for p in sorted(net_dir.iterdir()) if INTF_RE.match(p.name) or BRIDGE_RE.match(p.name)]
    if ours:
        raise TestbedError(
            f"{len(ours)} interfaces and bridges named as this testbed's are on the machine and no "
            f"run's ledger lists them ({', '.join(ours[:6])}{' ...' if len(ours) > 6 else ''}): a "
            f"killed run left them; run 'testbed clean' first"
        )
    return lines


def clean(force: bool = False) -> list[str]:
    """Remove leftovers of dead runs and mark their run directories ``killed``.

    With ``force`` while a run is live, remove only what dead runs left: the live run's
    ledgered bridges and interfaces and every process descended from its harness are kept.

    Returns:
        one line per removed object (and per run marked killed).

    Raises:
        TestbedError: a run is in progress (its harness holds the network lock) and
            ``force`` is false; the message names the run.
    """
    removed = []
    try:
        lock = NetworkLock().__enter__()
    except TestbedError:
        holder = lock_holder()
        if not force:
            raise TestbedError(
                f"a testbed run is in progress: {describe_holder(holder) if holder else 'a run'}. It tears down "
                f"after itself. To stop it: Ctrl-C in its terminal or kill its pid, then 'testbed clean'. "
                f"'testbed clean --force' removes only what dead runs left, never the live run's objects"
            ) from None
        lock = None
    try:
        live = live_ledgers()
        keep_names = {n for led in live for n in led.bridges + led.interfaces}
        keep_pids = set().union(*(led.owner_processes() for led in live)) if live else set()
        for led in stale_ledgers():
            led.bridges = [n for n in led.bridges if n not in keep_names]
            led.interfaces = [n for n in led.interfaces if n not in keep_names]
            led.pids = {k: v for k, v in led.pids.items() if v not in keep_pids}
            removed += led.sweep()
            marked = mark_killed(led)
            if marked:
                removed.append(marked)
        keep_pids |= set().union(*(led.owner_processes() for led in live_ledgers())) if live else set()
        for p in psutil.process_iter():
            if p.pid not in keep_pids and _our_process(p):
                try:
                    what = " ".join(p.cmdline()[:4])
                except psutil.Error:
                    what = "?"
                if _kill_tree(p.pid, check_start=False):  # found now, not read from a ledger
                    removed.append(f"process {p.pid} ({what})")
        ours = [
            p.name
            for p in sorted(Path("/sys/class/net").iterdir())
            if (INTF_RE.match(p.name) or BRIDGE_RE.match(p.name)) and p.name not in keep_names
        ]
        if ours and lock is None:
            # a live run's objects not yet in its ledger would match the patterns too: while a
            # run is live only ledgered objects of dead runs are removed
            ours = []
        if ours:
            with IPRoute() as ipr:
                for n in ours:
                    bridge = BRIDGE_RE.match(n) is not None
                    if delete_link(ipr, n, bridge=bridge):
                        removed.append(f"{'bridge' if bridge else 'interface'} {n}")
        if lock is not None:  # cgroups whose ledger was lost (none is live: the lock is ours): their processes die
            for p in testbed_cgroups():
                removed += [f"process {line} (in cgroup {p})" for line in kill_cgroup(p)]
                removed.append(f"cgroup {p}")
    finally:
        if lock is not None:
            lock.__exit__(None, None, None)
    return removed
