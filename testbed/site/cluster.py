"""A run across the machines of a spec's ``cluster:`` section (see :class:`ClusterSite`).

Beside the network (:class:`testbed.remote.ClusterNetwork`: whole racks per machine, the
core on the first, tunnels between machines):

* clocks: each machine's offset from this one is measured before the build
  (:func:`testbed.cluster.clock_offset`) and recorded in ``cluster.json`` with its
  uncertainty; every timestamp gathered from a machine is corrected by it;
* staging: each machine's processes write to a directory of their own there,
  ``<runs dir>/.<run id>@<addr>`` (``spec.yaml`` and ``processes.json`` are copied in);
* processes: each runs in its Mininet host on its machine (``mnexec -a`` over SSH, as
  Mininet's ``RemoteMixin.popen``); its output comes back through SSH into ``logs/``;
* capture: one :mod:`testbed.capture.agent` per machine (bwm-ng, qdisc and CPU samplers on
  that machine's switch ports, its memory), started and stopped over SSH; each machine's used
  memory is also read once over SSH before the build (:meth:`ClusterSite.start_memory`);
* gathering: at teardown the ledger copies each staging directory into
  ``machines/<addr>/`` (:func:`testbed.ledger.fetch_staging`); :meth:`ClusterSite.merge` then
  puts the processes' events and results where a one-machine run has them (events' ``ts``
  corrected) and merges the traces into ``traces/`` (:func:`testbed.capture.merge.merge_traces`).
"""

from __future__ import annotations

import csv
import json
import os
import select
import shlex
import shutil
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

from common.errors import TestbedError
from testbed import launch
from testbed.background import listening_in_shell
from testbed.capture import keep_errors
from testbed.capture.memory import MEMORY_FIELDS, used_from_meminfo
from testbed.capture.merge import TracePart, merge_traces
from testbed.cluster import PROJECT_DIR, Machine, clock_offset, end_process
from testbed.ledger import Ledger, own_pattern
from testbed.network import bind_to_interface
from testbed.remote import ClusterNetwork
from testbed.site.base import Site, log_leftovers
from testbed.spec import Experiment
from traffic import schemes
from traffic.rundir import write_json

__all__ = ["ClusterSite"]

#: how long a machine's capture agent may take to start (its Python imports included), s
AGENT_START_S = 60.0


