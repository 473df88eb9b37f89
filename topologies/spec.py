"""The topology section of an experiment spec (``topology:``), owned by this package."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from common.errors import FieldError
from common.validation import SpecModel
from topologies.hosts import uplink_mbps

#: the most hosts (worker, background and scheme-requested) a spec may ask for, and the most
#: links from one host to its ToR: far beyond what one machine emulates (each host is a
#: process and a network namespace), so that a typo (``racks: 2000``) is refused at once
#: instead of being planned; what fits this machine is a separate, measured estimate
MAX_HOSTS = 4096
MAX_INTERFACES = 64
#: the highest rate a link is shaped at on this machine, Mbit/s (after dilation): above it a
#: veth pair on one CPU cannot keep up anyway. The spec's validation and the build
#: (:class:`testbed.shaping.ShapedIntf`) both use this one value.
MAX_RATE_MBPS = 40_000.0
#: the lowest rate a link is shaped at, Mbit/s (after dilation): 800 bit/s = 100 bytes/s.
#: htb keeps a rate as whole bytes per second, which tc truncates, so a rate reads back within
#: :data:`testbed.shaping.RATE_TOLERANCE` (1 %) only from 99 bytes/s on. htb also keeps the
#: burst as a 32-bit count of psched ticks (/proc/net/psched): the 15,000-byte burst of
#: :func:`testbed.shaping.htb_burst_bytes` fits from 55 bytes/s on (below, tc stores a smaller
#: burst and pyroute2, which changes a rate in place, fails to encode it). 100 bytes/s meets
#: all three (the read-backs this rests on: ``docs/experiments.md``, "What this kernel can
#: emulate").
MIN_RATE_MBPS = 0.0008
#: the longest one-way delay a link may have, ms (after dilation): tc holds netem's latency
#: as a 32-bit count of psched ticks, 2**32 / 15.625 ticks per microsecond = 274.877906944 s
#: (tc refuses more, "time (too large)"; from 2**32 microseconds on it wraps silently; what tc
#: did: ``docs/experiments.md``, "What this kernel can emulate").
MAX_DELAY_MS = 274_877.906944
#: the largest queue limit, packets: tc's ``pfifo limit`` and netem's ``limit`` are 32-bit
#: (tc refuses 2**32, "Illegal value for limit")
MAX_QUEUE_PACKETS = 2**32 - 1
#: the largest ``net.ipv4.tcp_notsent_lowat``: an unsigned int the kernel reads with
#: ``proc_douintvec`` (net/ipv4/sysctl_net_ipv4.c), which refuses more with EINVAL
MAX_NOTSENT_LOWAT_BYTES = 2**32 - 1
#: the largest ``net.ipv4.tcp_min_tso_segs``: the kernel keeps it in one byte and refuses 0
#: and 256 with EINVAL
MAX_MIN_TSO_SEGS = 255
#: the largest least retransmission timeout, emulated ms (a minute: far above any queueing delay)
MAX_RTO_MIN_MS = 60_000.0
#: Linux's least TCP retransmission timeout, ms (``TCP_RTO_MIN`` = HZ/5 in include/net/tcp.h)
TCP_RTO_MIN_MS = 200.0
#: the most ports of one switch: a Linux bridge numbers its ports in BR_PORT_BITS = 10 bits
#: (BR_MAX_PORTS = 1 << BR_PORT_BITS in net/bridge/br_private.h) and port 0 is reserved
#: (find_portno in net/bridge/br_if.c), so the 1,024th port fails with EXFULL
MAX_BRIDGE_PORTS = (1 << 10) - 1


def rate_error(field: str, bw: float, scale: float, upper: bool = True) -> FieldError | None:
    """The error of a link rate ``bw`` (emulated Mbit/s) that, shaped on this machine at time
    dilation ``scale`` (``bw / scale``), falls outside [:data:`MIN_RATE_MBPS`,
    :data:`MAX_RATE_MBPS`], or None. ``upper=False`` checks the minimum only: under
    ``scale: auto`` the rate is checked at scale 1 before the scale is resolved (it resolves
    to 1 or more, which only lowers the shaped rate) and fully once it is."""
    shaped = bw / scale
    if MIN_RATE_MBPS <= shaped and (not upper or shaped <= MAX_RATE_MBPS):
        return None
    low = shaped < MIN_RATE_MBPS
    return FieldError(
        field,
        bw,
        f"a rate whose shaped rate ({bw:g} / scale {scale:g} = {shaped:g} Mbit/s) is "
        f"{'at least' if low else 'at most'} {MIN_RATE_MBPS if low else MAX_RATE_MBPS:g} Mbit/s "
        f"(htb shapes [{MIN_RATE_MBPS:g}, {MAX_RATE_MBPS:g}] Mbit/s on this machine): "
        + ("raise it" + (" or lower scale" if scale > 1 else "") if low else "lower it or raise scale"),
    )


class TopologySpec(SpecModel):
    """The emulated datacenter.

    ``rack``: ``hosts_per_rack`` hosts on one top-of-rack (ToR) switch (``racks`` is 1, its
    default for this kind). ``rack_core``: ``racks`` racks (default 2) of ``hosts_per_rack``
    hosts; each ToR has one uplink to a core switch of ``uplink_bw_mbps``, by default
    ``hosts_per_rack * host_bw_mbps / oversubscription`` (Mbit/s). Hosts a scheme asks for (parameter-server hosts,
    PBoxes)
    are added to their racks (:class:`topologies.hosts.HostRequest`).
    """

    kind: Literal["rack", "rack_core"] = "rack_core"
    """``rack`` (one ToR) or ``rack_core`` (racks under a core switch)."""
    racks: int = Field(2, gt=0)
    """Number of racks; left out: 1 for ``kind: rack``, 2 for ``kind: rack_core``."""
    hosts_per_rack: int = Field(4, gt=0)
    """Worker hosts per rack."""
    host_bw_mbps: float = Field(100.0, gt=0)
    """Rate of every host link, Mbit/s of the emulated network."""
    uplink_bw_mbps: float | None = Field(None, gt=0)
    """ToR->core uplink rate, Mbit/s; null: derived from ``oversubscription``."""
    oversubscription: float = 1.0
    """(hosts_per_rack x host_bw_mbps) / uplink rate, a ratio >= 1."""
    delay_ms: float = Field(0.0, ge=0)
    """One-way delay of every link, ms (needs the netem qdisc); dilated (x ``scale``) at most
    :data:`MAX_DELAY_MS` (274,877 ms, netem's limit) and below ``run.timeout_s``."""
    loss_pct: float = 0.0
    """Packet loss of every link, % in [0, 100) (needs the netem qdisc)."""
    max_queue_packets: int | None = Field(None, gt=0, le=MAX_QUEUE_PACKETS)
    """Queue limit of every shaped interface, packets (a pfifo leaf); null: the kernel's. At
    most 4294967295 (:data:`MAX_QUEUE_PACKETS`: tc's limits are 32-bit)."""
    interfaces_per_host: int = Field(1, gt=0)
    """Links from every host to its ToR, each shaped at ``host_bw_mbps`` with its own address."""
    background_hosts_per_rack: int = Field(0, ge=0)
    """Extra hosts ``bg1..`` per rack (rack by rack) that carry only ``background`` flows,
    so that a busy core can be emulated without loading the workers' own links."""
    mtu_bytes: int = 1500
    """MTU of every interface, bytes in [576, 9000] (9000: jumbo frames, less per-packet overhead)."""
    tcp_notsent_lowat_bytes: int | None = Field(None, gt=0, le=MAX_NOTSENT_LOWAT_BYTES)
    """The hosts' ``net.ipv4.tcp_notsent_lowat``: unsent bytes a TCP socket accepts before a
    sender blocks. null keeps the kernel's default (unlimited: a send "completes" once it is
    in a socket buffer that autotuning grows to 16 MB, 32 ms of a 4 Gbit/s link); a small
    value (e.g. 131072) makes a blocking send follow the network's pace, which P3's
    application-level priority queue relies on (P3 Sec. 4.3). At most 4294967295
    (:data:`MAX_NOTSENT_LOWAT_BYTES`: the kernel's sysctl is an unsigned int)."""
    tcp_congestion_control: Literal["cubic", "reno", "bbr"] | None = "cubic"
    """The hosts' TCP congestion control, set on every route of a host (``ip route ... congctl``),
    which selects it for each connection whatever the namespace's sysctl allows. The default,
    cubic, is Linux's default congestion control, so that a run does not depend on the
    machine's setting; null keeps the machine's default (``net.ipv4.tcp_congestion_control``
    of the root namespace, which a new namespace inherits). BBR's ProbeRTT comes every 10 s
    of real time, 10/scale s of emulated time, and its pacing slows dilated runs (see
    ``docs/experiments.md``). The congestion control each host used is recorded in
    ``topology.json``."""
    tcp_min_tso_segs: int | None = Field(None, ge=1, le=MAX_MIN_TSO_SEGS)
    """The hosts' ``net.ipv4.tcp_min_tso_segs``: the fewest MSS-sized segments Linux puts in
    one TSO/GSO packet. Linux sizes those packets to about 1 ms of a connection's pacing rate
    (``tcp_tso_autosize``), which time dilation divides by ``scale``: a host shaped at
    1 Gbit/s / 79 sends packets of 2 segments where one at 1 Gbit/s sends 64 KiB, and every
    packet costs about the same CPU whatever its size (see ``docs/experiments.md``). The
    emulated host's own size is ``min(host_bw_mbps x 1e6 / 8 / 1024, 65536) / MSS`` segments,
    rounded down: at 1 Gbit/s 64 KiB, 45 segments of a 1500-byte MTU's 1448-byte MSS
    (``experiments/scale_vgg19.yaml`` uses 44). It applies to reno and
    cubic; BBR sizes its packets itself. null keeps the kernel's default (2); 1 to 255."""
    tcp_slow_start_after_idle: bool = False
    """The hosts' ``net.ipv4.tcp_slow_start_after_idle``. TCP restarts its congestion window
    after an idle period longer than its retransmission timeout (RFC 5681 Sec. 4.1), at least
    200 ms of real time (the kernel's TCP_RTO_MIN), a timer the time dilation does not stretch:
    at ``scale`` s an idle of 200/s ms of emulated time (2.5 ms at 80) already restarts it,
    where a sender on the emulated network would keep its window through any idle below
    200 ms, such as the gap between a worker's last pull and its next push. false (the
    default) turns the restart off, which matches the emulated network for every idle below
    its real timeout; true keeps the kernel's default."""

    tcp_rto_min_ms: float | None = Field(TCP_RTO_MIN_MS, gt=0, le=MAX_RTO_MIN_MS)
    """The hosts' least TCP retransmission timeout, emulated ms, set on every route of a host
    (``ip route ... rto_min``, which iproute2 locks) and dilated (x ``scale``). The default,
    200, is Linux's own least (``TCP_RTO_MIN``, HZ/5 in ``include/net/tcp.h``), the value the
    papers' hosts ran with, here in emulated time. The kernel's timer itself is 200 ms of real
    time, which the time dilation does not stretch: at ``scale`` s it is 200/s ms of emulated
    time (2.5 ms at 80), so a queue that holds a segment longer than that makes its sender
    time out, resend and restart from a window of one segment although nothing was lost, and
    the same network gets slower the more it is dilated (the runs that showed it:
    ``docs/experiments.md``, "TCP's timers are not dilated"). null keeps the
    kernel's 200 ms of real time. At most 60,000; the kernel caps every timeout at 120 s of
    real time, which a dilation above 600 reaches at the default."""

    @model_validator(mode="before")
    @classmethod
    def _racks_of_kind(cls, data):
        """``racks`` left out takes the kind's default: one rack for ``kind: rack`` (the
        field's default, 2, is that of ``rack_core``), so that a default never contradicts
        the kind the user wrote."""
        if isinstance(data, dict) and "racks" not in data and data.get("kind") == "rack":
            return {**data, "racks": 1}
        return data

    @field_validator("oversubscription")
    @classmethod
    def _ratio(cls, v):
        if v < 1:
            raise ValueError("a ratio >= 1")
        return v

    @field_validator("loss_pct")
    @classmethod
    def _pct(cls, v):
        if not 0 <= v < 100:
            raise ValueError("a percentage in [0, 100)")
        return v

    @field_validator("mtu_bytes")
    @classmethod
    def _mtu(cls, v):
        if not 576 <= v <= 9000:
            raise ValueError("an MTU in [576, 9000] bytes (9000: jumbo frames)")
        return v

    def uplink_mbps(self) -> float:
        """ToR->core uplink rate in Mbit/s (explicit, or derived from oversubscription)."""
        if self.uplink_bw_mbps is not None:
            return float(self.uplink_bw_mbps)
        return uplink_mbps(self.hosts_per_rack, self.host_bw_mbps, self.oversubscription)

    def cross_errors(self, prefix: str = "topology") -> list[FieldError]:
        """Checks that involve several fields (run once every field is valid): one rack for
        ``kind: rack``; at most :data:`MAX_HOSTS` hosts and :data:`MAX_INTERFACES` links per host."""
        out = []
        if self.kind == "rack" and self.racks != 1:
            out.append(
                FieldError(
                    f"{prefix}.racks", self.racks, "1 for topology.kind 'rack' (use 'rack_core' for several racks)"
                )
            )
        hosts = self.racks * (self.hosts_per_rack + self.background_hosts_per_rack)
        if hosts > MAX_HOSTS:
            out.append(
                FieldError(
                    prefix,
                    {
                        "racks": self.racks,
                        "hosts_per_rack": self.hosts_per_rack,
                        "background_hosts_per_rack": self.background_hosts_per_rack,
                    },
                    f"at most {MAX_HOSTS} hosts in all (racks x (hosts_per_rack + "
                    f"background_hosts_per_rack) = {hosts})",
                )
            )
        if self.tcp_min_tso_segs is not None and self.tcp_congestion_control == "bbr":
            out.append(
                FieldError(
                    f"{prefix}.tcp_min_tso_segs",
                    self.tcp_min_tso_segs,
                    "null with tcp_congestion_control 'bbr' (BBR sizes its packets itself; use cubic or reno)",
                )
            )
        if self.interfaces_per_host > MAX_INTERFACES:
            out.append(
                FieldError(f"{prefix}.interfaces_per_host", self.interfaces_per_host, f"at most {MAX_INTERFACES}")
            )
        return out

    def rate_errors(self, scale: float, prefix: str = "topology", upper: bool = True) -> list[FieldError]:
        """The links whose rate or delay, shaped on this machine at time dilation ``scale``
        (rate / ``scale``, delay x ``scale``), the shaper cannot take: the host links (the
        scheme's server hosts' links have the same rate) and, for ``rack_core``, the
        uplinks (given or derived from ``oversubscription``), each a rate in
        [:data:`MIN_RATE_MBPS`, :data:`MAX_RATE_MBPS`] (:func:`rate_error`), and the delay at
        most :data:`MAX_DELAY_MS`. ``upper=False`` leaves out the checks that a larger scale
        could pass (the maximum rate), for ``scale: auto`` checked at 1 before it is resolved."""
        out = []
        rates = [("host_bw_mbps", self.host_bw_mbps)]
        if self.kind == "rack_core":
            rates.append(("uplink_bw_mbps", self.uplink_mbps()))
        for name, bw in rates:
            err = rate_error(f"{prefix}.{name}", bw, scale, upper)
            if err is not None:
                derived = name == "uplink_bw_mbps" and self.uplink_bw_mbps is None
                out.append(
                    FieldError(
                        err.field,
                        err.value,
                        err.allowed
                        + (
                            " (this uplink is derived: hosts_per_rack x host_bw_mbps / oversubscription)"
                            if derived
                            else ""
                        ),
                    )
                )
        if self.delay_ms * scale > MAX_DELAY_MS:
            out.append(
                FieldError(
                    f"{prefix}.delay_ms",
                    self.delay_ms,
                    f"a delay whose dilated value (delay_ms x scale {scale:g} = {self.delay_ms * scale:g} "
                    f"ms) is at most {MAX_DELAY_MS:g} ms (netem's latency is a 32-bit count of ticks)",
                )
            )
        return out

    def dilated(self, scale: float) -> TopologySpec:
        """The topology as shaped on this machine under time dilation ``scale``: every rate
        divided by ``scale``, every delay and the least retransmission timeout multiplied by it."""
        if scale == 1:
            return self
        return self.model_copy(
            update={
                "host_bw_mbps": self.host_bw_mbps / scale,
                "uplink_bw_mbps": self.uplink_mbps() / scale,
                "delay_ms": self.delay_ms * scale,
                "tcp_rto_min_ms": (None if self.tcp_rto_min_ms is None else self.tcp_rto_min_ms * scale),
            }
        )
