"""Build and launch time of a run on one machine and on two "machines" (network namespaces
with their own sshd, tests/e2e/test_cluster_machines.py), and whether the same bytes cross the core: the
quickstart's ps point, 20 iterations, run one after the other:

    sudo .venv/bin/python benchmarks/cluster_build.py

The namespaces share one kernel and two cores, so the figures bound the SSH and tunnel costs
of the control path; they are not a real cluster's."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from testbed.runner import run_experiment  # noqa: E402
from testbed.spec import load_spec  # noqa: E402
from tests.e2e.test_cluster_machines import cluster_section, namespace_machines  # noqa: E402


def logged_at(run_dir: Path, text: str) -> float:
    """Unix time of the first harness-log line containing ``text``."""
    for line in (run_dir / "logs" / "harness.log").read_text().splitlines():
        if text in line:
            return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    raise ValueError(f"no {text!r} in the harness log of {run_dir}")


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="clbuild"))
    with namespace_machines(tmp) as ns:
        for label, cluster in (("1 machine", None), ("2 machines", cluster_section(ns))):
            data = yaml.safe_load((ROOT / "experiments" / "quickstart.yaml").read_text())
            del data["sweep"]
            data["workload"].update(scheme="ps", iterations=20)
            data["run"]["runs_dir"] = str(tmp / "runs")
            if cluster:
                data["cluster"] = cluster
            spec = tmp / f"{label.replace(' ', '_')}.yaml"
            spec.write_text(yaml.safe_dump(data))
            t0 = time.time()
            (res,) = run_experiment(load_spec(spec), progress=False)
            total = time.time() - t0
            d = res.run_dir
            build = logged_at(d, "network up") - logged_at(d, "building network")
            timings = json.loads((d / "cluster.json").read_text())["timings_s"] if cluster else {}
            extra = "".join(f", {k} {v:.2f} s" for k, v in timings.items() if k != "build")
            print(
                f"{label}: {res.summary.status}, run {total:.1f} s, build {build:.1f} s{extra}, "
                f"core {res.summary.bytes.core / 1e6:.2f} MB, "
                f"{res.summary.throughput.mean:.1f} samples/s"
            )


if __name__ == "__main__":
    main()
