"""Payload bytes over a run's switch ports, for end-to-end tests that compare two runs' bytes.

bwm-ng counts one set of headers per packet, and how many packets a stream takes follows the
run's timing (how many segments the kernel batches into one GSO packet, how many ACKs a receiver
sends, the MTU), so two runs that move the same bytes of messages differ in raw bytes; their
bytes less the headers of each packet agree.
"""

from __future__ import annotations

from analysis.load import load
from analysis.metrics import link_bytes

#: bytes of headers bwm-ng counts per packet of a TCP stream: Ethernet 14 + IPv4 20 + TCP 20 +
#: the timestamps option 12. A GSO super-segment crosses a veth as one packet with one set of
#: headers, and how many segments the kernel batches into one, and how many ACKs a receiver
#: sends, follow the timing of the run: measured on the PS case of test_light_memory_e2e, a
#: port's packet count moved by up to 29,602 (51 %) between the full and the light run, its bytes
#: by 0.44 % (1.18 % in another pair of runs), while its bytes less 66 per packet moved by
#: 0.21 % at most
HEADER_BYTES_PER_PACKET = 66


def payload(traces):
    """bwm-ng's switch-port samples with each direction's bytes less
    :data:`HEADER_BYTES_PER_PACKET` per packet (the same columns, for
    :func:`analysis.metrics.link_bytes`)."""
    out = traces.copy()
    out["bytes_in"] = out["bytes_in"] - HEADER_BYTES_PER_PACKET * out["packets_in"]
    out["bytes_out"] = out["bytes_out"] - HEADER_BYTES_PER_PACKET * out["packets_out"]
    return out


def port_payload(run_dir) -> dict[str, int]:
    """Payload bytes per sampled switch port (both directions), over the whole capture."""
    data = load(run_dir)
    per_port = link_bytes(payload(data.traces), data.topology)["per_port"]
    return {port: b["tx"] + b["rx"] for port, b in per_port.items() if b is not None}


def core_payload(run_dir) -> int:
    """Payload bytes the ToRs sent up to the core: the summary's ``bytes.core``
    (:func:`analysis.metrics.link_bytes`) less :data:`HEADER_BYTES_PER_PACKET` per packet."""
    data = load(run_dir)
    return link_bytes(payload(data.traces), data.topology)["core"]
