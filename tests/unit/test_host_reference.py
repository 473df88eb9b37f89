"""A host value stated nowhere is the reference profile's number, never borrowed time
(traffic.hostmodel: REFERENCE_PROFILE, HostSpec.resolve, HostSpec.pinned)."""

import pytest
import yaml

from testbed.spec import dump_spec, from_dict
from traffic.hostmodel import RATE_FIELDS, REFERENCE_PROFILE, HostSpec, available_host_profiles, load_host_profile

SI = {
    "message_overhead_us": ("message_overhead_s", 1e-6),
    "request_startup_ms": ("request_startup_s", 1e-3),
    "aggregate_gb_per_s": ("aggregate_bytes_per_s", 1e9),
    "optimizer_gb_per_s": ("optimizer_bytes_per_s", 1e9),
    "codec_gb_per_s": ("codec_bytes_per_s", 1e9),
}
RATES = ("aggregate_gb_per_s", "optimizer_gb_per_s", "codec_gb_per_s")


@pytest.fixture(scope="module")
def ref():
    return load_host_profile(REFERENCE_PROFILE)


def test_the_reference_profile_is_a_measurement_of_a_named_machine(ref):
    assert REFERENCE_PROFILE in available_host_profiles()
    for f in RATE_FIELDS:
        assert ref[f].value is not None, f
    for f in RATES:  # the three rates are the command's numbers, with its sources
        assert ref[f].value > 0 and "by `testbed profile --host`" in ref[f].source, f
    assert ref["message_overhead_us"].value == 0 and "108.4" in ref["message_overhead_us"].source
    assert ref["request_startup_ms"].value == 0 and "server software stack" in ref["request_startup_ms"].source
    for fact in (
        "AMD EPYC",
        "2 vCPUs",
        "GiB",
        "torch 2.13.0",
        "2026-11-26",
        "testbed profile --host traffic/hostmodel/data/reference.yaml --threads 1",
        "scale 1",
    ):
        assert fact in ref.description, fact


@pytest.mark.parametrize("host", [None, {}, {"profile": None}])
def test_a_spec_without_host_values_resolves_to_the_reference(ref, host):
    d = {} if host is None else {"host": host}
    m = from_dict(d).host.resolve()
    for f, (attr, unit) in SI.items():
        assert getattr(m, attr) == pytest.approx(ref[f].value * unit), f
        assert m.sources[f].startswith("reference measurement (profile reference"), f
        assert ref[f].source in m.sources[f]
    for f in RATES:  # never None: the "not modelled" path of HostCosts is not reached
        assert getattr(m, SI[f][0]) > 0


def test_a_null_in_a_profile_or_inline_is_the_reference(ref, tmp_path):
    prof = tmp_path / "mine.yaml"
    prof.write_text(
        "description: a test host\n"
        "message_overhead_us: {value: null, source: 'not given'}\n"
        "request_startup_ms: {value: 3, source: 'a paper'}\n"
        "aggregate_gb_per_s: {value: 2.5, source: 'a paper'}\n"
        "optimizer_gb_per_s: {value: null, source: 'the paper gives no figure'}\n"
        "codec_gb_per_s: {value: null, source: 'not used'}\n"
    )
    # an inline null states nothing: it neither overrides the profile's number nor means "not modelled"
    spec = HostSpec(profile=str(prof), aggregate_gb_per_s=None, codec_gb_per_s=None)
    m = spec.resolve()
    assert m.aggregate_bytes_per_s == 2.5e9 and "a paper" in m.sources["aggregate_gb_per_s"]
    assert m.optimizer_bytes_per_s == ref["optimizer_gb_per_s"].value * 1e9
    assert m.codec_bytes_per_s == ref["codec_gb_per_s"].value * 1e9
    assert m.message_overhead_s == 0 and m.request_startup_s == pytest.approx(3e-3)
    assert f"as the spec or profile {prof} states no value" in m.sources["optimizer_gb_per_s"]


def test_every_shipped_profile_states_a_number_for_every_value():
    for name in available_host_profiles():
        prof = load_host_profile(name)
        for f in RATE_FIELDS:
            assert prof[f].value is not None, (name, f)
            if name != REFERENCE_PROFILE and f in RATES:
                # a copy of the reference says so; anything else is a derivation from its paper
                copied = prof[f].value == load_host_profile(REFERENCE_PROFILE)[f].value
                assert ("reference measurement" if copied else "derivation") in prof[f].source.lower(), (name, f)
        m = HostSpec(profile=name).resolve()
        assert not any(s.startswith("reference measurement") for s in m.sources.values()), name


@pytest.mark.parametrize(
    "host",
    [
        {},
        {"profile": "mxnet_p3"},
        {"profile": "phub_pbox", "codec_gb_per_s": None},
        {"profile": "mxnet_kvstore_phub", "optimizer_gb_per_s": 3},
    ],
)
def test_pinned_writes_numbers_and_reads_back_the_same(host):
    exp = from_dict(
        {"topology": {"kind": "rack", "racks": 1, "hosts_per_rack": 2}, "workload": {"scheme": "ps"}, "host": host}
    )
    pinned = exp.host.pinned()
    assert all(pinned[f] is not None for f in RATE_FIELDS)
    dumped = yaml.safe_load(dump_spec(exp))["host"]
    assert dumped == pinned
    before, after = exp.host.resolve(), HostSpec(**dumped).resolve()
    for attr, _ in SI.values():
        assert getattr(after, attr) == getattr(before, attr), attr
    assert all(s == "spec" for s in after.sources.values())  # what the run used, written out


def test_the_phub_baseline_is_the_pbox_memory_ceiling():
    """MXNet's servers share the PBox's memory system (8 dual-rank DDR-2400 DIMMs on two
    Broadwell sockets): the same 120 GB/s ceiling and the same bytes per operation."""
    mx, pbox = load_host_profile("mxnet_kvstore_phub"), load_host_profile("phub_pbox")
    for f in ("aggregate_gb_per_s", "optimizer_gb_per_s"):
        assert mx[f].value == pbox[f].value
        assert "upper bound" in mx[f].source and "Derivation" in mx[f].source
    assert mx["aggregate_gb_per_s"].value == 120 / 12 * 4 and mx["optimizer_gb_per_s"].value == 120 / 20 * 4
