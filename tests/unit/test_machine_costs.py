"""The machine cost model's file (testbed.machine_costs): which file a run reads
(``TESTBED_MACHINE_COSTS``, the user's, the shipped one), the line saying it was measured on
another machine (``testbed run``, ``testbed check``), its record in a run's provenance, and
``testbed profile --machine`` (refusals, and the measurement it calls, replaced by a fake: no
network is built). No root needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from common.errors import CapacityError, MissingRequirement, TestbedError
from common.provenance import PROVENANCE_FILE, Provenance
from testbed import cli
from testbed.check import Item, cost_model_check, format_checks
from testbed.machine_costs import (
    COSTS_ENV,
    COSTS_PATH,
    STEP_NAMES,
    CostModel,
    Machine,
    check_target,
    costs_path,
    in_use,
    user_costs_path,
)
from tests.unit.test_cli import run_cli
from traffic import rundir

ROOT = Path(__file__).resolve().parents[2]

GIB = 2**30
HERE = Machine(cores=8, total_bytes=32 * GIB, available_bytes=30 * GIB, cpu="Test CPU 3000")
SAME = {"cores": 8, "cpu": "Test CPU 3000", "memory_total_bytes": 32 * GIB, "kernel": "6.1.0", "date": "today"}


def write_model(path: Path, machine: dict | None) -> Path:
    """The shipped cost model's values under ``machine`` (none: no machine section), at ``path``."""
    doc = yaml.safe_load(COSTS_PATH.read_text())
    doc.pop("machine")
    if machine is not None:
        doc["machine"] = machine
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture
def config(tmp_path, monkeypatch) -> Path:
    """An empty XDG configuration directory; no TESTBED_MACHINE_COSTS."""
    d = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(d))
    monkeypatch.delenv(COSTS_ENV, raising=False)
    return d


# ------------------------------------------------------------------------------ which file


def test_without_a_user_file_the_shipped_model_is_read(config):
    assert user_costs_path() == config / "dl-netbed" / "machine_costs.yaml"
    assert costs_path() == COSTS_PATH
    assert CostModel.load().path == str(COSTS_PATH)


def test_the_user_file_is_read_when_it_exists(config):
    user = write_model(config / "dl-netbed" / "machine_costs.yaml", SAME)
    assert costs_path() == user
    m = CostModel.load()
    assert m.path == str(user) and m.machine["cpu"] == "Test CPU 3000"


def test_the_environment_variable_comes_first(config, tmp_path, monkeypatch):
    write_model(config / "dl-netbed" / "machine_costs.yaml", SAME)
    named = write_model(tmp_path / "named.yaml", {**SAME, "cores": 3})
    monkeypatch.setenv(COSTS_ENV, str(named))
    assert costs_path() == user_costs_path() == named
    assert CostModel.load().machine["cores"] == 3
    # a path given to load still wins over every default
    assert CostModel.load(COSTS_PATH).path == str(COSTS_PATH)


def test_a_missing_file_named_by_the_environment_variable_is_an_error_not_a_fall_back(config, tmp_path, monkeypatch):
    monkeypatch.setenv(COSTS_ENV, str(tmp_path / "missing.yaml"))
    assert costs_path() == tmp_path / "missing.yaml"
    with pytest.raises(
        CapacityError,
        match=rf"missing\.yaml.*{COSTS_ENV} names it; measure this machine with "
        r"`testbed profile --machine`",
    ):
        CostModel.load()


