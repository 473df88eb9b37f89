"""Spec validation: every malformed field is named with its value and what is allowed."""

from pathlib import Path

import pytest
import yaml

from common import validation
from common.errors import SpecError
from testbed.spec import expand_sweep, from_dict, load_spec, parse_override

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_are_valid():
    exp = from_dict({})
    assert exp.topology.kind == "rack_core" and exp.workload.scheme == "ps"


def test_quickstart_is_a_sweep_over_both_schemes():
    exp = load_spec("experiments/quickstart.yaml")
    points = expand_sweep(exp)
    assert [p for p, _ in points] == [{"workload.scheme": "ps"}, {"workload.scheme": "allreduce"}]
    assert all(e.sweep == {} for _, e in points)
    assert exp.topology.uplink_mbps() == 200.0  # 4 hosts x 100 Mbit/s / 2


@pytest.mark.parametrize(
    "data, field, fragment",
    [
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
    ],
)
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
    p.write_text(
        yaml.safe_dump({"sweep": {"workload.scheme": ["ps", "allreduce"], "topology.host_bw_mbps": [50, 100]}})
    )
    pts = expand_sweep(load_spec(p))
    assert len(pts) == 4
    assert {(e.workload.scheme, e.topology.host_bw_mbps) for _, e in pts} == {
        ("ps", 50),
        ("ps", 100),
        ("allreduce", 50),
        ("allreduce", 100),
    }


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(SpecError, match="existing YAML"):
        load_spec(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("topology: [unclosed")
    with pytest.raises(SpecError, match="valid YAML"):
        load_spec(bad)


def test_variants_combine_with_the_sweep():
    exp = from_dict(
        {
            "variants": [
                {"name": "baseline", "workload.scheme": "ps", "workload.options.overlap": True},
                {"name": "p3", "workload.scheme": "p3"},
            ],
            "sweep": {"topology.host_bw_mbps": [50, 100]},
        }
    )
    pts = expand_sweep(exp)
    assert [(p["variant"], e.workload.scheme, e.workload.options, e.topology.host_bw_mbps) for p, e in pts] == [
        ("baseline", "ps", {"overlap": True}, 50),
        ("baseline", "ps", {"overlap": True}, 100),
        ("p3", "p3", {}, 50),
        ("p3", "p3", {}, 100),
    ]
    assert all(e.variants == [] and e.sweep == {} for _, e in pts)


@pytest.mark.parametrize(
    "variants, field",
    [
        ([{"name": "x"}], "variants[0]"),
        (["ps"], "variants[0]"),
        ([{"workload.scheme": "nope"}], "workload.scheme"),
        ([{"workload.scheme": "ps", "workload.options.slice_params": 10}], "workload.options.slice_params"),
    ],
)
def test_bad_variants_are_named(variants, field):
    with pytest.raises(SpecError) as e:
        from_dict({"variants": variants})
    assert e.value.field == field


def test_every_bad_field_is_named_at_once():
    with pytest.raises(SpecError) as e:
        from_dict(
            {
                "topology": {"host_bw_mbps": -1, "kind": "torus"},
                "workload": {"iterations": "many", "options": {"nonsense": 1}},
                "capture": {"bogus": True},
            }
        )
    fields = [err.field for err in e.value.errors]
    assert fields == [
        "topology.kind",
        "topology.host_bw_mbps",
        "workload.iterations",
        "capture.bogus",
        "workload.options.nonsense",
    ]
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


# ---------------------------------------------------------------- numbers as YAML 1.2 reads them, on every path


def test_1e12_is_a_number_in_a_file_an_override_a_sweep_a_variant_and_a_runs_spec(tmp_path):
    from traffic import rundir

    p = tmp_path / "s.yaml"
    p.write_text(
        "topology: {host_bw_mbps: 1e12}\nsweep: {topology.delay_ms: [1e-1, 2E0]}\n"
        "variants: [{name: big, host.aggregate_gb_per_s: 1e3}]\n"
    )
    exp = load_spec(p)
    assert exp.topology.host_bw_mbps == 1e12
    assert [(e.topology.delay_ms, e.host.aggregate_gb_per_s) for _, e in expand_sweep(exp)] == [(0.1, 1e3), (2.0, 1e3)]
    assert load_spec(p, ["topology.host_bw_mbps=1e9"]).topology.host_bw_mbps == 1e9
    assert from_dict({}, ["topology.host_bw_mbps=1e12"]).topology.host_bw_mbps == 1e12
    run = rundir.create(tmp_path, "r")
    (run / "spec.yaml").write_text("topology: {host_bw_mbps: 1e12}\n")
    assert rundir.read_spec(run)["topology"]["host_bw_mbps"] == 1e12


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("topology: {racks: 1" + "0" * 5000 + "}\n", "a value its type cannot hold"),
        ("workload: {seed: 2001-13-01}\n", "a value its type cannot hold"),
        ("a: " + "[" * 40 + "]" * 40 + "\n", "nested at most 32 levels"),
        ("[" * 1000 + "]" * 1000, "valid YAML"),
        ("a: " + "[" * 100_000 + "]" * 100_000, "nested"),  # libyaml's composer would crash on it: never given it
        ("a: &a [*a]\n", "recursive YAML anchors"),
    ],
)
def test_yaml_the_loader_cannot_hold_is_a_spec_error(tmp_path, text, fragment):
    p = tmp_path / "s.yaml"
    p.write_text(text)
    with pytest.raises(SpecError) as e:
        load_spec(p)
    assert e.value.field == "<file>" and fragment in str(e.value)
    with pytest.raises(SpecError) as e:
        from_dict({}, [f"workload.options={text}"])
    assert e.value.field == "--set"


