"""Payload bytes over a run's switch ports, for end-to-end tests that compare two runs' bytes.

bwm-ng counts one set of headers per packet, and how many packets a stream takes follows the
run's timing (how many segments the kernel batches into one GSO packet, how many ACKs a receiver
sends, the MTU), so two runs that move the same bytes of messages differ in raw bytes; their
bytes less the headers of each packet agree.
"""
from __future__ import annotations

from analysis.load import load

#: bytes of headers bwm-ng counts per packet of a TCP stream: Ethernet 14 + IPv4 20 + TCP 20 +
#: the timestamps option 12. A GSO super-segment crosses a veth as one packet with one set of
#: headers, and how many segments the kernel batches into one, and how many ACKs a receiver
#: sends, follow the timing of the run: measured on the PS case of test_light_memory_e2e, a
#: port's packet count moved by up to 29,602 (51 %) between the full and the light run, its bytes
#: by 0.44 % (1.18 % in another pair of runs), while its bytes less 66 per packet moved by
#: 0.21 % at most
HEADER_BYTES_PER_PACKET = 66


def port_payload(run_dir) -> dict[str, int]:
    """Payload bytes per switch port (both directions): bwm-ng's bytes less
    :data:`HEADER_BYTES_PER_PACKET` per packet, over the whole capture."""
    t = load(run_dir).traces.groupby("iface")[["bytes_in", "bytes_out", "packets_in", "packets_out"]].sum()
    return {str(port): int(r.bytes_in + r.bytes_out - HEADER_BYTES_PER_PACKET * (r.packets_in + r.packets_out))
            for port, r in t.iterrows()}


def core_payload(run_dir) -> int:
    """Payload bytes the ToRs sent up to the core (the ports the summary's ``bytes.core`` sums,
    their transmit side), less :data:`HEADER_BYTES_PER_PACKET` per packet."""
    data = load(run_dir)
    ports = data.ports()
    up = set(ports[(ports["link_class"] == "uplink") & ports["tor_side"]]["iface"])
    t = data.traces[data.traces["iface"].isin(up)]
    return int(t["bytes_out"].sum() - HEADER_BYTES_PER_PACKET * t["packets_out"].sum())
