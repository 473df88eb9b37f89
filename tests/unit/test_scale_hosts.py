"""benchmarks/scale_hosts.py's rows, computed from a synthetic run directory with known
answers (nothing is run), and its spec file at other sizes."""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

import pytest
import yaml

from common.errors import SpecError
from tests.unit.test_analysis import bwm_line, topology
from traffic.summary import RunSummary

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import scale_hosts  # noqa: E402

B = 1_700_000_000.0  # the run's wall clock starts near here
WORKERS = {"worker0": "h1", "worker1": "h2", "worker2": "h3", "worker3": "h4"}
GIB, MIB = 2**30, 2**20


def stamp(t: float) -> str:
    """A harness.log line's time (logging's asctime, local time)."""
    return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S,%f")[:23]


def synthetic_run(root: Path, scheme: str = "allreduce", status: str = "ok") -> Path:
    """4 workers at scale 2, host links at 1000 Mbit/s; iteration 0 (warm-up) and 1, each
    with two allreduce buckets of 4 + 1 MB per worker over 0.15 s of wall clock (0.075
    emulated s), each worker sending 250 kB per 10 ms bwm-ng sample over the 30 samples of an
    iteration; the network built in 2.5 s, every process ready 3 s and the first iteration
    5.005 s after the launch."""
    d = root / f"run-{scheme}-{status}"
    for sub in ("events", "results", "logs", "traces"):
        (d / sub).mkdir(parents=True)
    (d / "spec.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "scale_vgg19-4",
                "scale": 2,
                "topology": {"kind": "rack_core", "racks": 2, "hosts_per_rack": 2, "host_bw_mbps": 1000},
                "workload": {
                    "scheme": scheme,
                    "model": "vgg19",
                    "iterations": 2,
                    "warmup_iterations": 1,
                    "compute": {"mode": "emulated", "profile": "gtx1080ti", "memory": "light"},
                },
            }
        )
    )
    (d / "topology.json").write_text(json.dumps(topology(host_bw=1000.0)))
    (d / "processes.json").write_text(
        json.dumps(
            {
                "world_size": 4,
                "processes": [
                    {"name": n, "role": "worker", "index": i, "rank": i, "host": h}
                    for i, (n, h) in enumerate(WORKERS.items())
                ],
            }
        )
    )
    (d / "logs" / "harness.log").write_text(
        "".join(
            f"{stamp(B + t)} INFO {what}\n"
            for t, what in (
                (90.0, "building network"),
                (92.5, "network up in 2.5 s"),
                (95.0, "launching 4 processes"),
                (103.0, "all processes done after 13.0 s"),
                (104.0, "torn down in 1.0 s"),
            )
        )
    )
    for w, (name, _) in enumerate(WORKERS.items()):
        ev = [
            {
                "proc": name,
                "role": "worker",
                "rank": w,
                "thread": "main",
                "kind": "init",
                "ts": B + 96.0,
                "dur": 2.0,
                "world_size": 4,
            }
        ]
        for it in (0, 1):
            s = B + 100.005 + it
            base = {"proc": name, "role": "worker", "rank": w, "iteration": it, "layer": None}
            ev += [
                {**base, "thread": "main", "kind": "iteration", "ts": s, "dur": 0.3, "samples": 32},
                {**base, "thread": "comm", "kind": "allreduce", "ts": s + 0.1, "dur": 0.08, "bytes": 4_000_000},
                {
                    **base,
                    "thread": "comm",
                    "kind": "allreduce",
                    "ts": s + 0.18,
                    "dur": 0.07 if w == 3 else 0.05,
                    "bytes": 1_000_000,
                },
            ]
        (d / "events" / f"{name}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in ev))
    host_ports = ["tor1-eth1", "tor1-eth2", "tor2-eth1", "tor2-eth2"]
    (d / "traces" / "bwm-ng.csv").write_text(
        "".join(bwm_line(B + 99.0 + 0.01 * k, port, 250_000, 250_000) for k in range(301) for port in host_ports)
    )
    RunSummary.model_validate(
        {
            "status": status,
            "scale": 2.0,
            "fidelity": {"cpu_starved": False, "idle_pct_mean": 52.4},
            "memory": {
                "machine_growth_bytes": 3 * GIB,
                "process_uss_peak_bytes": {"median": 100 * MIB, "max": 120 * MIB, "sum": 430 * MIB, "processes": 4},
            },
        }
    ).write(d)
    return d


def test_the_row_of_a_run_directory(tmp_path):
    r = scale_hosts.row(synthetic_run(tmp_path))
    assert {k: r[k] for k in ("hosts", "scale", "status", "starved")} == {
        "hosts": 4,
        "scale": 2.0,
        "status": "ok",
        "starved": False,
    }
    assert r["idle%"] == pytest.approx(52.4)
    # the capacity model's idle for the run's own spec at its scale, as `testbed run --dry-run` gives it
    exp = scale_hosts.load_spec(tmp_path / "run-allreduce-ok" / "spec.yaml")
    est = scale_hosts.capacity.estimate(exp, *scale_hosts.plan_point(exp))
    assert r["model idle%"] == pytest.approx(100 * (1 - est.cpu_cores / est.cores)) and 0 < r["model idle%"] < 100
    assert (r["build s"], r["ready s"], r["1st iter s"]) == pytest.approx((2.5, 3.0, 5.005), abs=2e-3)
    assert (r["mem +GiB"], r["USS med MiB"], r["USS max MiB"]) == pytest.approx((3.0, 100.0, 120.0))
    # 30 samples x 250 kB in the one measured iteration; ring: 2 x 3/4 x 5 MB
    assert (r["sent MB"], r["ring MB"], r["sent/ring"]) == pytest.approx((7.5, 7.5, 1.0))
    # bound 7.5 MB x 8 / 1 Gbit/s = 0.06 s over 0.15 s of wall clock / scale 2
    assert r["ring fid"] == pytest.approx(0.8, rel=1e-4)  # times near 1.7e9 s: ~0.2 us of float resolution
    text = scale_hosts.table([r])
    assert text.splitlines()[0].split()[:3] == ["hosts", "scale", "status"] and "0.800" in text


def test_runs_are_reported_without_running_and_the_exit_status_says_how_they_ended(tmp_path, capsys):
    ok, failed = synthetic_run(tmp_path), synthetic_run(tmp_path, status="failed")
    assert scale_hosts.main(["--runs", str(ok)]) == 0
    assert "0.800" in capsys.readouterr().out
    assert scale_hosts.main(["--runs", str(ok), str(failed)]) == 1
    assert scale_hosts.main(["--runs", str(synthetic_run(tmp_path, scheme="ps"))]) == 2
    assert "scheme 'ps'" in capsys.readouterr().err
    assert scale_hosts.main(["--runs", str(tmp_path / "missing")]) == 2


def test_the_spec_exists_once_and_the_sizes_change_its_racks():
    exp = scale_hosts.experiment(64, iterations=3, warmup=1)
    assert (exp.topology.racks, exp.topology.hosts_per_rack, exp.workload.iterations) == (4, 16, 3)
    assert (exp.workload.scheme, exp.workload.model, exp.workload.compute.memory) == ("allreduce", "vgg19", "light")
    assert exp.capture.qdisc is False and exp.scale == "auto" and exp.topology.host_bw_mbps == 1000
    with pytest.raises(SpecError, match="multiple of 16"):
        scale_hosts.experiment(40, iterations=2, warmup=1)
    with pytest.raises(SystemExit):
        scale_hosts.main(["--sizes", "32,lots"])
