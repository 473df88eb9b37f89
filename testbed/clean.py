"""``testbed clean``: remove what killed runs left on the machine.

First every stale ledger (see :mod:`testbed.ledger`) is swept: its processes killed, its
interfaces and bridges deleted. Then, in case a ledger itself was lost, a pattern sweep
removes objects that only this testbed makes (the name patterns of :mod:`topologies.hosts`):
bridges ``torN``/``coreN``, interfaces ``<node>-ethK`` (``hN``, ``psN``, ``fcN``, ``bgN``,
``torN``, ``coreN``) in the root namespace, and processes running ``-m traffic.runtime``, or
a bwm-ng or a background iperf3 (or the ``sh`` that delays it) writing into a run's
``traces/``. Mininet host namespaces are unnamed: they vanish with their shell process
(recorded in the ledger) or when their last interface's peer is deleted and no process holds
them.
"""
from __future__ import annotations

import os
from pathlib import Path

import psutil
from pyroute2 import IPRoute

from topologies.errors import TestbedError
from topologies.hosts import BRIDGE_RE, INTF_RE, NODE_RE
from testbed.ledger import NetworkLock, _kill_tree, delete_link, stale_ledgers


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
    if cmd and cmd[0] == "bash" and any(NODE_RE.match(a[len("mininet:"):]) for a in cmd if a.startswith("mininet:")):
        return True  # a Mininet node's shell (holds a host's network namespace)
    if "traffic.runtime" in text and "-m" in cmd and _in_other_netns(p.pid):
        return True  # (processes of the local launcher live in the root namespace: not ours to kill)
    if cmd and Path(cmd[0]).name == "bwm-ng" and "/traces/" in text:
        return True
    if cmd and Path(cmd[0]).name == "iperf3" and "--logfile" in text and "/traces/" in text:
        return True
    if cmd and Path(cmd[0]).name == "sh" and "iperf3" in text and "/traces/background/" in text:
        return True  # a background flow's client still sleeping until its start
    return False


def clean(force: bool = False) -> list[str]:
    """Remove leftovers of dead runs; with ``force`` also those of a live one.

    Returns:
        one line per removed object.

    Raises:
        TestbedError: a run is in progress (its harness holds the network lock) and
            ``force`` is false.
    """
    removed = []
    try:
        lock = NetworkLock().__enter__()
    except TestbedError:
        if not force:
            raise TestbedError("a testbed run is in progress; it tears down after itself. "
                               "Use 'testbed clean --force' only if that run is stuck") from None
        lock = None
    try:
        for led in stale_ledgers(include_live=force or lock is not None):
            removed += led.sweep()
        for p in psutil.process_iter():
            if _our_process(p):
                try:
                    what = " ".join(p.cmdline()[:4])
                except psutil.Error:
                    what = "?"
                if _kill_tree(p.pid):
                    removed.append(f"process {p.pid} ({what})")
        ours = [p.name for p in sorted(Path("/sys/class/net").iterdir())
                if INTF_RE.match(p.name) or BRIDGE_RE.match(p.name)]
        if ours:
            with IPRoute() as ipr:
                for n in ours:
                    bridge = BRIDGE_RE.match(n) is not None
                    if delete_link(ipr, n, bridge=bridge):
                        removed.append(f"{'bridge' if bridge else 'interface'} {n}")
    finally:
        if lock is not None:
            lock.__exit__(None, None, None)
    return removed
