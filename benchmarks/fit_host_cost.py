"""Benchmark: fit the cost model's ``path_cpu_s_per_byte_per_host`` to finished runs.

``path_cpu_s_per_byte`` is measured with one flow between two namespaces at 1-6 Gbit/s
(``testbed profile --machine``, step ``forwarding``). With many hosts sending at once at
their dilated rates each byte costs more: every host's sockets, qdiscs and processes'
buffers share the caches. :func:`testbed.capacity.estimate` charges that as
``path_cpu_s_per_byte_per_host`` (cpu-s per byte per sending host, optional in the cost
model). This benchmark fits it to runs of this machine.

For every finished run (``status: ok``) under the given directories:

* *measured*: busy cores of the whole machine over the measured iterations
  (``capacity_vs_runs.measured_busy_cores``: ``traces/cpu.csv`` in real time);
* the model's estimate for the run's spec at its own ``scale``, without the per-host term:
  its fixed part ``F`` (waiting processes, capture; dilation does not reduce it) and its
  network part at scale 1 ``N`` (bytes and messages);
* ``D``: what the per-host term adds at scale 1 per cpu-s/byte/host of it (bytes per second
  sent at scale 1 x hosts sending; the estimate's own arithmetic, read by evaluating it with
  the term at 1e-12);
* the residual ``R = (measured - F) x scale - N``: the network's CPU at scale 1 that the
  model without the term misses.

and prints the least-squares fit through the origin, ``k = sum(D R) / sum(D^2)``, with each
run's own ``R / D`` and the ratio measured / estimate without and with the fitted term, then
the YAML entry for ``testbed/data/machine_costs.yaml`` (or the user's cost model). A fit is
only as good as its runs: give runs whose network part is large (a run at the dilation
``scale: auto`` picks), of several host counts. Benchmarks print, they do not assert.

    .venv/bin/python benchmarks/fit_host_cost.py RUNS_DIR [RUNS_DIR ...]
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import yaml  # noqa: E402
from capacity_vs_runs import finished_runs  # noqa: E402

from testbed.capacity import Cost, CostModel, Machine, estimate  # noqa: E402
from testbed.machine_costs import OPTIONAL_KEYS  # noqa: E402
from testbed.runner import plan_point  # noqa: E402

KEY = "path_cpu_s_per_byte_per_host"
PROBE = 1e-12


def with_key(model: CostModel, value: float) -> CostModel:
    """``model`` with ``KEY`` set to ``value`` (cpu-s/byte/host)."""
    costs = dict(model.costs)
    costs[KEY] = Cost(value, OPTIONAL_KEYS[KEY][0], "fit_host_cost.py")
    return CostModel(costs, model.machine, model.path)


def fit_through_origin(points: list[tuple[float, float]]) -> float:
    """Least squares ``r = k d`` over ``(d, r)`` points: ``sum(d r) / sum(d^2)``.

    Raises:
        ValueError: no point with ``d != 0``.
    """
    dd = sum(d * d for d, _ in points)
    if dd == 0:
        raise ValueError("no run sends anything: nothing to fit")
    return sum(d * r for d, r in points) / dd


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("roots", nargs="+", type=Path, help="directories holding run directories")
    a = ap.parse_args(argv)
    model = CostModel.load()
    without = with_key(model, 0.0)
    probe = with_key(model, PROBE)
    machine = Machine.current()
    rows = []
    for d, _, exp, meas in finished_runs(a.roots):
        if exp.workload.compute.mode != "emulated":
            continue  # real compute's CPU is not in the model
        hosts, procs = plan_point(exp)
        e0 = estimate(exp, hosts, procs, model=without, machine=machine)
        e1 = estimate(exp, hosts, procs, model=probe, machine=machine)
        dk = (e1.network_cores_at_scale_1 - e0.network_cores_at_scale_1) / PROBE
        r = (meas[0] - e0.fixed_cores) * e0.scale - e0.network_cores_at_scale_1
        rows.append((d, exp, e0, dk, r, meas[0]))
    if not rows:
        print("no finished emulated-compute run with a CPU trace under " + ", ".join(map(str, a.roots)))
        return 1
    k = fit_through_origin([(dk, r) for *_, dk, r, _ in rows])
    print(f"cost model {model.path}; machine {machine.cores} cores")
    print(
        f"{'run':58s} {'hosts':>5s} {'scale':>5s} {'meas':>5s} {'F':>5s} {'N':>7s} {'R':>7s} {'R/D':>9s} "
        f"{'m/est':>5s} {'m/fit':>5s}"
    )
    for d, _exp, e0, dk, r, busy in rows:
        fitted = e0.fixed_cores + (e0.network_cores_at_scale_1 + k * dk) / e0.scale
        print(
            f"{d.name[:58]:58s} {e0.hosts:5d} {e0.scale:5g} {busy:5.2f} {e0.fixed_cores:5.2f} "
            f"{e0.network_cores_at_scale_1:7.2f} {r:7.2f} {r / dk if dk else float('nan'):9.3g} "
            f"{busy / e0.cpu_cores:5.2f} {busy / fitted:5.2f}"
        )
    names = ", ".join(f"{d.name} ({e0.hosts} hosts, scale {e0.scale:g})" for d, _, e0, *_ in rows)
    source = (
        f"python benchmarks/fit_host_cost.py [least squares through the origin of (busy cores - fixed part) x "
        f"scale - network part at scale 1 against bytes/s sent at scale 1 x hosts sending, over {len(rows)} "
        f"runs: {names}; busy cores over the measured iterations from traces/cpu.csv] on "
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; machine: {machine.cores} cores"
    )
    print(f"\nfit: {KEY} = {k:.4g} cpu-s/byte/host ({len(rows)} runs)\n")
    print(
        yaml.safe_dump(
            {KEY: {"value": float(k), "unit": OPTIONAL_KEYS[KEY][0], "source": source}}, sort_keys=False, width=120
        ),
        end="",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
