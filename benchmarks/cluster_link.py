"""Link fidelity on one machine and across two namespace "machines" (tests/e2e/test_cluster_machines.py):
one iperf3 TCP flow for 5 s from h1 (rack 1) to h5 (rack 2) through the quickstart's network
(host links 100 Mbit/s, uplinks 200 Mbit/s), so it crosses the core (and, on two machines,
the VXLAN or GRE tunnel of the uplink); the received rate against the 100 Mbit/s the path is
shaped to:

    sudo .venv/bin/python benchmarks/cluster_link.py [--seconds 5]

The namespaces share one kernel and two cores: this checks that the tunnel path keeps the
shaped rate, not what a real cluster's NICs would do."""

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from testbed.cluster import Machine  # noqa: E402
from testbed.ledger import Ledger  # noqa: E402
from testbed.network import Network  # noqa: E402
from testbed.remote import ClusterNetwork  # noqa: E402
from testbed.spec import ClusterSpec  # noqa: E402
from tests.e2e.test_cluster_machines import cluster_section, namespace_machines  # noqa: E402
from topologies.spec import TopologySpec  # noqa: E402


def flow(net, seconds: float, quote) -> float:
    """Received Mbit/s of one iperf3 flow h1 -> h5."""
    srv = net.hosts["h5"].popen(
        [quote(a) for a in ["iperf3", "-s", "-1"]], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    time.sleep(1.0)
    cli = net.hosts["h1"].popen(
        [quote(a) for a in ["iperf3", "-c", net.hosts["h5"].IP(), "-t", str(seconds), "-J"]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, _ = cli.communicate(timeout=seconds + 30)
    srv.wait(timeout=10)
    return json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    topo = TopologySpec.model_validate(
        {"kind": "rack_core", "racks": 2, "hosts_per_rack": 4, "host_bw_mbps": 100, "oversubscription": 2}
    )
    tmp = Path(tempfile.mkdtemp(prefix="cllink"))
    with namespace_machines(tmp) as ns:
        for label in ("1 machine", "2 machines"):
            run_dir = tmp / label.replace(" ", "_")
            run_dir.mkdir()
            ledger = Ledger.create(run_dir.name, run_dir)
            if label == "1 machine":
                net, quote = Network(topo, [], run_dir, ledger), str
            else:
                spec = ClusterSpec.model_validate(cluster_section(ns))
                net, quote = (
                    ClusterNetwork(topo, [], run_dir, ledger, machines=Machine.of(spec), tunnel=spec.tunnel),
                    shlex.quote,
                )
            t0 = time.time()
            with net:
                build = time.time() - t0
                rate = flow(net, args.seconds, quote)
            print(
                f"{label}: build {build:.1f} s, h1 -> h5 received {rate:.1f} Mbit/s of 100 shaped "
                f"({rate / 100 * 100:.1f} %)"
            )


if __name__ == "__main__":
    main()
