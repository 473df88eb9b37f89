"""TCP flows from the header captures of a run (``traces/pcap/``), each end named by process.

A run with ``capture.pcap`` holds, per captured switch port, tcpdump's file
``traces/pcap/<port>.pcap`` (Ethernet, headers only: ``snaplen_bytes``, e.g. 128), the index
``traces/pcap/ports.json`` (``[{port, file, snaplen_bytes, filter, started, stopped, ...}]``)
and ``traces/endpoints.csv`` (which training process owned which TCP endpoint). This package
reads them without a live network:

* :func:`flows`: one row per TCP connection per captured port (bytes, packets, payload,
  retransmitted segments, an ACK-clocked RTT, and the process, role and rank at each end);
* :func:`flow_rates`: bytes/s of each flow over time on one port (a stacked rate plot,
  :func:`analysis.plots.plot_flow_rates`);
* :func:`check_against_counters`: each port's flow bytes against its bwm-ng counters.

Its modules, each building on the ones before it:

* :mod:`analysis.flows.decode`: the pcap reader and its vectorised Ethernet/IP/TCP decoder
  (flows, bytes, packets, retransmissions, RTT samples);
* :mod:`analysis.flows.owners`: ``ports.json``, ``endpoints.csv`` and the topology (which
  process owns an endpoint, which host an address, which hosts lie behind a port);
* :mod:`analysis.flows.table`: the flow table and the flow rates, in emulated time;
* :mod:`analysis.flows.counters`: the captured bytes against the bwm-ng counters.

``import analysis`` binds ``analysis.flows`` to the function :func:`flows`; the package itself
is ``importlib.import_module("analysis.flows")``. :data:`CHUNK_PACKETS` is read from
:mod:`analysis.flows.decode` (set it there).
"""

from analysis.flows.counters import CHECK_COLUMNS, check_against_counters
from analysis.flows.decode import CHUNK_PACKETS, PcapWarning
from analysis.flows.owners import CaptureError, ports_behind, read_endpoints, read_ports
from analysis.flows.table import FLOW_COLUMNS, flow_labels, flow_rates, flows, flows_and_rates, retransmissions

__all__ = [
    "flows",
    "retransmissions",
    "flow_rates",
    "flows_and_rates",
    "flow_labels",
    "check_against_counters",
    "read_ports",
    "read_endpoints",
    "ports_behind",
    "FLOW_COLUMNS",
    "CHECK_COLUMNS",
    "CaptureError",
    "PcapWarning",
    "CHUNK_PACKETS",
]
