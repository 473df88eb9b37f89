"""A run on this machine: one Mininet network, processes in its hosts (forked from a
zygote where the run allows), one :class:`testbed.capture.Capture`."""

from __future__ import annotations

import logging
import subprocess
from contextlib import ExitStack
from pathlib import Path

from testbed import launch
from testbed.background import listening
from testbed.capture import Capture, keep_errors, memory_recorder
from testbed.capture.pcap import resolve_ports
from testbed.ledger import Ledger
from testbed.lifetime import tied_preexec
from testbed.network import Network, bind_to_interface
from testbed.site.base import Site, log_leftovers, switch_ports, uplink_ports
from testbed.spec import Experiment
from traffic import schemes

__all__ = ["LocalSite", "forks"]

log = logging.getLogger("testbed")

#: how long :meth:`LocalSite.start_memory` waits for the memory sampler's first sample, s
MEMORY_START_WAIT_S = 2.0


def forks(exp: Experiment) -> bool:
    """Its processes fork from a zygote: ``run.launcher: zygote`` and the runtime's own
    processes (a ``workload.program`` runs its own command)."""
    return exp.run.launcher == "zygote" and exp.workload.program is None


class LocalSite(Site):
    """The network and processes of a run on this machine (see :class:`testbed.site.Site`).

    Args:
        zygote: a live zygote the caller owns (a sweep's), used and left running when the
            run forks its processes (:func:`forks`); without one such a run starts its own
            now, so that its imports overlap the network's build, and ends it at teardown.
    """

    def __init__(
        self, exp: Experiment, run_dir: Path, ledger: Ledger, teardown: ExitStack, zygote: launch.Zygote | None = None
    ):
        super().__init__(exp, run_dir, ledger, teardown)
        scheme = schemes.get(exp.workload.scheme)
        self.network = Network(
            exp.topology, scheme.hosts(exp.workload, exp.topology), run_dir, ledger, scale=exp.scale, cgroup=self.cgroup
        )
        teardown.callback(lambda: log_leftovers(self.network.stop()))
        self.zygote = None
        if not forks(exp):
            return
        if zygote is not None and zygote.alive():  # a dead runner's ledger still names it for testbed clean
            ledger.add_pid("zygote", zygote.proc.pid, shared=True)
            log.info("processes fork from the sweep's zygote (pid %d)", zygote.proc.pid)
        else:
            zygote = launch.Zygote(on_pid=lambda pid: ledger.add_pid("zygote", pid), join=self.cgroup.preexec).start()
            teardown.callback(zygote.close)  # after the processes are stopped (last in, first out)
            log.info("processes fork from this run's zygote (pid %d)", zygote.proc.pid)
        self.zygote = zygote

    @property
    def fork(self) -> launch.Fork | None:
        """The run's processes fork from the zygote (when the run forks, :func:`forks`) into
        their host's namespace and the run's cgroup, except one bound to a host's second
        interface (run under another uid by :meth:`popen`)."""
        if self.zygote is None:
            return None
        procs = str(self.cgroup.path / "cgroup.procs")
        return launch.Fork(
            self.zygote,
            lambda info: (self.network.hosts[info["host"]].pid, procs) if info.get("iface_index", 0) == 0 else None,
        )

    def popen(self, info, cmd, env, log_file):
        node = self.network.hosts[info["host"]]
        return node.popen(
            bind_to_interface(cmd, info.get("iface_index", 0)),
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=info.get("cwd"),
            preexec_fn=tied_preexec(self.cgroup.preexec),
        )

    def listening(self, host: str, port: int) -> bool:
        return listening(self.hosts[host].pid, port)

    def start_memory(self, procs: list[launch.Launched]) -> None:
        """Record ``traces/memory.csv`` on this machine, every ``capture.cpu_interval_ms``, from
        a first sample taken before this returns (waiting up to :data:`MEMORY_START_WAIT_S`)
        until teardown; its problems go to ``logs/capture.log``."""
        errors: list[str] = []
        recorder = memory_recorder(
            self.run_dir / "traces",
            lambda: {l.info["name"]: l.popen.pid for l in list(procs)},
            self.exp.capture.cpu_interval_ms / 1000.0,
            errors,
        )

        def stop() -> None:
            recorder.stop()
            keep_errors(self.run_dir, errors)

        self.teardown.callback(stop)
        recorder.start()
        recorder.first_sample.wait(MEMORY_START_WAIT_S)  # the first row is the machine before the build

    def start_capture(self, procs: list[launch.Launched]) -> None:
        spec, topo = self.exp.capture, self.topology
        pcap_ports = (
            resolve_ports(spec.pcap.ports, topo["links"], {s["name"] for s in topo["switches"]}) if spec.pcap else []
        )
        capture = Capture(
            self.run_dir,
            ports=switch_ports(topo),
            qdisc_ifaces=uplink_ports(topo) or switch_ports(topo),
            pids=lambda: {l.info["name"]: l.popen.pid for l in procs},
            spec=spec,
            on_pid=lambda pid, what: self.adopt(what, pid),
            procs=lambda: [(l.info, l.popen.pid) for l in list(procs)],
            pcap_ports=pcap_ports,
            scale=self.exp.scale,
        )
        self.teardown.callback(capture.stop)
        capture.start()
