"""Schemes are plugins: registered by name, named as module:Class, or found as entry points."""

import importlib.metadata
import os
import textwrap
from pathlib import Path

import pytest
import torch

from common.errors import SpecError
from testbed.loopback import run_local
from testbed.spec import from_dict
from traffic import schemes
from traffic.rundir import read_json
from traffic.runtime.events import read_events
from traffic.schemes import Scheme, SchemeNotFound, register

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def test_register_names_the_class_and_get_finds_it():
    @register("test_only_scheme")
    class Mine(Scheme):
        pass

    assert Mine.name == "test_only_scheme"
    assert schemes.get("test_only_scheme") is Mine
    assert "test_only_scheme" in schemes.available()
    with pytest.raises(TypeError):
        register("x")(object)


def test_module_class_names_a_scheme_outside_the_repository(tmp_path, monkeypatch):
    (tmp_path / "plugmod.py").write_text(
        textwrap.dedent("""
        from traffic import schemes
        class MyRing(schemes.get("allreduce")):
            pass
        NotAScheme = int
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cls = schemes.get("plugmod:MyRing")
    assert issubclass(cls, schemes.get("allreduce"))
    with pytest.raises(SchemeNotFound, match="PYTHONPATH"):
        schemes.get("no_such_module_xyz:Thing")
    with pytest.raises(SchemeNotFound, match="no class"):
        schemes.get("plugmod:Missing")
    with pytest.raises(SchemeNotFound, match="not a subclass"):
        schemes.get("plugmod:NotAScheme")


def test_an_entry_point_of_an_installed_distribution_is_a_scheme(tmp_path, monkeypatch):
    (tmp_path / "eppkg.py").write_text("from traffic import schemes\nclass Ring(schemes.get('allreduce')):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = importlib.metadata.EntryPoint("my_ring", "eppkg:Ring", schemes.ENTRY_POINT_GROUP)
    monkeypatch.setattr(schemes, "_entry_points", lambda: {"my_ring": ep})
    assert schemes.get("my_ring").__name__ == "Ring"
    assert "my_ring" in schemes.available()
    exp = from_dict({"workload": {"scheme": "my_ring", "options": {"bucket_mb": 4}}})
    assert exp.workload.scheme == "my_ring"


def test_an_unknown_scheme_is_a_spec_error_naming_the_forms_allowed():
    with pytest.raises(SpecError) as e:
        from_dict({"workload": {"scheme": "nonexistent"}})
    assert e.value.field == "workload.scheme"
    assert "allreduce" in str(e.value) and "module:ClassName" in str(e.value)


def test_the_scheme_docs_show_the_example_scheme_verbatim():
    assert EXAMPLES.joinpath("mymod.py").read_text() in (ROOT / "docs" / "schemes.md").read_text()


def test_the_example_scheme_validates_its_own_options(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    with pytest.raises(SpecError) as e:
        from_dict({"workload": {"scheme": "mymod:MyAllreduce", "options": {"clip_norm": -1}}})
    assert e.value.field == "workload.options.clip_norm"
    ok = from_dict({"workload": {"scheme": "mymod:MyAllreduce", "options": {"clip_norm": 0.5, "bucket_mb": 1}}})
    assert schemes.get(ok.workload.scheme).options_of(ok.workload).clip_norm == 0.5


def test_the_example_scheme_trains_on_loopback(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    exp = from_dict(
        {
            "topology": {"racks": 1, "kind": "rack", "hosts_per_rack": 3},
            "workload": {
                "scheme": "mymod:MyAllreduce",
                "iterations": 4,
                "warmup_iterations": 1,
                "save_params": True,
                "options": {"clip_norm": 0.01},
            },
            "run": {"runs_dir": str(tmp_path), "timeout_s": 120},
        }
    )
    pythonpath = os.pathsep.join([str(EXAMPLES), os.environ.get("PYTHONPATH", "")])
    run = run_local(exp, tmp_path / "run", env={"PYTHONPATH": pythonpath})
    procs = read_json(run / "processes.json")["processes"]
    assert [p["role"] for p in procs] == ["worker"] * 3 and [p["rack"] for p in procs] == [0, 0, 0]
    clips = [e for e in read_events(run / "events" / "worker0.jsonl") if e["kind"] == "clip"]
    assert len(clips) == 4 and all(c["norm"] > 0 for c in clips)
    states = [torch.load(run / "params" / f"worker{i}.pt") for i in range(3)]
    for k in states[0]:  # every worker applied the same clipped update
        assert all(torch.equal(states[0][k], s[k]) for s in states[1:])
