"""Which training process owns which TCP endpoints: ``traces/endpoints.csv``.

A packet capture names flows by address and port; this record names the process at each
end. Every ``capture.endpoints_interval_ms`` a sampler (:class:`EndpointSampler`, driven by
:class:`testbed.capture.periodic.SampledCsv`) reads, for each training process, its socket
inodes (``/proc/<pid>/fd``) and the TCP socket tables of *its* network namespace
(``/proc/<pid>/net/tcp`` and ``tcp6``: procfs shows a process's own namespace there, which
``psutil.net_connections`` cannot, as it reads this process's namespace). (Reading procfs's
TCP tables costs the same per namespace whatever the namespace holds, as the kernel walks the
whole hash table, so the sampler asks the kernel through sock_diag instead, with one pyroute2
``DiagSocket`` opened inside each host's namespace. Connections are made at start-up, or on
first use (gloo's lazy connect), so after its first 20 samples the sampler backs off, since a
read of a full mesh's sockets is costly: it reads every 10th period, and each read that finds
no new socket doubles the gap, up to every 120th period (a minute at the default 500 ms); a
read that finds one returns to every 10th. Measured costs: ``docs/scaling.md``, "What the
capture costs".) A socket is written once, when first seen: ``time, proc, role,
rank, host, pid, local_ip, local_port, remote_ip,
remote_port, state`` (``remote`` ``0.0.0.0:0`` for a listener; ``state`` the kernel's TCP
state name). Connections that open and close between two samples (the rendezvous store's
short ones) can be missed; gloo's and the schemes' connections live for the whole run.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from collections.abc import Callable

from pyroute2 import DiagSocket
from pyroute2.netns import setns

__all__ = ["EndpointSampler", "ENDPOINT_FIELDS", "read_tcp_table"]

ENDPOINT_FIELDS = [
    "time",
    "proc",
    "role",
    "rank",
    "host",
    "pid",
    "local_ip",
    "local_port",
    "remote_ip",
    "remote_port",
    "state",
]

#: include/net/tcp_states.h
TCP_STATES = {
    1: "ESTABLISHED",
    2: "SYN_SENT",
    3: "SYN_RECV",
    4: "FIN_WAIT1",
    5: "FIN_WAIT2",
    6: "TIME_WAIT",
    7: "CLOSE",
    8: "CLOSE_WAIT",
    9: "LAST_ACK",
    10: "LISTEN",
    11: "CLOSING",
    12: "NEW_SYN_RECV",
}


def _addr(hex_addr: str) -> tuple[str, int]:
    """``0100007F:1F90`` (procfs: address in host byte order per 32-bit word) -> ('127.0.0.1', 8080);
    an IPv4-mapped IPv6 address is given as IPv4."""
    ip_hex, port_hex = hex_addr.split(":")
    raw = bytes.fromhex(ip_hex)
    raw = b"".join(struct.pack("<I", struct.unpack(">I", raw[i : i + 4])[0]) for i in range(0, len(raw), 4))
    if len(raw) == 4:
        ip = socket.inet_ntop(socket.AF_INET, raw)
    else:
        a = ipaddress.IPv6Address(raw)
        ip = str(a.ipv4_mapped) if a.ipv4_mapped else str(a)
    return ip, int(port_hex, 16)


def read_tcp_table(pid: int) -> dict[int, tuple]:
    """``{inode: (local_ip, local_port, remote_ip, remote_port, state)}`` of the TCP sockets of
    the network namespace of process ``pid`` (``/proc/<pid>/net/tcp`` and ``tcp6``); empty if
    the process is gone."""
    out = {}
    for name in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{name}") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) < 10:
                continue
            (lip, lport), (rip, rport) = _addr(parts[1]), _addr(parts[2])
            out[int(parts[9])] = (lip, lport, rip, rport, TCP_STATES.get(int(parts[3], 16), parts[3]))
    return out


def socket_inodes(pid: int) -> set[int]:
    """Inodes of the sockets open in process ``pid`` (its threads share them); empty if gone."""
    out = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(int(target[8:-1]))
    return out


def _diag_socket_in(pid: int) -> DiagSocket:
    """A sock_diag socket of the network namespace of process ``pid`` (a socket keeps the
    namespace it was made in; this thread enters it for the moment of the socket's creation)."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        setns(f"/proc/{pid}/ns/net", flags=0)
        try:
            ds = DiagSocket()
            ds.bind()
        finally:
            setns(own, flags=0)
    finally:
        os.close(own)
    return ds


def diag_table(ds: DiagSocket) -> dict[int, tuple]:
    """``{inode: (local_ip, local_port, remote_ip, remote_port, state)}`` of every TCP socket
    of the namespace of ``ds`` (IPv4 and IPv6; v4-mapped addresses given as IPv4)."""
    out = {}
    for family in (socket.AF_INET, socket.AF_INET6):
        for m in ds.get_sock_stats(family=family):
            out[int(m["idiag_inode"])] = (
                _ip(m["idiag_src"]),
                int(m["idiag_sport"]),
                _ip(m["idiag_dst"]),
                int(m["idiag_dport"]),
                TCP_STATES.get(int(m["idiag_state"]), str(m["idiag_state"])),
            )
    return out


def _ip(text: str) -> str:
    a = ipaddress.ip_address(text)
    return str(a.ipv4_mapped) if getattr(a, "ipv4_mapped", None) else str(a)


class EndpointSampler:
    """Rows of ``endpoints.csv`` (the columns after ``time``) for sockets not seen before.

    Args:
        procs: called at every sample; returns ``[(info, pid)]`` for the training processes
            started so far, ``info`` a ``processes.json`` entry (name, role, rank, host).
    """

    #: samples taken at every period before backing off, the period multiple after, and the
    #: largest multiple the gap doubles to while reads find nothing new
    FAST_SAMPLES, SLOW_EVERY, MAX_EVERY = 20, 10, 120

    def __init__(self, procs: Callable[[], list[tuple[dict, int]]]):
        self.procs = procs
        self._seen: set[tuple] = set()
        self._diag: dict[str, DiagSocket] = {}  # namespace -> its sock_diag socket
        self._calls = 0
        self._every = self.SLOW_EVERY  # the current gap, in periods, once past FAST_SAMPLES
        self._next = 0  # the call that reads next, once past FAST_SAMPLES

    def open(self) -> EndpointSampler:
        self._seen.clear()
        self._calls = 0
        self._every, self._next = self.SLOW_EVERY, 0
        return self

    def _due(self) -> bool:
        """Whether this call reads (see the module docstring for the schedule)."""
        self._calls += 1
        if self._calls <= self.FAST_SAMPLES:
            return True
        if not self._next:
            self._next = self.FAST_SAMPLES + self.SLOW_EVERY
        return self._calls >= self._next

    def _reschedule(self, found: bool) -> None:
        """After a read past FAST_SAMPLES: back to every SLOW_EVERY periods if it ``found`` a
        new socket, else double the gap (at most MAX_EVERY)."""
        if self._calls > self.FAST_SAMPLES:
            self._every = self.SLOW_EVERY if found else min(self.MAX_EVERY, 2 * self._every)
            self._next = self._calls + self._every

    def close(self) -> None:
        self._seen.clear()
        for ds in self._diag.values():
            ds.close()
        self._diag.clear()

    def _table(self, ns: str, pid: int) -> dict[int, tuple]:
        try:
            if ns not in self._diag:
                self._diag[ns] = _diag_socket_in(pid)
            return diag_table(self._diag[ns])
        except OSError:  # the process (and maybe its namespace) is gone, or no sock_diag: procfs
            self._diag.pop(ns, None)
            return read_tcp_table(pid)

    def read(self) -> list[tuple]:
        if not self._due():
            return []
        rows = []
        tables: dict[str, dict[int, tuple]] = {}  # one read of the tables per namespace
        for info, pid in self.procs() or []:
            inodes = socket_inodes(pid)
            if not inodes:
                continue
            try:
                ns = os.readlink(f"/proc/{pid}/ns/net")
            except OSError:
                continue
            if ns not in tables:
                tables[ns] = self._table(ns, pid)
            for inode in sorted(inodes):
                sock = tables[ns].get(inode)
                if sock is None:
                    continue
                key = (pid, inode, sock[:4])
                if key in self._seen:
                    continue
                self._seen.add(key)
                rows.append((info["name"], info.get("role"), info.get("rank"), info.get("host"), pid, *sock))
        self._reschedule(bool(rows))
        return rows