@pytest.mark.parametrize("xdg", [None, "", "relative/dir"])
def test_without_an_absolute_xdg_config_home_the_user_file_is_under_home(xdg, tmp_path, monkeypatch):
    monkeypatch.delenv(COSTS_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    if xdg is None:
        monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    else:
        monkeypatch.setenv("XDG_CONFIG_HOME", xdg)
    assert user_costs_path() == tmp_path / ".config" / "dl-netbed" / "machine_costs.yaml"


# ------------------------------------------------------------------------------ another machine


@pytest.mark.parametrize(
    "change, phrase",
    [
        ({"cpu": "Other CPU 9000"}, "CPU Other CPU 9000 there, Test CPU 3000 here"),
        ({"cores": 64}, "64 cores there, 8 here"),
        ({"memory_total_bytes": 256 * GIB}, "256.0 GiB there, 32.0 GiB here"),
    ],
)
def test_a_model_measured_on_another_machine_says_so_in_one_line(change, phrase, tmp_path):
    m = CostModel.load(write_model(tmp_path / "m.yaml", {**SAME, **change}))
    line = m.measured_elsewhere(HERE)
    assert line == (
        f"the cost model {tmp_path / 'm.yaml'} was measured on another machine ({phrase}): its memory and "
        f"CPU estimates and scale: auto are approximate here; measure this machine with `testbed profile "
        f"--machine` (as root)"
    )
    assert "\n" not in line


@pytest.mark.parametrize(
    "machine",
    [
        SAME,
        {**SAME, "memory_total_bytes": int(32 * GIB * 0.95), "kernel": "another kernel", "date": "another day"},
        {"cores": 8},  # what the file does not record is not compared
        None,  # no machine section at all
    ],
)
def test_a_model_measured_on_this_machine_gives_no_line(machine, tmp_path):
    assert CostModel.load(write_model(tmp_path / "m.yaml", machine)).measured_elsewhere(HERE) is None


def test_the_shipped_model_is_named_so_when_it_is_another_machine_s():
    line = CostModel.load(COSTS_PATH).measured_elsewhere(Machine(64, 512 * GIB, 500 * GIB, "Other CPU 9000"))
    assert line.startswith(f"the cost model shipped with dl-netbed ({COSTS_PATH}) was measured on another machine")


def test_this_machine_matches_the_fields_a_measurement_records_of_it():
    here = Machine.current()
    assert here.cores >= 1 and here.total_bytes > 0 and here.cpu
    assert (
        CostModel(
            {}, {"cores": here.cores, "cpu": here.cpu, "memory_total_bytes": here.total_bytes}
        ).measured_elsewhere()
        is None
    )


def test_testbed_check_prints_the_line_and_stays_ready(config, tmp_path, monkeypatch):
    user = write_model(config / "dl-netbed" / "machine_costs.yaml", {**SAME, "cores": 64})
    item = cost_model_check(HERE)
    assert item.ok and item.name == "cost model" and "64 cores there, 8 here" in item.detail
    assert len(format_checks([item]).splitlines()) == 1
    assert (
        cost_model_check(Machine(64, 32 * GIB, 30 * GIB, "Test CPU 3000")).detail
        == f"{user} (measured on this machine)"
    )
    monkeypatch.setattr(cli, "run_checks", lambda: [Item("root", True, ""), cost_model_check(HERE)])
    rc, out, _ = run_cli("check")
    assert rc == 0 and out.count("testbed profile --machine") == 1 and "ready to run experiments" in out


def test_testbed_check_is_not_ready_with_an_unreadable_model(config, monkeypatch, tmp_path):
    monkeypatch.setenv(COSTS_ENV, str(tmp_path / "missing.yaml"))
    item = cost_model_check(HERE)
    assert not item.ok and "missing.yaml" in item.detail and item.remedy == "testbed profile --machine (as root)"
    monkeypatch.setattr(cli, "run_checks", lambda: [Item("root", True, ""), cost_model_check(HERE)])
    rc, out, _ = run_cli("check")
    assert rc == 1 and "cannot run experiments: missing cost model" in out


def test_testbed_run_prints_the_line_once_and_not_when_it_matches(config, tmp_path, monkeypatch):
    here = Machine.current()
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        yaml.safe_dump(
            {"topology": {"kind": "rack", "hosts_per_rack": 2}, "workload": {"scheme": "ps", "model": "digits_mlp"}}
        )
    )
    user = config / "dl-netbed" / "machine_costs.yaml"
    write_model(user, {"cores": here.cores + 62, "cpu": here.cpu, "memory_total_bytes": here.total_bytes})
    rc, out, _ = run_cli("run", "--dry-run", spec, "--runs-dir", tmp_path / "runs")
    lines = [line for line in out.splitlines() if "measured on another machine" in line]
    assert rc == 0 and len(lines) == 1
    assert lines[0].startswith(
        f"warning: capacity: the cost model {user} was measured on another machine "
        f"({here.cores + 62} cores there, {here.cores} here)"
    )
    assert lines[0].endswith("measure this machine with `testbed profile --machine` (as root)")
    write_model(user, {"cores": here.cores, "cpu": here.cpu, "memory_total_bytes": here.total_bytes})
    rc, out, _ = run_cli("run", "--dry-run", spec, "--runs-dir", tmp_path / "runs")
    assert rc == 0 and "another machine" not in out and "capacity: estimated memory" in out
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------------------ a run's record