class ClusterSite(Site):
    """The network and processes of a run spread over the machines of ``exp.cluster`` (see
    :class:`testbed.site.Site` and the module doc). Every SSH client started here (capture
    agents, event mirrors) is recorded in the ledger."""

    def __init__(self, exp: Experiment, run_dir: Path, ledger: Ledger, teardown: ExitStack):
        super().__init__(exp, run_dir, ledger, teardown)
        cluster = exp.cluster
        self.spec = cluster
        self.machines = Machine.of(cluster)
        self.project_dir = cluster.project_dir or str(PROJECT_DIR)
        self.python = str(Path(self.project_dir) / ".venv" / "bin" / "python")
        self.staging = {
            m.addr: str(self.run_dir.parent.resolve() / f".{self.run_dir.name}@{m.addr}") for m in self.machines
        }
        self.offsets: dict[str, tuple[float, float]] = {}
        self._agents: dict[str, subprocess.Popen] = {}
        self._mirrors: list[tuple[subprocess.Popen, threading.Thread]] = []
        teardown.callback(self.merge)  # after the ledger has gathered every machine's files
        scheme = schemes.get(exp.workload.scheme)
        self.network = ClusterNetwork(
            exp.topology,
            scheme.hosts(exp.workload, exp.topology),
            run_dir,
            ledger,
            scale=exp.scale,
            machines=self.machines,
            tunnel=cluster.tunnel,
            staging=self.staging,
            project_dir=self.project_dir,
        )
        teardown.callback(lambda: log_leftovers(self.network.stop()))

    def _on_pid(self, what: str, pid: int) -> None:
        self.ledger.add_pid(what, pid)

    def build(self) -> dict:
        """Measure the clocks, build the network across the machines, create each machine's
        staging directory with ``spec.yaml`` in it.

        Raises:
            TestbedError: a clock could not be read, the network could not be built, or a
                machine refused the staging directory.
        """
        t = time.time()
        self.measure_clocks()
        self.record("clocks", time.time() - t)
        t = time.time()
        topology = super().build()
        self.record("build", time.time() - t)
        self.prepare(["spec.yaml"])
        return topology

    def share(self, files: list[str]) -> None:
        self.put(files)

    def host_dir(self, host: str) -> Path:
        return Path(self.staging[self.hosts[host].server])

    def fetch(self, host: str, relpath: str) -> None:
        text = self.read_file(self.hosts[host].server, str(self.host_dir(host) / relpath))
        if text is not None:
            (self.run_dir / relpath).write_text(text)

    def run_in(self, host: str, cmd: list[str], log_file) -> subprocess.Popen:
        # the remote shell parses the command line
        return super().run_in(host, [shlex.quote(a) for a in cmd], log_file)

    def listening(self, host: str, port: int) -> bool:
        return listening_in_shell(self.hosts[host], port)

    def kill(self, launched: launch.Launched) -> None:
        # the process there, not only its SSH session here
        self.kill_remote(self.hosts[launched.info["host"]].server, launched.info["name"])
        launched.popen.kill()

    def stop_matching(self, part: str, grace_s: float) -> None:
        self.terminate_matching(part, grace_s)

    def follow_events(self, entries: list[dict]) -> None:
        where = self.topology["cluster"]["placement"]
        names: dict[str, list[str]] = {}
        for e in entries:
            names.setdefault(where[e["host"]], []).append(e["name"])
        self.teardown.callback(self.stop_event_mirror)  # before the merge replaces its files
        self.start_event_mirror(names)

    def machine(self, addr: str) -> Machine:
        """The machine at ``addr``."""
        return next(m for m in self.machines if m.addr == addr)

    # ------------------------------------------------------------------ before the build

    def measure_clocks(self) -> None:
        """Each machine's clock offset and its uncertainty (s), into :attr:`offsets`.

        Raises:
            TestbedError: a machine's clock could not be read.
        """
        for m in self.machines:
            try:
                self.offsets[m.addr] = clock_offset(m)
            except RuntimeError as e:
                raise TestbedError(f"cluster: {e}") from None

    def prepare(self, files: list[str]) -> None:
        """Create every machine's staging directory and copy the run's ``files`` into it.

        Raises:
            TestbedError: a machine refused (its message is included).
        """
        for m in self.machines:
            s = shlex.quote(self.staging[m.addr])
            r = m.run(f"mkdir -p {s} && cd {s} && mkdir -p logs events results params traces/background", timeout_s=60)
            if r.returncode != 0:
                raise TestbedError(f"cannot create {self.staging[m.addr]} on {m.addr}: {r.stderr.strip()}")
        self.put(files)

    def put(self, files: list[str]) -> None:
        """Copy ``files`` (names inside the run directory) into every staging directory.

        Raises:
            TestbedError: a copy failed.
        """
        for name in files:
            text = (self.run_dir / name).read_text()
            for m in self.machines:
                r = m.run(f"cat > {shlex.quote(self.staging[m.addr] + '/' + name)}", timeout_s=60, input=text)
                if r.returncode != 0:
                    raise TestbedError(f"cannot copy {name} to {m.addr}: {r.stderr.strip()}")

    # ------------------------------------------------------------------ processes

    def popen(self, info: dict, cmd: list[str], env: dict, log) -> subprocess.Popen:
        """Start process ``info`` (a ``processes.json`` entry) in its host, a
        :class:`testbed.remote.RemoteHost`, as the harness would here: ``cmd`` (bound to the
        entry's interface, :func:`testbed.network.bind_to_interface`) with this
        interpreter replaced by the project's Python there, in the entry's ``cwd`` (a
        ``workload.program``'s, which must exist there too), with ``env``'s settings that
        differ from this process's environment (and the testbed's own ``TESTBED_*``); every
        path into the run directory (the runtime's argument, ``TESTBED_EVENTS``,
        ``TESTBED_RUN_DIR``) points into the machine's staging directory instead, and the
        project there is importable. The output goes to ``log``."""
        node = self.network.hosts[info["host"]]
        cmd = bind_to_interface(cmd, info.get("iface_index", 0))
        staging, here = self.staging[node.server], str(self.run_dir)

        def there(text: str) -> str:
            return staging + text[len(here) :] if text == here or text.startswith(here + "/") else text

        settings = {
            k: there(v)
            for k, v in env.items()
            if (os.environ.get(k) != v or k.startswith("TESTBED_")) and k != "PYTHONPATH"
        }
        settings["PYTHONPATH"] = self.project_dir
        # what kill() finds the process by, whatever its command line
        settings.setdefault("TESTBED_PROC", info["name"])
        settings.setdefault("TESTBED_RUN_DIR", staging)
        argv = [self.python if a == sys.executable else there(a) for a in cmd]
        line = shlex.join(["env", *[f"{k}={v}" for k, v in sorted(settings.items())], *argv])
        if info.get("cwd"):
            line = f"cd {shlex.quote(info['cwd'])} && exec {line}"
        return node.popen(
            ["sh", "-c", shlex.quote(line)], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )

    def kill_remote(self, addr: str, name: str) -> list[int]:
        """SIGKILL process ``name`` of this run on machine ``addr`` (found by the
        ``TESTBED_PROC`` and ``TESTBED_RUN_DIR`` of its environment) and whatever it
        started; the pids killed."""
        m = self.machine(addr)
        proc = shlex.quote(f"TESTBED_PROC={name}")
        rd = shlex.quote(f"TESTBED_RUN_DIR={self.staging[addr]}")
        r = m.run(
            "for d in /proc/[0-9]*; do e=$( (tr '\\0' '\\n' < $d/environ) 2>/dev/null) || continue; "
            f"printf '%s\\n' \"$e\" | grep -qxF {proc} && printf '%s\\n' \"$e\" | grep -qxF {rd} && "
            "kill -KILL ${d#/proc/} 2>/dev/null && echo ${d#/proc/}; done; true",
            timeout_s=60,
        )
        return [int(x) for x in r.stdout.split() if x.isdigit()]

    def terminate_matching(self, part: str, grace_s: float = 2.0) -> None:
        """SIGTERM, on every machine, the processes whose command line names ``part`` inside
        the staging directory there (e.g. the background flows' iperf3), then SIGKILL after
        ``grace_s``: a process ends as its own signal handler decides (iperf3 writes its JSON)."""
        for m in self.machines:
            pattern = shlex.quote(own_pattern(self.staging[m.addr] + "/" + part))
            m.run(
                f"pkill -TERM -f -- {pattern}; sleep {grace_s:g}; pkill -KILL -f -- {pattern}; true",
                timeout_s=grace_s + 30,
            )

    def read_file(self, addr: str, path: str) -> str | None:
        """The text of ``path`` on machine ``addr``, or None if it cannot be read."""
        r = self.machine(addr).run(f"cat {shlex.quote(path)}", timeout_s=60)
        return r.stdout if r.returncode == 0 else None

    # ------------------------------------------------------------------ events while the run trains

    def start_event_mirror(self, names_by_machine: dict[str, list[str]]) -> None:
        """Copy, while the run trains, every event the processes of each machine write (their
        ``events/<name>.jsonl`` there, created empty first) into this run's ``events/``,
        each ``ts`` corrected by the machine's clock offset: what the scheduled events and
        the progress display read. One ``tail -F`` per machine over SSH; :meth:`merge`
        replaces these files by the complete ones gathered at the end.

        Raises:
            TestbedError: a machine refused to create the files.
        """
        for m in self.machines:
            names = names_by_machine.get(m.addr)
            if not names:
                continue
            files = [f"{self.staging[m.addr]}/events/{n}.jsonl" for n in names]
            quoted = " ".join(shlex.quote(f) for f in files)
            r = m.run(f"touch {quoted}", timeout_s=60)
            if r.returncode != 0:
                raise TestbedError(f"cannot create the event logs on {m.addr}: {r.stderr.strip()}")
            p = subprocess.Popen(
                m.ssh_argv(f"exec tail -q -n +1 -F {quoted}"),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            self._on_pid(f"events:{m.addr}", p.pid)
            t = threading.Thread(
                target=self._mirror,
                args=(p, self.offsets.get(m.addr, (0.0, 0.0))[0]),
                name=f"events-{m.addr}",
                daemon=True,
            )
            t.start()
            self._mirrors.append((p, t))

    def _mirror(self, p: subprocess.Popen, offset_s: float) -> None:
        files: dict[str, object] = {}
        try:
            for raw in p.stdout:
                try:
                    ev = json.loads(raw)
                    proc = ev["proc"]
                except (ValueError, KeyError, TypeError):
                    continue  # a line cut short by a kill, or not an event
                if not isinstance(proc, str) or "/" in proc or proc.startswith("."):
                    continue
                if isinstance(ev.get("ts"), (int, float)):
                    ev["ts"] = ev["ts"] - offset_s
                f = files.get(proc)
                if f is None:
                    f = files[proc] = open(
                        self.run_dir / "events" / f"{proc}.jsonl", "a", buffering=1, encoding="utf-8"
                    )
                f.write(json.dumps(ev, separators=(",", ":")) + "\n")
        except (OSError, ValueError):
            pass
        finally:
            for f in files.values():
                f.close()

    def stop_event_mirror(self) -> None:
        """Stop every ``tail`` and its thread (idempotent)."""
        for p, t in self._mirrors:
            if p.poll() is None:
                p.kill()
            p.wait()
            t.join(timeout=10)
        self._mirrors.clear()

    # ------------------------------------------------------------------ capture

    def start_memory(self, procs: list[launch.Launched]) -> None:
        """Read each machine's used memory once over SSH (its ``/proc/meminfo``,
        :func:`testbed.capture.memory.used_from_meminfo`) before the network is built, into
        ``traces/memory.csv`` as ``<machine>:used`` rows on this machine's clock; the rest of
        each machine's memory is recorded there by its capture agent, and :meth:`merge` puts
        them together. A machine that cannot be read is named in ``logs/capture.log``."""
        rows, errors = [], []
        for m in self.machines:
            try:
                r = m.run("cat /proc/meminfo", timeout_s=20)
                if r.returncode != 0:
                    raise ValueError(r.stderr.strip() or f"exit status {r.returncode}")
                rows.append((f"{time.time():.6f}", "machine", f"{m.addr}:used", used_from_meminfo(r.stdout)))
            except (ValueError, OSError, subprocess.TimeoutExpired) as e:
                errors.append(f"memory: the used memory of {m.addr} before the build could not be read: {e}")
        with open(self.run_dir / "traces" / "memory.csv", "w", newline="") as f:
            csv.writer(f).writerows([MEMORY_FIELDS, *rows])
        keep_errors(self.run_dir, errors)

    def start_capture(self, procs: list[launch.Launched]) -> None:
        """Start the capture agent of every machine that has switch ports, on those ports
        (qdisc samples on the uplink ends there, or on every switch port of a machine
        without one), and wait until each samples; they stop at teardown, and what they
        could not do is kept in ``logs/capture.log``.

        Raises:
            TestbedError: an agent failed or did not start within :data:`AGENT_START_S`.
        """
        where = self.topology["cluster"]["placement"]
        switches = {s["name"] for s in self.topology["switches"]}
        ports: dict[str, list[str]] = {}
        uplinks: dict[str, list[str]] = {}
        for link in self.topology["links"]:
            for end in ("1", "2"):
                node = link[f"node{end}"]
                if node in switches:
                    ports.setdefault(where[node], []).append(link[f"intf{end}"])
                if link["class"] == "uplink":
                    uplinks.setdefault(where[node], []).append(link[f"intf{end}"])
        spec = self.exp.capture
        qdisc = {a: uplinks.get(a) or mine for a, mine in ports.items()} if spec.qdisc else {}
        self.teardown.callback(self.stop_capture)
        self._start_agents(ports, qdisc, spec)

    def _start_agents(self, ports: dict[str, list[str]], qdisc_ifaces: dict[str, list[str]], capture_spec) -> None:
        """Start the capture agent of every machine that has switch ports (``ports``:
        machine -> its ports) and wait until each samples.

        Raises:
            TestbedError: an agent failed or did not start within :data:`AGENT_START_S`.
        """
        spec = json.dumps(capture_spec.model_dump(mode="json"))
        for m in self.machines:
            if not ports.get(m.addr):
                continue
            s = self.staging[m.addr]
            cmd = (
                f"cd {shlex.quote(self.project_dir)} && PYTHONPATH={shlex.quote(self.project_dir)} "
                f"{shlex.quote(self.python)} -m testbed.capture.agent {shlex.quote(s)} "
                f"--ports {shlex.quote(','.join(ports[m.addr]))} "
                + (f"--qdisc {shlex.quote(','.join(qdisc_ifaces[m.addr]))} " if qdisc_ifaces.get(m.addr) else "")
                + f"--capture {shlex.quote(spec)} --match {shlex.quote(s)}"
            )
            p = subprocess.Popen(
                m.ssh_argv(cmd),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            self._agents[m.addr] = p
            self._on_pid(f"capture:{m.addr}", p.pid)
            line = _read_line(p, AGENT_START_S)
            if not line.startswith("ready"):
                raise TestbedError(f"the capture agent on {m.addr} did not start: {line.strip() or 'no answer'}")

    def stop_capture(self) -> None:
        """Stop every capture agent (its stdin closed; killed after 15 s); the problems met
        go to ``logs/capture.log``. Idempotent."""
        errors = []
        for addr, p in self._agents.items():
            if not end_process(p, 15):
                errors.append(f"the capture agent on {addr} did not stop within 15 s and was killed")
            elif p.returncode != 0:
                out = p.stdout.read().decode(errors="replace").strip()
                errors.append(f"the capture agent on {addr} exited with {p.returncode}: {out[-300:]}")
        self._agents.clear()
        if errors:
            with open(self.run_dir / "logs" / "capture.log", "a") as f:
                f.writelines(e.replace("\n", " ") + "\n" for e in errors)

    # ------------------------------------------------------------------ after the run

    def merge(self) -> None:
        """Put what the machines' processes wrote (gathered in ``machines/<addr>/``) where
        a one-machine run has it: ``events/*.jsonl`` (each event's ``ts`` corrected by the
        machine's clock offset), ``results/``, ``params/``; merge the machines' traces into
        ``traces/``; write ``cluster.json`` (machines, offsets, staging, timings)."""
        parts = []
        for m in self.machines:
            src = self.run_dir / "machines" / m.addr
            offset = self.offsets.get(m.addr, (0.0, None))[0]
            if not src.is_dir():
                continue
            for f in sorted((src / "events").glob("*.jsonl")):
                _shift_events(f, self.run_dir / "events" / f.name, offset)
            for sub in ("results", "params"):
                for f in sorted((src / sub).glob("*")):
                    (self.run_dir / sub).mkdir(exist_ok=True)
                    shutil.copy2(f, self.run_dir / sub / f.name)
            if (src / "traces").is_dir():
                parts.append(TracePart(m.addr, src / "traces", offset))
        if parts and (self.run_dir / "traces" / "memory.csv").is_file():  # the machines before the build
            parts.insert(0, TracePart(None, self.run_dir / "traces", 0.0))
        if parts:
            merge_traces(self.run_dir / "traces", parts)
        write_json(
            self.run_dir / "cluster.json",
            {
                "machines": [m.addr for m in self.machines],
                "tunnel": self.spec.tunnel,
                "clock_offset_s": {a: {"offset": o, "uncertainty": u} for a, (o, u) in self.offsets.items()},
                "staging": self.staging,
                "timings_s": self.timings,
            },
        )


def _read_line(p: subprocess.Popen, timeout_s: float) -> str:
    """The first line ``p`` writes, or '' if it ends or ``timeout_s`` passes first."""
    end = time.monotonic() + timeout_s
    buf = b""
    while time.monotonic() < end:
        r, _, _ = select.select([p.stdout], [], [], 0.2)
        if r:
            ch = os.read(p.stdout.fileno(), 1)
            if not ch:
                break
            buf += ch
            if ch == b"\n":
                return buf.decode(errors="replace")
        elif p.poll() is not None:
            break
    return buf.decode(errors="replace")


def _shift_events(src: Path, dest: Path, offset_s: float) -> None:
    """Copy the events of ``src`` to ``dest`` with each ``ts`` minus ``offset_s`` (a line
    that is not JSON, e.g. cut short by a kill, is dropped as the analysis would drop it)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(src, encoding="utf-8") as f, open(dest, "w", encoding="utf-8") as out:
        for line in f:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if isinstance(ev.get("ts"), (int, float)):
                ev["ts"] = ev["ts"] - offset_s
            out.write(json.dumps(ev, separators=(",", ":")) + "\n")
