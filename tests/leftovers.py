"""What the testbed may have left on the machine: our bridges, veths, processes, cgroups, ledgers."""

import os
from pathlib import Path

import psutil

from testbed.cgroups import testbed_cgroups
from testbed.clean import _our_process
from testbed.ledger import LEDGER_DIR
from topologies.hosts import BRIDGE_RE, INTF_RE


def _netns(pid) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def leftovers(own_netns: frozenset[str] = frozenset()) -> list[str]:
    """Every testbed-made object still present (empty list = clean machine): our links,
    cgroups and ledgers, the harness's own processes by their command lines, and *any*
    process in another network namespace than this one (an emulated host's, whatever it
    runs: a program's daemon has no name the harness knows) except those of ``own_netns``
    (``/proc/PID/ns/net`` link texts: a test's own machines)."""
    out = [
        f"link {p.name}" for p in Path("/sys/class/net").iterdir() if BRIDGE_RE.match(p.name) or INTF_RE.match(p.name)
    ]
    here = _netns("self")
    for p in psutil.process_iter():
        ns = _netns(p.pid)
        if ns is not None and ns != here and ns not in own_netns:
            try:
                out.append(f"process {p.pid} in network namespace {ns}: {' '.join(p.cmdline()[:3])}")
            except psutil.Error:  # it ended (or became a zombie) since it was seen
                pass
        elif _our_process(p):
            try:
                out.append(f"process {p.pid} {' '.join(p.cmdline()[:3])}")
            except psutil.Error:  # it ended (or became a zombie) since it was seen
                pass
    out += [f"cgroup {p}" for p in testbed_cgroups()]
    if LEDGER_DIR.is_dir():
        out += [f"ledger {p.name}" for p in LEDGER_DIR.glob("*.json")]
    return out


needs_root = os.geteuid() != 0