def test_a_run_records_the_model_it_used_and_its_machine(config, tmp_path):
    assert in_use().path == str(COSTS_PATH)
    assert in_use().measured_on == yaml.safe_load(COSTS_PATH.read_text())["machine"]
    user = write_model(config / "dl-netbed" / "machine_costs.yaml", SAME)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    prov = rundir.write_provenance(run_dir, cost_model=in_use())
    doc = json.loads((run_dir / PROVENANCE_FILE).read_text())
    assert doc["cost_model"] == {"path": str(user), "measured_on": SAME}
    assert Provenance.model_validate(doc) == prov
    head = yaml.safe_load("\n".join(line[2:] for line in prov.comment().splitlines()))  # spec.yaml's head
    assert head["provenance"]["cost_model"]["path"] == str(user)
    user.write_text("not: [a cost model")
    assert in_use().path == str(user) and in_use().measured_on is None


def test_the_runner_records_it_before_anything_is_built(config, tmp_path, monkeypatch):
    import testbed.runner as runner
    from testbed.spec import from_dict

    class Stop(Exception):
        pass

    def stop(path, exp, provenance=None):
        raise Stop(provenance)

    monkeypatch.setattr(runner, "write_spec", stop)  # the run stops there: nothing is built
    exp = from_dict({"scale": 1, "topology": {"kind": "rack", "hosts_per_rack": 2}})
    with pytest.raises(Stop) as err:
        runner.run_one(exp, tmp_path / "runs", "r1")
    (prov,) = err.value.args
    assert prov.cost_model.path == str(COSTS_PATH) and prov.cost_model.measured_on["cores"] >= 1
    assert json.loads((tmp_path / "runs" / "r1" / PROVENANCE_FILE).read_text())["cost_model"]["path"] == str(COSTS_PATH)


# ------------------------------------------------------------------------------ testbed profile --machine


@pytest.fixture
def measured(monkeypatch) -> list[dict]:
    """The measurement replaced by a fake that records its calls and writes a file."""
    from testbed.machine_costs import measure as measure_module

    calls = []

    def fake(out, *, command, replace=False, **kw):
        calls.append({"out": Path(out), "command": command, "replace": replace, **kw})
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text("measured\n")
        return Path(out)

    monkeypatch.setattr(measure_module, "measure", fake)
    return calls


@pytest.fixture
def root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)


def test_profile_machine_writes_the_user_file_by_default(config, measured, root):
    rc, out, err = run_cli("profile", "--machine")
    user = config / "dl-netbed" / "machine_costs.yaml"
    assert rc == 0, err
    assert measured == [{"out": user, "command": f"testbed profile --machine {user}", "replace": False}]
    assert "testbed run and testbed check use it from now on" in out


def test_profile_machine_writes_the_file_given(config, measured, root, tmp_path):
    out_file = tmp_path / "new.yaml"
    rc, out, _ = run_cli("profile", "--machine", out_file)
    assert rc == 0 and [c["out"] for c in measured] == [out_file]
    assert f"{COSTS_ENV}={out_file}" in out  # how to use a file elsewhere


def test_profile_machine_writes_the_file_the_environment_names(config, measured, root, tmp_path, monkeypatch):
    monkeypatch.setenv(COSTS_ENV, str(tmp_path / "named.yaml"))
    assert run_cli("profile", "--machine")[0] == 0
    assert [c["out"] for c in measured] == [tmp_path / "named.yaml"]