SHIPPED_YAML = [
    *sorted((ROOT / "experiments").glob("*.yaml")),
    ROOT / "analysis" / "data" / "reproduction.yaml",
    *sorted((ROOT / "reproduction" / "runs").glob("*/*/spec.yaml")),
]


@pytest.mark.skipif(validation._CLoader is None, reason="PyYAML was built without libyaml")
def test_libyaml_and_the_pure_python_parser_read_the_same_documents():
    """The loader reads with libyaml's parser, 5-8x faster, and falls back to
    PyYAML's own on any error (whose wording it keeps): both give the same data for every
    shipped experiment, the catalogue and every archived run's spec."""
    assert len(SHIPPED_YAML) > 100
    for path in SHIPPED_YAML:
        text = path.read_text()
        fast = validation._read_with_libyaml(text, str(path), "")
        assert fast is not validation._UNREAD, path
        assert fast == validation._read_with_python(text, str(path), ""), path


def test_inf_and_nan_are_not_numbers_of_a_spec():
    for v in (float("inf"), float("nan")):
        with pytest.raises(SpecError) as e:
            from_dict({"topology": {"oversubscription": v}})
        assert e.value.field == "topology.oversubscription" and "a finite number" in str(e.value)


def test_a_huge_value_is_shown_short_in_the_message():
    big = list(range(100000))
    with pytest.raises(SpecError) as e:
        from_dict({"topology": {"kind": big}})
    assert e.value.value == big and len(str(e.value)) < 400


# ---------------------------------------------------------------- names that become paths


EVIL_NAMES = [
    "../../etc/evil",
    "/abs",
    "a/b",
    "..",
    ".",
    ".hidden",
    "x\x00y",
    "line\nbreak",
    "",
    "-rf",
    "a b",
    "é",
    "x" * 101,
    "a..b",
    "x\n",
]


@pytest.mark.parametrize("name", EVIL_NAMES)
@pytest.mark.parametrize(
    "where, field",
    [
        (lambda n: {"name": n}, "name"),
        (lambda n: {"run": {"id": n}}, "run.id"),
        (
            lambda n: {"background": [{"src": "h1", "dst": "h2", "rate_mbps": 1, "duration_s": 1, "name": n}]},
            "background[0].name",
        ),
    ],
)
def test_a_name_that_is_not_safe_in_a_path_is_refused(name, where, field):
    with pytest.raises(SpecError) as e:
        from_dict(where(name))
    assert e.value.field == field
    assert "letters, digits, '_', '-' and '.'" in str(e.value) and "no '/'" in str(e.value)


@pytest.mark.parametrize("name", ["quick", "a.b-c_1", "_x", "X" * 100, "9.x-"])
def test_safe_names_are_accepted(name):
    assert from_dict({"name": name, "run": {"id": name}}).name == name


@pytest.mark.parametrize("name", EVIL_NAMES + ["x:y", "a+/b", "(x)"])
def test_a_variant_label_that_is_not_safe_is_refused(name):
    with pytest.raises(SpecError) as e:
        from_dict({"variants": [{"name": name, "workload.scheme": "ps"}]})
    assert e.value.field == "variants[0].name" and "no '/'" in str(e.value)


def test_variant_labels_may_have_the_papers_plus_and_map_to_a_safe_directory():
    from testbed.runner import _safe, point_label

    exp = from_dict(
        {
            "variants": [
                {"name": "D-Sync+T", "workload.scheme": "allreduce"},
                {"name": "Pipe-SGD+Q", "workload.scheme": "pipe_sgd"},
            ]
        }
    )
    labels = [point_label(p) for p, _ in expand_sweep(exp)]
    assert [lab.split("_")[0] for lab in labels] == ["D-Sync+T", "Pipe-SGD+Q"]
    assert _safe(labels[0]).startswith("D-Sync-T_scheme=allreduce")


def test_a_spec_file_name_that_is_not_safe_becomes_the_name_made_safe(tmp_path):
    for fname, name in [
        ("my spec.yaml", "my-spec"),
        (".hidden.yaml", "hidden"),
        ("-x.yaml", "x"),
        ("a..b.yaml", "a.b"),
        ("é.yaml", "experiment"),
    ]:
        (tmp_path / fname).write_text("{}")
        assert load_spec(tmp_path / fname).name == name


