"""Spec validation: every malformed field is named with its value and what is allowed."""
import pytest
import yaml

from topologies.errors import SpecError
from testbed.spec import expand_sweep, from_dict, load_spec, parse_override


def test_defaults_are_valid():
    exp = from_dict({})
    assert exp.topology.kind == "rack_core" and exp.workload.scheme == "ps"


def test_quickstart_is_a_sweep_over_both_schemes():
    exp = load_spec("experiments/quickstart.yaml")
    points = expand_sweep(exp)
    assert [p for p, _ in points] == [{"workload.scheme": "ps"}, {"workload.scheme": "allreduce"}]
    assert all(e.sweep == {} for _, e in points)
    assert exp.topology.uplink_mbps() == 200.0  # 4 hosts x 100 Mbit/s / 2


@pytest.mark.parametrize("data, field, fragment", [
    ({"topology": {"host_bw_mbps": -5}}, "topology.host_bw_mbps", "> 0"),
    ({"topology": {"host_bw_mbps": "fast"}}, "topology.host_bw_mbps", "a number"),
    ({"topology": {"kind": "torus"}}, "topology.kind", "'rack', 'rack_core'"),
    ({"topology": {"oversubscription": 0.5}}, "topology.oversubscription", ">= 1"),
    ({"topology": {"racks": 3, "kind": "rack"}}, "topology.racks", "1 for topology.kind 'rack'"),
    ({"topology": {"bandwidth": 3}}, "topology.bandwidth", "host_bw_mbps"),
    ({"workload": {"scheme": "magic"}}, "workload.scheme", "allreduce"),
    ({"workload": {"model": "gpt9"}}, "workload.model", "digits_mlp"),
    ({"workload": {"iterations": 0}}, "workload.iterations", "> 0"),
    ({"workload": {"iterations": 5, "warmup_iterations": 5}}, "workload.warmup_iterations", "fewer than"),
    ({"workload": {"servers": {"placement": "somewhere"}}}, "workload.servers.placement", "dedicated"),
    ({"workload": {"options": {"nonsense": 1}}}, "workload.options.nonsense", "options of scheme"),
    ({"workload": {"save_params": "yes"}}, "workload.save_params", "true or false"),
    ({"capture": {"interval_ms": 0}}, "capture.interval_ms", "> 0"),
    ({"topology": 5}, "topology", "a mapping"),
    ({"sweep": {"workload.scheme": "ps"}}, "sweep.workload.scheme", "non-empty list"),
    ({"sweep": {"topology.host_bw_mbps": [100, -1]}}, "topology.host_bw_mbps", "> 0"),
])
def test_bad_fields_are_named(data, field, fragment):
    with pytest.raises(SpecError) as e:
        from_dict(data)
    assert e.value.field == field
    assert fragment in str(e.value)


def test_overrides_parse_yaml_values_and_apply():
    assert parse_override("topology.host_bw_mbps=50") == ("topology.host_bw_mbps", 50)
    exp = from_dict({}, ["workload.scheme=allreduce", "topology.delay_ms=0.5"])
    assert exp.workload.scheme == "allreduce" and exp.topology.delay_ms == 0.5
    with pytest.raises(SpecError, match="path.to.field=value"):
        from_dict({}, ["workload.iterations"])
    with pytest.raises(SpecError) as e:
        from_dict({}, ["workload.iterations=many"])
    assert e.value.field == "workload.iterations"


def test_sweep_is_the_cartesian_product(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({"sweep": {"workload.scheme": ["ps", "allreduce"],
                                           "topology.host_bw_mbps": [50, 100]}}))
    pts = expand_sweep(load_spec(p))
    assert len(pts) == 4
    assert {(e.workload.scheme, e.topology.host_bw_mbps) for _, e in pts} == {
        ("ps", 50), ("ps", 100), ("allreduce", 50), ("allreduce", 100)}


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(SpecError, match="existing YAML"):
        load_spec(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("topology: [unclosed")
    with pytest.raises(SpecError, match="valid YAML"):
        load_spec(bad)


def test_variants_combine_with_the_sweep():
    exp = from_dict({"variants": [{"name": "baseline", "workload.scheme": "ps", "workload.options.overlap": True},
                                  {"name": "p3", "workload.scheme": "p3"}],
                     "sweep": {"topology.host_bw_mbps": [50, 100]}})
    pts = expand_sweep(exp)
    assert [(p["variant"], e.workload.scheme, e.workload.options, e.topology.host_bw_mbps) for p, e in pts] == [
        ("baseline", "ps", {"overlap": True}, 50), ("baseline", "ps", {"overlap": True}, 100),
        ("p3", "p3", {}, 50), ("p3", "p3", {}, 100)]
    assert all(e.variants == [] and e.sweep == {} for _, e in pts)


@pytest.mark.parametrize("variants, field", [
    ([{"name": "x"}], "variants[0]"),
    (["ps"], "variants[0]"),
    ([{"workload.scheme": "nope"}], "workload.scheme"),
    ([{"workload.scheme": "ps", "workload.options.slice_params": 10}], "workload.options.slice_params"),
])
def test_bad_variants_are_named(variants, field):
    with pytest.raises(SpecError) as e:
        from_dict({"variants": variants})
    assert e.value.field == field


def test_every_bad_field_is_named_at_once():
    with pytest.raises(SpecError) as e:
        from_dict({"topology": {"host_bw_mbps": -1, "kind": "torus"},
                   "workload": {"iterations": "many", "options": {"nonsense": 1}},
                   "capture": {"bogus": True}})
    fields = [err.field for err in e.value.errors]
    assert fields == ["topology.kind", "topology.host_bw_mbps", "workload.iterations", "capture.bogus",
                      "workload.options.nonsense"]
    for f in fields:
        assert f"'{f}'" in str(e.value)


def test_yaml_exponent_is_a_number(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("topology: {host_bw_mbps: 1e4, kind: rack, racks: 1}\n")
    assert load_spec(p).topology.host_bw_mbps == 1e4
    assert parse_override("topology.host_bw_mbps=2.5E3") == ("topology.host_bw_mbps", 2500.0)


def test_an_override_of_a_swept_field_replaces_the_axis():
    exp = load_spec("experiments/quickstart.yaml", ["workload.scheme=allreduce"])
    assert exp.sweep == {} and exp.workload.scheme == "allreduce"
    assert len(expand_sweep(exp)) == 1


def test_cli_reports_three_wrong_fields_in_one_message_without_traceback(tmp_path):
    import subprocess
    import sys
    p = tmp_path / "bad.yaml"
    p.write_text("topology: {host_bw_mbps: -5}\nworkload: {iterations: 0, scheme: nope}\n")
    out = subprocess.run([sys.executable, "-m", "testbed.cli", "run", str(p)], capture_output=True, text=True)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr + out.stdout
    for f in ("topology.host_bw_mbps", "workload.iterations", "workload.scheme"):
        assert f in out.stderr
    assert not (tmp_path / "runs").exists() and not list(tmp_path.glob("runs*"))
