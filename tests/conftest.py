"""Shared test helpers: one factory of the small loopback experiments the scheme tests run; every
test reads the shipped machine cost model."""

from __future__ import annotations

import pytest
import torch

from testbed.spec import Experiment, from_dict

#: the optimizer of the equivalence tests (momentum and weight decay exercise the state)
OPTIMIZER = {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-4}


def experiment(
    scheme: str, *, racks: int = 1, hosts_per_rack: int = 4, timeout_s: float = 120, **workload
) -> Experiment:
    """A validated experiment of ``scheme`` for the loopback tests: ``racks`` racks of
    ``hosts_per_rack`` hosts (``kind: rack`` for one rack), the ``workload`` fields given
    over these defaults: one warm-up iteration, evaluation every 2 iterations, parameters
    saved, seed 3, :data:`OPTIMIZER`."""
    topology = (
        {"kind": "rack", "racks": 1, "hosts_per_rack": hosts_per_rack}
        if racks == 1
        else {"kind": "rack_core", "racks": racks, "hosts_per_rack": hosts_per_rack}
    )
    w = {
        "scheme": scheme,
        "warmup_iterations": 1,
        "eval_every": 2,
        "save_params": True,
        "seed": 3,
        "optimizer": OPTIMIZER,
        **workload,
    }
    return from_dict({"topology": topology, "workload": w, "run": {"timeout_s": timeout_s}})


@pytest.fixture(autouse=True)
def _shipped_cost_model(monkeypatch, tmp_path_factory):
    """Every test, and every command it starts, reads the machine cost model shipped with the
    package (testbed.machine_costs.costs_path), never one of the user's: no
    ``TESTBED_MACHINE_COSTS``, and a configuration directory without one."""
    monkeypatch.delenv("TESTBED_MACHINE_COSTS", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.getbasetemp() / "no-config"))


@pytest.fixture
def make_experiment():
    """The factory :func:`experiment`, for tests that take it as a fixture."""
    return experiment


def assert_server_shards_match(run_dir, ref: dict, servers: int) -> None:
    """The servers' saved shards (``params/server<s>.pt``, keys ``name[lo:hi]``) reassemble
    into the reference parameters ``ref`` (every element covered, equal within tolerance)."""
    flat = {k: torch.full((v.numel(),), float("nan")) for k, v in ref.items()}
    for s in range(servers):
        for name, val in torch.load(run_dir / "params" / f"server{s}.pt").items():
            key, rng = name[:-1].split("[")
            lo, hi = map(int, rng.split(":"))
            flat[key][lo:hi] = val
    for k in ref:
        torch.testing.assert_close(flat[k], ref[k].reshape(-1), rtol=1e-4, atol=1e-5, msg=f"server shards of {k}")