@pytest.mark.parametrize("run_id", ["../../etc/evil", "/abs", "a/b", "..", ".", "", "x\x00"])
def test_a_run_directory_is_never_made_outside_the_runs_directory(tmp_path, run_id):
    from common.errors import TestbedError
    from traffic import rundir

    runs = tmp_path / "deep" / "runs"
    with pytest.raises(TestbedError, match="runs directory"):
        rundir.create(runs, run_id)
    assert list(tmp_path.rglob("*")) == []  # not even the runs directory was made


def test_a_symlink_in_the_runs_directory_cannot_lead_a_run_outside(tmp_path):
    from common.errors import TestbedError
    from traffic import rundir

    runs, outside = tmp_path / "runs", tmp_path / "outside"
    runs.mkdir()
    outside.mkdir()
    (runs / "x").symlink_to(outside / "x")  # dangling: mkdir would not follow it, resolve does
    with pytest.raises(TestbedError, match="outside the runs directory"):
        rundir.create(runs, "x", exclusive_id=False)
    assert list(outside.iterdir()) == []
    assert rundir.create(runs, "y").parent == runs


# ---------------------------------------------------------------- defaults that agree


def test_kind_rack_without_racks_is_one_rack():
    t = from_dict({"topology": {"kind": "rack", "hosts_per_rack": 4}}).topology
    assert (t.kind, t.racks) == ("rack", 1)
    # one rack with a link delay: valid (whether netem is there is the machine check's business)
    assert from_dict({"topology": {"kind": "rack", "hosts_per_rack": 4, "delay_ms": 1}}).topology.racks == 1
    assert from_dict({}).topology.racks == 2 and from_dict({"topology": {"kind": "rack_core"}}).topology.racks == 2
    with pytest.raises(SpecError) as e:  # what the user wrote still contradicts
        from_dict({"topology": {"kind": "rack", "racks": 2}})
    assert e.value.field == "topology.racks"
    # a sweep over the kind: each point takes its kind's default
    exp = from_dict({"topology": {"hosts_per_rack": 2}, "sweep": {"topology.kind": ["rack", "rack_core"]}})
    assert [(e.topology.kind, e.topology.racks) for _, e in expand_sweep(exp)] == [("rack", 1), ("rack_core", 2)]


def test_warmup_left_out_is_shorter_than_a_short_run():
    assert [from_dict({"workload": {"iterations": n}}).workload.warmup_iterations for n in (1, 3, 6, 100)] == [
        0,
        2,
        5,
        5,
    ]
    with pytest.raises(SpecError) as e:  # written by the user: still refused
        from_dict({"workload": {"iterations": 3, "warmup_iterations": 5}})
    assert e.value.field == "workload.warmup_iterations"
    # spec.yaml holds the value used, and reads back to it
    exp = from_dict({"workload": {"iterations": 3}})
    assert from_dict(exp.to_dict()).workload.warmup_iterations == 2


# ---------------------------------------------------------------- sweep and variant axes


@pytest.mark.parametrize(
    "data, field, fragment",
    [
        ({"sweep": 5}, "sweep", "a mapping"),
        ({"sweep": {"workload.seed": []}}, "sweep.workload.seed", "non-empty list"),
        ({"sweep": {"variants": [[{"workload.seed": 1}]]}}, "sweep.variants", "outside 'sweep' and 'variants'"),
        ({"sweep": {"workload..seed": [1]}}, "workload..seed", "no empty part"),
        (
            {"sweep": {"workload.seed": list(range(40)), "topology.delay_ms": list(range(30))}},
            "sweep",
            "at most 1000 runs",
        ),
        ({"variants": {"a": 1}}, "variants", "a list"),
        ({"variants": [{1: 2}]}, "variants[0]", "dotted field paths"),
        (
            {"variants": [{"name": "a", "workload.seed": 1}, {"name": "a", "workload.seed": 2}]},
            "variants[1].name",
            "no other variant",
        ),
        ({"variants": [{"name": 5, "workload.seed": 1}]}, "variants[0].name", "letters, digits"),
    ],
)
def test_bad_axes_are_named(data, field, fragment):
    with pytest.raises(SpecError) as e:
        from_dict(data)
    assert e.value.field == field and fragment in str(e.value)


@pytest.mark.parametrize(
    "override, field",
    [
        ("workload..iterations=3", "workload..iterations"),
        ("name.x=3", "name.x"),
        ("topology.kind.x=3", "topology.kind.x"),
        ("workload.scheme=:ps", "workload.scheme"),
        ("workload.scheme=..:ps", "workload.scheme"),
    ],
)
def test_bad_override_paths_and_values_are_named(override, field):
    with pytest.raises(SpecError) as e:
        from_dict({"name": "a", "topology": {"kind": "rack"}}, [override])
    assert e.value.field == field
