"""A researcher's own program (workload.program): its spec, its plan and
torchrun environment, the iteration marks, and a plain DDP script run unmodified on loopback
(no root). The run on the emulated network is in test_program_e2e.py (slow, root)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from common.errors import SpecError
from testbed import launch
from testbed.loopback import run_local
from testbed.runner import plan_point
from testbed.spec import from_dict, load_spec
from traffic.runtime.events import read_events
from traffic.schemes.program import torchrun_env

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "ddp_digits.py"


def program(**kw) -> dict:
    return {"command": ["python", str(EXAMPLE), "--epochs", "1"], **kw}


def test_a_program_runs_instead_of_a_scheme():
    exp = from_dict({"workload": {"program": program()}})
    assert exp.workload.scheme == "program" and exp.workload.program.command[0] == "python"


@pytest.mark.parametrize(
    "workload, field, allowed",
    [
        ({"scheme": "ps", "program": program()}, "workload.scheme", "left out, or 'program'"),
        ({"scheme": "program"}, "workload.program", "a program (command, ...)"),
        ({"program": program(), "compute": {"mode": "emulated"}}, "workload.compute.mode", "'real' with"),
        ({"program": {"command": ["no-such-program-x"]}}, "workload.program.command", "not on PATH"),
        ({"program": {"command": ["python", "missing.py"]}}, "workload.program.command", "no missing.py under"),
        ({"program": program(cwd="/no/such/folder")}, "workload.program.cwd", "an existing folder"),
        ({"program": {"command": []}}, "workload.program.command", "at least 1"),
        ({"program": program(processes_per_host=0)}, "workload.program.processes_per_host", ">= 1"),
    ],
)
def test_a_bad_program_is_refused_naming_the_field(workload, field, allowed):
    with pytest.raises(SpecError) as err:
        from_dict({"workload": workload})
    assert any(e.field == field and allowed in e.allowed for e in err.value.errors), err.value


def test_cwd_is_relative_to_the_spec_files_folder(tmp_path):
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "train.py").write_text("print('hi')\n")
    spec = tmp_path / "exp.yaml"
    spec.write_text("workload: {program: {command: [python, train.py], cwd: proj}}\n")
    assert load_spec(spec).workload.program.cwd == str(tmp_path / "proj")
    spec.write_text("workload: {program: {command: [python, proj/train.py]}}\n")  # left out: the file's folder
    assert load_spec(spec).workload.program.cwd == str(tmp_path)


def test_plan_and_torchrun_environment():
    exp = from_dict(
        {
            "topology": {"kind": "rack_core", "racks": 2, "hosts_per_rack": 2},
            "workload": {"program": program(processes_per_host=2, env={"OMP_NUM_THREADS": "2"})},
        }
    )
    hosts, procs = plan_point(exp)
    assert [(p.name, p.host) for p in procs] == [
        ("worker0", "h1"),
        ("worker1", "h1"),
        ("worker2", "h2"),
        ("worker3", "h2"),
        ("worker4", "h3"),
        ("worker5", "h3"),
        ("worker6", "h4"),
        ("worker7", "h4"),
    ]
    entries = [
        {
            "name": p.name,
            "role": p.role,
            "index": p.index,
            "host": p.host,
            "ip": f"10.0.0.{i // 2 + 1}",
            "iface": f"{p.host}-eth0",
        }
        for i, p in enumerate(procs)
    ]
    doc = {
        "world_size": 8,
        "master_addr": "10.0.0.1",
        "master_port": 29500,
        "processes": [{**e, "rank": r} for r, e in enumerate(entries)],
    }
    info = doc["processes"][5]
    env = launch.program_env(info, doc, Path("/r"), exp.workload.program)
    assert {
        k: env[k]
        for k in (
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
            "GROUP_RANK",
            "MASTER_ADDR",
            "MASTER_PORT",
            "GLOO_SOCKET_IFNAME",
        )
    } == {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "2",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "GLOO_SOCKET_IFNAME": "h3-eth0",
    }
    assert env["OMP_NUM_THREADS"] == "2"  # the program's env comes last
    assert env["TESTBED_EVENTS"] == "/r/events/worker5.jsonl" and str(ROOT) in env["PYTHONPATH"]
    assert torchrun_env(info, doc, 2)["GROUP_WORLD_SIZE"] == "4"
    assert launch.program_entry(exp.workload.program)["command"][0] == sys.executable


def test_marks_write_iteration_events_only_under_the_testbed(tmp_path):
    script = (
        "from traffic import marks\n"
        "for i in range(3):\n"
        "    with marks.iteration(i, samples=32) as ev:\n"
        "        ev['loss'] = 1.0 / (i + 1)\n"
        "marks.event('eval', accuracy=0.5)\n"
    )
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, cwd=tmp_path)
    assert list(tmp_path.iterdir()) == []  # outside the testbed: nothing written
    events = tmp_path / "events" / "worker3.jsonl"
    subprocess.run(
        [sys.executable, "-c", script],
        check=True,
        cwd=tmp_path,
        env={**env, "TESTBED_EVENTS": str(events), "TESTBED_PROC": "worker3", "RANK": "3"},
    )
    ev = read_events(events)
    assert [(e["kind"], e["iteration"], e.get("samples")) for e in ev] == [
        ("iteration", 0, 32),
        ("iteration", 1, 32),
        ("iteration", 2, 32),
        ("eval", None, None),
    ]
    assert ev[1]["loss"] == 0.5 and {e["proc"] for e in ev} == {"worker3"} and ev[0]["rank"] == 3


def test_a_plain_ddp_script_runs_unmodified_on_loopback(tmp_path):
    exp = from_dict(
        {"topology": {"kind": "rack", "hosts_per_rack": 2}, "workload": {"program": program(processes_per_host=2)}}
    )
    run_dir = run_local(exp, tmp_path / "run", timeout_s=180)
    logs = [(run_dir / "logs" / f"worker{i}.log").read_text() for i in range(4)]
    assert all(f"rank {i}: 14 steps" in log for i, log in enumerate(logs)), logs  # 1797 samples / 4 / 32
    its = [
        e for i in range(4) for e in read_events(run_dir / "events" / f"worker{i}.jsonl") if e["kind"] == "iteration"
    ]
    assert len(its) == 4 * 14  # the example marks its iterations
    procs = json.loads((run_dir / "processes.json").read_text())["processes"]
    assert {p["cwd"] for p in procs} == {str(Path.cwd())} and procs[0]["command"][1] == str(EXAMPLE)


def test_a_crashing_program_fails_the_run_with_its_log(tmp_path):
    (tmp_path / "bad.py").write_text(
        "import os, sys\nprint('about to fail', flush=True)\nsys.exit(3 if os.environ['RANK'] == '1' else 0)\n"
    )
    exp = from_dict(
        {
            "topology": {"kind": "rack", "hosts_per_rack": 2},
            "workload": {"program": {"command": ["python", "bad.py"], "cwd": str(tmp_path)}},
        }
    )
    from common.errors import RunFailed

    with pytest.raises(RunFailed, match="about to fail"):
        run_local(exp, tmp_path / "run", timeout_s=60)
