"""Build, launch and link use of the quickstart's ps point (20 iterations) on one machine and on two
"machines" made of network namespaces with their own sshd (tests/test_cluster.py), run one after the other:

    sudo .venv/bin/python benchmarks/cluster_build.py

The namespaces share one kernel and two cores, so the figures bound the SSH and tunnel costs; they
are not a real cluster's."""
import sys, time, json, yaml, tempfile
from pathlib import Path
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.test_cluster import namespace_machines, cluster_section
from testbed.spec import load_spec
from testbed.runner import run_experiment
from analysis.traces import parse_bwm_ng

def times(d):
    log = (d / "logs" / "harness.log").read_text()
    def at(text):
        line = next(l for l in log.splitlines() if text in l)
        h, m, s = line.split()[1].split(":"); return int(h) * 3600 + int(m) * 60 + float(s.replace(",", "."))
    return at("network up") - at("building network"), at("all processes done") - at("launching")

def fidelity(d):
    topo = json.loads((d / "topology.json").read_text())
    df = parse_bwm_ng(d / "traces" / "bwm-ng.csv")
    out = {}
    for l in topo["links"]:
        if l["class"] != "uplink": continue
        intf = l["intf2"] if l["node2"].startswith("core") else l["intf1"]
        x = df[df["iface"] == intf].sort_values("time")
        x = x.assign(sec=(x["time"] // 0.5))
        per = x.groupby("sec")[["bytes_out", "bytes_in"]].sum().max(axis=1) * 8 / 0.5 / 1e6
        out[intf] = (round(per.max(), 1), l["shaped_mbps"])
    return out

tmp = Path(tempfile.mkdtemp(prefix="clf"))
with namespace_machines(tmp) as ns:
    for label, cluster in (("1 machine", None), ("2 machines", cluster_section(ns))):
        data = yaml.safe_load(open(ROOT / "experiments" / "quickstart.yaml")); data.pop("sweep")
        data["workload"].update(scheme="ps", iterations=20); data["run"]["runs_dir"] = str(tmp / "runs")
        if cluster: data["cluster"] = cluster
        p = tmp / f"s{len(label)}.yaml"; p.write_text(yaml.safe_dump(data))
        t = time.time(); r, = run_experiment(load_spec(p), progress=False); total = time.time() - t
        b, run = times(r.run_dir)
        extra = json.loads((r.run_dir / "cluster.json").read_text())["timings_s"] if cluster else {}
        print(label, r.summary["status"], f"total {total:.1f} s, build {b:.1f} s, launch+train {run:.1f} s", 
              {k: round(v, 2) for k, v in extra.items()},
              "core MB", round(r.summary["bytes"]["core"] / 1e6, 2), "samples/s", round(r.summary["throughput"]["mean"], 1),
              "uplink peak Mbit/s (0.5 s windows) vs shaped:", fidelity(r.run_dir))