def test_profile_machine_refuses_an_existing_file_unless_forced(config, measured, root, tmp_path):
    existing = tmp_path / "old.yaml"
    existing.write_text("earlier results\n")
    rc, _, err = run_cli("profile", "--machine", existing)
    assert rc == 2 and f"{existing} exists; earlier measurements are never overwritten" in err and "--force" in err
    assert measured == [] and existing.read_text() == "earlier results\n"
    rc, _, err = run_cli("profile", "--machine", existing, "--force")
    assert rc == 0, err
    assert measured[0]["out"] == existing and measured[0]["replace"] is True
    assert measured[0]["command"] == f"testbed profile --machine {existing} --force"


def test_profile_machine_refuses_without_root(config, measured, monkeypatch, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    rc, _, err = run_cli("profile", "--machine", tmp_path / "new.yaml")
    assert rc == 2 and "builds Mininet networks" in err and "run as root" in err
    assert measured == []


def test_profile_machine_options_that_do_not_go_together(config, measured, root, tmp_path):
    for argv, says in (
        (["profile", "--force"], "--force replaces an existing cost model: it goes with --machine"),
        (["profile", "--machine", "--host", tmp_path / "h.yaml"], "--host and --machine"),
        (["profile", "digits_mlp", "--batch", "8", "--machine"], "give no model or --batch"),
    ):
        rc, _, err = run_cli(*argv)
        assert rc == 2 and says in err, argv
    assert measured == []


# ------------------------------------------------------------------------------ the measurement's own refusals


def test_check_target_refusals(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    f = tmp_path / "m.yaml"
    check_target(f)
    with pytest.raises(TestbedError, match="does not exist"):
        check_target(f, merge=True)
    f.write_text("x")
    with pytest.raises(TestbedError, match="exists; earlier measurements are never overwritten"):
        check_target(f)
    check_target(f, replace=True)
    check_target(f, merge=True)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(MissingRequirement, match="run as root"):
        check_target(tmp_path / "other.yaml")
    check_target(tmp_path / "other.yaml", needs_root=False)


def test_measure_refuses_before_measuring(tmp_path, monkeypatch):
    from testbed.machine_costs.measure import STEPS, measure

    assert tuple(name for name, *_ in STEPS) == STEP_NAMES
    assert {name for name, _, root, _ in STEPS if root} == {"networks", "forwarding"}
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(TestbedError, match="unknown step 'bogus': one of base, loopback"):
        measure(tmp_path / "m.yaml", command="x", only=["bogus"])
    with pytest.raises(MissingRequirement):
        measure(tmp_path / "m.yaml", command="x")
    with pytest.raises(MissingRequirement):
        measure(write_model(tmp_path / "m.yaml", SAME), command="x", only=["networks"])
    with pytest.raises(TestbedError, match="exists"):
        measure(tmp_path / "m.yaml", command="x")


# ------------------------------------------------------------------------------ the benchmark script


def test_the_benchmark_script_still_parses_its_arguments(tmp_path):
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "machine_costs.py"), "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    for option in ("--only STEP", "--resume", "--quiet-flag", "--seconds", "--force"):
        assert option in r.stdout
    assert all(step in r.stdout for step in STEP_NAMES)
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "machine_costs.py"), "x.yaml", "--only", "bogus"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "invalid choice: 'bogus'" in r.stderr


def test_the_benchmark_script_refuses_an_existing_file_with_status_2(tmp_path):
    existing = tmp_path / "old.yaml"
    existing.write_text("earlier results\n")
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "machine_costs.py"), str(existing)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2 and "exists; earlier measurements are never overwritten" in r.stderr
    assert existing.read_text() == "earlier results\n"


def test_a_user_file_in_a_folder_this_process_may_not_search_counts_as_none(monkeypatch):
    import testbed.machine_costs as mc

    class Hidden(type(Path())):
        def is_file(self):
            raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(mc, "user_costs_path", lambda: Hidden("/root/.config/dl-netbed/machine_costs.yaml"))
    assert costs_path() == COSTS_PATH
