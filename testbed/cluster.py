"""Several machines under one experiment: the spec's ``cluster:`` section and
``testbed check --cluster SPEC``, which checks each machine before anything is built there.

    cluster:
      machines: [10.0.0.1, 10.0.0.2]     # SSH addresses; the first holds the core switch
      user: root
      placement: rack                     # whole racks per machine (topologies.placement)

Control goes over SSH (``ssh -o BatchMode=yes``: key-based login, never a password prompt),
as Mininet's cluster support does (``mininet/examples/cluster.py``, ``RemoteMixin``). What a
machine needs, each item checked by :func:`check_machine` with a remedy when it fails:

* SSH without a password, as ``user``, and ``user`` is root (Mininet needs it);
* this project at ``project_dir`` (default: where it is on this machine) running the same code:
  the same git commit with the same uncommitted changes, if any (:func:`compare_source`);
* ``mnexec`` and ``bwm-ng`` on the ``PATH``, and the qdiscs the testbed shapes with (htb);
* its clock's offset from this machine's, measured as NTP does from one round trip:
  ``offset = remote - (t_send + t_receive) / 2``, uncertain by half the round trip;
* the largest IPv4 packet that reaches it unfragmented (``ping -M do``): GRE tunnels between
  machines need 1,476 bytes for a 1,450-byte inner MTU (Mininet's ``RemoteGRELink``).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import ValidationError

from common.errors import FieldError, SpecError
from common.provenance import DISTRIBUTION, changes_digest, distribution_version, source_revision
from common.validation import field_errors, load_yaml
from testbed.check import Item
from testbed.remote import tunnel_command
from testbed.spec import ClusterSpec
from topologies import build_topo
from topologies.placement import PlacementError, place_racks
from topologies.spec import TopologySpec

__all__ = [
    "GRE_PACKET_BYTES",
    "ClusterSpec",
    "Machine",
    "check_cluster",
    "check_machine",
    "clock_offset",
    "end_process",
    "format_placement",
    "load_cluster",
    "Source",
    "compare_source",
]

#: the IPv4 packet a GRE tunnel with a 1,450-byte inner MTU sends (1,450 + 4 GRE + 20 outer IP + 2 spare)
GRE_PACKET_BYTES = 1476
#: the project's root directory on this machine
PROJECT_DIR = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Machine:
    """One machine of a cluster, reached over SSH."""

    addr: str
    user: str = "root"
    port: int = 22
    identity_file: str | None = None
    known_hosts_file: str | None = None

    @classmethod
    def of(cls, spec: ClusterSpec) -> list[Machine]:
        return [cls(m, spec.user, spec.ssh_port, spec.identity_file, spec.known_hosts_file) for m in spec.machines]

    @property
    def dest(self) -> str:
        """``user@addr``, what ``ssh`` logs in to."""
        return f"{self.user}@{self.addr}"

    def ssh_options(self, connect_timeout_s: int = 5) -> list[str]:
        """``ssh`` and its options for this machine (batch mode, port, key, known hosts), without the destination."""
        argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={connect_timeout_s}", "-p", str(self.port)]
        if self.known_hosts_file:
            argv += ["-o", f"UserKnownHostsFile={self.known_hosts_file}", "-o", "StrictHostKeyChecking=accept-new"]
        if self.identity_file:
            argv += ["-i", self.identity_file, "-o", "IdentitiesOnly=yes"]
        return argv

    def ssh_argv(self, command: str, connect_timeout_s: int = 5) -> list[str]:
        """The ``ssh`` command line that runs ``command`` (a shell command) on the machine."""
        return self.ssh_options(connect_timeout_s) + [self.dest, command]

    def run(self, command: str, timeout_s: float = 20, input: str | None = None) -> subprocess.CompletedProcess:
        """Run ``command`` on the machine (``input``: its standard input); the result's
        ``returncode`` is 255 when SSH itself failed.

        Raises:
            subprocess.TimeoutExpired: it took longer than ``timeout_s``.
        """
        return subprocess.run(
            self.ssh_argv(command),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
        )

    def python(self, project_dir: str, code: str, query=None, timeout_s: float = 120):
        """Run ``code`` with this project's Python on the machine (``project_dir/.venv``, in
        ``project_dir``), ``query`` as JSON on its standard input; what the last line it
        prints holds, read as JSON.

        Raises:
            RuntimeError: it failed or printed no JSON (the message is its last line of
                error output); subprocess.TimeoutExpired: it took longer than ``timeout_s``.
        """
        py = shlex.quote(str(Path(project_dir) / ".venv" / "bin" / "python"))
        r = self.run(
            f"cd {shlex.quote(project_dir)} && {py} -c {shlex.quote(code)}",
            timeout_s=timeout_s,
            input=None if query is None else json.dumps(query),
        )
        try:
            return json.loads(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            out = (r.stderr or r.stdout).strip()
            raise RuntimeError(out.splitlines()[-1] if out else f"exit status {r.returncode}, no output") from None


def clock_offset(machine: Machine, rounds: int = 9, timeout_s: float = 20) -> tuple[float, float]:
    """The machine's clock minus this one's, in seconds, and its uncertainty (half the
    shortest round trip), from the round trip with the shortest time (as NTP's filter does).

    One SSH connection carries every round (a shell there answers each line with ``date
    +%s.%N``), so a round trip is the path's and a shell's, not an SSH login's.

    Raises:
        RuntimeError: SSH or the remote ``date`` failed, or no answer came within ``timeout_s``.
    """
    proc = subprocess.Popen(
        machine.ssh_argv("while read -r _; do date +%s.%N; done"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
    timer = threading.Timer(timeout_s, proc.kill)
    timer.start()
    best = None
    try:
        for _ in range(rounds):
            t0 = time.time()
            proc.stdin.write("\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
            t1 = time.time()
            try:
                remote = float(line.strip())
            except ValueError:
                said = (line + proc.stderr.read()).strip() if proc.poll() is not None else line.strip()
                raise RuntimeError(f"date on {machine.addr} failed: {said!r}") from None
            rtt = t1 - t0
            if best is None or rtt < best[1]:
                best = (remote - (t0 + t1) / 2, rtt)
    except (BrokenPipeError, OSError) as e:
        raise RuntimeError(f"date on {machine.addr} failed: {e}") from None
    finally:
        timer.cancel()
        end_process(proc, 5)
    return best[0], best[1] / 2


def end_process(proc: subprocess.Popen, timeout_s: float) -> bool:
    """Close ``proc``'s stdin (a remote command reading it ends at end of file) and wait up
    to ``timeout_s`` for it to exit, else kill it; True if it exited by itself."""
    try:
        proc.stdin.close()
    except OSError:
        pass
    try:
        proc.wait(timeout=timeout_s)
        return True
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return False


def _largest_unfragmented(addr: str, sizes=(1500, GRE_PACKET_BYTES, 1280)) -> int | None:
    """The largest of ``sizes`` (IPv4 packet bytes) that reaches ``addr`` with DF set, or None."""
    for size in sizes:
        r = subprocess.run(
            ["ping", "-c", "1", "-W", "2", "-M", "do", "-s", str(size - 28), addr], capture_output=True, text=True
        )
        if r.returncode == 0:
            return size
    return None


#: what a machine's project says of itself (no revision when its copy has no
#: :mod:`common.provenance`: :func:`compare_source` reports it)
_REMOTE_PROBE = (
    "import json, importlib.metadata as md, shutil; from testbed.check import kernel_qdiscs\n"
    "try:\n    from common.provenance import changes_digest, source_revision\n"
    "    (commit, dirty), changes = source_revision(), changes_digest()\n"
    "except ImportError:\n    commit = dirty = changes = None\n"
    "print(json.dumps({'version': md.version('dl-netbed'), 'commit': commit, 'dirty': dirty, "
    "'changes': changes, 'qdiscs': kernel_qdiscs(), "
    "'tools': {t: shutil.which(t) for t in ('mnexec', 'bwm-ng')}}))"
)


@dataclass(frozen=True)
class Source:
    """What code a machine runs: the project's version; for a git checkout, its commit,
    whether a tracked file differs from it and the digest of those changes
    (:func:`common.provenance.changes_digest`), else None."""

    version: str | None
    commit: str | None = None
    dirty: bool | None = None
    changes: str | None = None

    @classmethod
    def here(cls) -> Source:
        """This machine's."""
        commit, dirty = source_revision()
        return cls(distribution_version(DISTRIBUTION), commit, dirty, changes_digest() if dirty else None)

    @classmethod
    def of_probe(cls, probe: dict) -> Source:
        """A machine's, from what its project printed (``version``, ``commit``, ``dirty``, ``changes``)."""
        return cls(probe.get("version"), probe.get("commit"), probe.get("dirty"), probe.get("changes"))

    def describe(self) -> str:
        """``commit 0123456789ab (uncommitted changes)``, or ``version X (no git checkout)``."""
        if self.commit is None:
            return f"version {self.version} (no git checkout)"
        return f"commit {self.commit[:12]}" + (" (uncommitted changes)" if self.dirty else "")

    def remedy(self) -> str:
        """What another machine must do to run this code."""
        if self.commit is None:
            return f"install version {self.version} there"
        if not self.dirty:
            return f"check out commit {self.commit[:12]} there, without uncommitted changes"
        return f"check out commit {self.commit[:12]} there with this machine's uncommitted changes (git diff HEAD)"


def compare_source(there: Source, here: Source) -> tuple[bool, str]:
    """Whether a machine runs the same code as this one, and why not.

    The same code: both checkouts at one commit, with no uncommitted changes to a tracked file
    or the same ones (equal :attr:`Source.changes`); without a checkout on either side, the
    same version; a checkout on one side only cannot be compared: not the same.

    Returns:
        ``(same, detail)``: ``detail`` describes the machine's code and, when it is not the
        same, this machine's and what differs.
    """
    if here.commit is None and there.commit is None:
        same = there.version == here.version
        return same, there.describe() + ("" if same else f"; here: version {here.version}")
    mine = f"; here: {here.describe()}"
    if here.commit is None or there.commit is None:
        return False, f"{there.describe()}{mine}: the code cannot be compared"
    if there.commit != here.commit:
        return False, f"{there.describe()}{mine}: another commit"
    if not there.dirty and not here.dirty:
        return True, there.describe()
    if there.dirty and here.dirty and there.changes is not None and there.changes == here.changes:
        return True, f"{there.describe()}, the same as here"
    if there.dirty and here.dirty:
        return False, f"{there.describe()}{mine}: other uncommitted changes"
    return False, f"{there.describe()}{mine}: uncommitted changes {'there' if there.dirty else 'here'} only"


def _last_line(text: str | None) -> str:
    """The last line of ``text`` (stripped), or ``""`` when it has none."""
    lines = (text or "").strip().splitlines()
    return lines[-1] if lines else ""


def check_machine(
    machine: Machine,
    project_dir: str | None = None,
    here: Source | None = None,
    max_offset_s: float = 0.05,
    tunnel: str = "gre",
) -> list[Item]:
    """Every requirement of one machine, each an :class:`~testbed.check.Item` named
    ``<addr>: <what>`` with a remedy. When SSH fails, that is the only item.

    Args:
        machine: the machine.
        project_dir: this project's directory there (default: its directory here).
        here: the code it must run (default: this machine's, :meth:`Source.here`), compared
            by :func:`compare_source`.
        max_offset_s: the largest clock offset accepted (beyond it, timestamps would need the
            correction recorded with the run; the item fails so that it is seen).
    """
    project_dir = project_dir or str(PROJECT_DIR)
    here = here or Source.here()
    name = machine.addr
    try:
        r = machine.run("id -u")
    except subprocess.TimeoutExpired:
        r = subprocess.CompletedProcess([], 255, "", "timed out")
    if r.returncode != 0:
        return [
            Item(
                f"{name}: ssh",
                False,
                f"cannot log in as {machine.user} without a password "
                f"({_last_line(r.stderr) or 'exit ' + str(r.returncode)})",
                f"ssh-copy-id {machine.user}@{name} (key-based login), and check the address and port",
            )
        ]
    items = [Item(f"{name}: ssh", True, f"logged in as {machine.user}")]
    uid = r.stdout.strip()
    items.append(Item(f"{name}: root", uid == "0", f"uid {uid}", "log in as root (cluster.user: root)"))
    try:
        probe, failure = machine.python(project_dir, _REMOTE_PROBE, timeout_s=60), None
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        probe, failure = None, str(e)
    if probe is None:
        items.append(
            Item(
                f"{name}: project",
                False,
                f"no working project at {project_dir} ({failure})",
                f"clone this project to {project_dir} there and run scripts/setup.sh (or set cluster.project_dir)",
            )
        )
    else:
        same, detail = compare_source(Source.of_probe(probe), here)
        items.append(Item(f"{name}: project", same, f"{detail} at {project_dir}", here.remedy()))
        for tool, path in probe["tools"].items():
            items.append(
                Item(
                    f"{name}: {tool}",
                    path is not None,
                    path or "not found",
                    "apt-get install mininet bwm-ng (or scripts/setup.sh there)",
                )
            )
        htb = probe["qdiscs"].get("htb", False)
        items.append(Item(f"{name}: qdisc htb", htb, "available" if htb else "missing", "a kernel with sch_htb"))
    try:
        off, unc = clock_offset(machine)
        items.append(
            Item(
                f"{name}: clock",
                abs(off) <= max_offset_s + unc,
                f"offset {off * 1e3:+.1f} ms +- {unc * 1e3:.1f} ms",
                f"synchronise the clocks (chrony or systemd-timesyncd) to within {max_offset_s * 1e3:g} ms",
            )
        )
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
        items.append(Item(f"{name}: clock", False, str(e), "a working date command on the machine"))
    probe_dev = "tbtunchk0"
    cmd = tunnel_command(tunnel, probe_dev, machine.addr, machine.addr, 1)
    r = machine.run(f"{cmd} && ip link del {probe_dev}")
    items.append(
        Item(
            f"{name}: tunnel {tunnel}",
            r.returncode == 0,
            "the kernel makes one" if r.returncode == 0 else (r.stderr or r.stdout).strip() or "failed",
            "a kernel with ip_gre (tunnel: gre) or vxlan (tunnel: vxlan); set cluster.tunnel to one it has",
        )
    )
    size = _largest_unfragmented(machine.addr)
    ok = size is not None and size >= GRE_PACKET_BYTES
    items.append(
        Item(
            f"{name}: path MTU",
            ok,
            f"{size} bytes unfragmented" if size else "no unfragmented ping",
            f"an MTU of at least {GRE_PACKET_BYTES} bytes between the machines (GRE tunnels add 24 bytes)",
        )
    )
    return items


def check_cluster(spec: ClusterSpec) -> list[Item]:
    """:func:`check_machine` for every machine of ``spec``, in order, each compared with this
    machine's code."""
    here = Source.here()
    return [it for m in Machine.of(spec) for it in check_machine(m, spec.project_dir, here, tunnel=spec.tunnel)]


def load_cluster(path: str | Path) -> tuple[ClusterSpec, dict[str, str]]:
    """The ``cluster:`` section of an experiment spec file, validated, and where the nodes of
    its ``topology:`` (with the defaults) go (:func:`topologies.placement.place_racks`; a
    host a scheme adds to a rack would go with its rack).

    Raises:
        SpecError: no readable YAML mapping, no ``cluster:`` section, or bad fields in it or
            in ``topology`` (every one, named ``cluster.<field>``), or a placement that cannot
            be made (named ``cluster.machines``).
    """
    try:
        data = load_yaml(Path(path).read_text(), source=str(path))
    except SpecError:  # a key given twice: named by its own path
        raise
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise SpecError("<file>", str(path), f"a readable YAML experiment spec ({type(e).__name__}: {e})") from None
    if not isinstance(data, dict) or "cluster" not in data:
        raise SpecError("cluster", None, "a 'cluster:' section {machines: [addr, ...], user: root, placement: rack}")
    errors: list[FieldError] = []
    cluster = topo_spec = None
    try:
        cluster = ClusterSpec.model_validate(data["cluster"])
    except ValidationError as e:
        errors += field_errors(e, ClusterSpec, prefix="cluster")
    try:
        topo_spec = TopologySpec.model_validate(data.get("topology") or {})
    except ValidationError as e:
        errors += field_errors(e, TopologySpec, prefix="topology")
    if errors:
        raise SpecError.of(errors)
    try:
        where = place_racks(build_topo(topo_spec), cluster.machines)
    except PlacementError as e:
        raise SpecError("cluster.machines", cluster.machines, str(e)) from None
    return cluster, where


def format_placement(where: dict[str, str]) -> str:
    """One line per machine: the nodes placed on it, switches first."""
    by: dict[str, list[str]] = {}
    for node, m in where.items():
        by.setdefault(m, []).append(node)
    key = lambda n: (0 if n.startswith("core") else 1 if n.startswith("tor") else 2, len(n), n)  # noqa: E731
    return "\n".join(f"{m}: {' '.join(sorted(nodes, key=key))}" for m, nodes in by.items())
