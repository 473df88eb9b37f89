"""A host profile of this machine (traffic.hostmodel.measure, ``testbed profile --host``)."""

from functools import partial

import pytest
import torch
import yaml

import traffic.hostmodel.measure as measure
from common.errors import TestbedError
from testbed.cli import main as cli_main
from traffic.hostmodel import RATE_FIELDS, load_host_profile
from traffic.hostmodel.measure import measure_host_profile, write_host_profile

QUICK = dict(repeats=3, round_trips=20)


@pytest.fixture(scope="module")
def quick_profile():
    return measure_host_profile(**QUICK)


def test_measured_profile_loads_with_every_rate_positive(quick_profile, tmp_path):
    threads = torch.get_num_threads()
    out = write_host_profile(quick_profile, tmp_path / "here.yaml")
    assert torch.get_num_threads() == threads  # the measurement's thread count is restored
    text = out.read_text()
    assert text.startswith("# Host profile of this machine")
    prof = load_host_profile(str(out))
    measured = [f for f in RATE_FIELDS if f != "request_startup_ms"]
    for f in measured:
        assert prof[f].value is not None and prof[f].value > 0, f
        assert prof[f].source.startswith("measured on ") and "by `testbed profile --host`" in prof[f].source
        assert "1 threads" in prof[f].source
    assert "median of 3" in prof["aggregate_gb_per_s"].source
    assert "median of 20 round trips" in prof["message_overhead_us"].source
    assert "Truncation" in prof["codec_gb_per_s"].source
    assert prof["request_startup_ms"].value is None and "server software stack" in prof["request_startup_ms"].source
    # the file holds exactly the dict measured (values and sources)
    assert yaml.safe_load(text) == quick_profile


def test_write_never_overwrites_and_rejects_a_bad_profile(quick_profile, tmp_path):
    out = tmp_path / "p.yaml"
    out.write_text("keep")
    with pytest.raises(TestbedError, match="exists"):
        write_host_profile(quick_profile, out)
    assert out.read_text() == "keep"
    bad = {**quick_profile, "aggregate_gb_per_s": {"value": -1.0, "source": "x"}}
    with pytest.raises(TestbedError, match="aggregate_gb_per_s"):
        write_host_profile(bad, tmp_path / "bad.yaml")
    assert not (tmp_path / "bad.yaml").exists()


@pytest.mark.parametrize("kw", [{"threads": 0}, {"repeats": 0}, {"round_trips": 0}, {"sizes": (1 << 20,)}])
def test_bad_arguments_are_refused_before_measuring(kw):
    with pytest.raises(TestbedError):
        measure_host_profile(**{**QUICK, **kw})


def test_cli_profile_host_writes_and_refuses_to_overwrite(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(measure, "measure_host_profile", partial(measure.measure_host_profile, **QUICK))
    out = tmp_path / "host.yaml"
    assert cli_main(["profile", "--host", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    before = out.read_text()
    assert load_host_profile(str(out))["optimizer_gb_per_s"].value > 0
    assert cli_main(["profile", "--host", str(out)]) == 2
    assert "exists" in capsys.readouterr().err
    assert out.read_text() == before
    # --host measures the machine, not a model; a model profile still needs a model and --batch
    assert cli_main(["profile", "digits_mlp", "--host", str(tmp_path / "other.yaml")]) == 2
    assert "not a model" in capsys.readouterr().err
    assert cli_main(["profile"]) == 2
    assert "needs a model and --batch" in capsys.readouterr().err
    assert not (tmp_path / "other.yaml").exists()
