"""``testbed check``: what this machine can emulate, with a remedy for each missing piece,
and whether the machine cost model in use was measured on it."""

from __future__ import annotations

import functools
import os
import shutil
import uuid
from dataclasses import dataclass

from common.errors import CapacityError
from testbed.machine_costs import MEASURE_COMMAND, CostModel, Machine

QDISC_PROBES = {
    # kind: (pyroute2 tc() keyword arguments, what the testbed uses it for)
    "htb": ({"handle": "1:", "default": 1}, "link shaping (required)"),
    "tbf": ({"handle": "1:", "rate": "10mbit", "burst": 15000, "latency": "50ms"}, "token-bucket shaping"),
    "pfifo": ({"handle": "1:", "limit": 100}, "queue limits without netem"),
    "netem": ({"handle": "1:", "delay": 1000}, "link delay and loss (topology.delay_ms, topology.loss_pct)"),
}


@dataclass
class Item:
    """One line of the check: ``ok`` says whether the piece is there; ``remedy`` what to do."""

    name: str
    ok: bool
    detail: str
    remedy: str = ""


@functools.lru_cache(maxsize=1)
def kernel_qdiscs() -> dict[str, bool]:
    """Which qdiscs the kernel accepts, probed on a veth pair in a throw-away namespace.

    Returns:
        kind -> True/False for htb, tbf, pfifo, netem. All False if not root.
    """
    if os.geteuid() != 0:
        return {k: False for k in QDISC_PROBES}
    from pyroute2 import NetNS, netns

    name = f"tbcheck-{uuid.uuid4().hex[:8]}"
    out = {}
    ns = NetNS(name)
    try:
        ns.link("add", ifname="p0", kind="veth", peer="p1")
        idx = ns.link_lookup(ifname="p0")[0]
        for kind, (kw, _) in QDISC_PROBES.items():
            try:
                ns.tc("add", kind, idx, **kw)
                out[kind] = True
                ns.tc("del", index=idx, handle="1:", root=True)
            except Exception:  # noqa: BLE001 -- NetlinkError ENOENT/EOPNOTSUPP: not available
                out[kind] = False
    finally:
        ns.close()
        netns.remove(name)
    return out


def cost_model_check(here: Machine | None = None) -> Item:
    """The machine cost model runs use (:meth:`testbed.machine_costs.CostModel.load`): not ok
    when it cannot be read; ok otherwise, its detail the file, or the line saying it was
    measured on another machine than ``here`` (default this one) and the command that measures
    this one."""
    try:
        model = CostModel.load()
    except CapacityError as e:
        return Item("cost model", False, str(e), f"{MEASURE_COMMAND} (as root)")
    return Item("cost model", True, model.measured_elsewhere(here) or f"{model.path} (measured on this machine)")


def run_checks() -> list[Item]:
    """Every requirement of the testbed, checked on this machine."""
    items = []
    root = os.geteuid() == 0
    items.append(
        Item(
            "root",
            root,
            "running as root" if root else f"running as uid {os.geteuid()}",
            "run as root (sudo): Mininet needs network namespaces",
        )
    )
    for tool, pkg, why in (
        ("mnexec", "mininet", "runs processes inside Mininet hosts"),
        ("brctl", "bridge-utils", "Linux-bridge switches"),
        ("bwm-ng", "bwm-ng", "per-interface traces"),
        ("iperf3", "iperf3", "background traffic and link benchmarks"),
        ("tcpdump", "tcpdump", "header capture (capture.pcap), read by testbed flows"),
        ("tc", "iproute2", "traffic shaping"),
        ("setpriv", "util-linux", "binds a process to a PBox's extra interface"),
        ("ethtool", "ethtool", "interface offload settings"),
    ):
        path = shutil.which(tool)
        items.append(
            Item(
                tool,
                path is not None,
                path or f"not found ({why})",
                f"apt-get install {pkg}   (or: sudo bash scripts/setup.sh)",
            )
        )
    try:
        import mininet.net  # noqa: F401

        items.append(Item("mininet (python)", True, mininet.net.__file__))
    except ImportError as e:
        items.append(
            Item(
                "mininet (python)",
                False,
                str(e),
                "apt-get install mininet, and use the .venv made by scripts/setup.sh "
                "(it sees Debian's python3 packages)",
            )
        )
    try:
        import torch

        items.append(Item("torch", True, torch.__version__))
    except ImportError as e:
        items.append(Item("torch", False, str(e), "pip install torch==2.13.0 (scripts/setup.sh does it)"))
    items.append(cost_model_check())
    if root:
        qd = kernel_qdiscs()
        for kind, (_, use) in QDISC_PROBES.items():
            remedy = (
                "a kernel with sch_" + kind + " (a full distribution kernel, e.g. the Vagrant VM: "
                "vagrant up, see README)"
            )
            items.append(Item(f"qdisc {kind}", qd[kind], ("available: " if qd[kind] else "missing: ") + use, remedy))
    return items


def format_checks(items: list[Item]) -> str:
    lines = []
    width = max([18] + [len(it.name) + 2 for it in items])
    for it in items:
        mark = "ok  " if it.ok else "MISSING"
        line = f"{mark:8s}{it.name:{width}s}{it.detail}"
        if not it.ok and it.remedy:
            line += f"\n{'':{8 + width}s}-> {it.remedy}"
        lines.append(line)
    return "\n".join(lines)
