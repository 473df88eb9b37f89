"""Capture on real interfaces: bwm-ng's counters against a known amount of traffic.

These cases read a recorded capture (tests/data/bwm-ng-veth.csv) and run the samplers on the
loopback interface; the cases that build namespaces and send known traffic are
tests/e2e/test_capture_netns.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


import testbed.capture.bwmng as bwmng  # noqa: E402
from analysis.traces import parse_bwm_ng, rates  # noqa: E402
from common.errors import MissingRequirement, TestbedError  # noqa: E402
from testbed.capture import Capture, CpuSampler, QdiscSampler, SampledCsv, bwm_ng_command, find_bwm_ng  # noqa: E402
from testbed.capture.cpu import PROCESSES_PER_SAMPLE  # noqa: E402
from testbed.capture.periodic import Periodic as _Periodic  # noqa: E402
from testbed.spec import CaptureSpec  # noqa: E402

DATA = Path(__file__).parents[1] / "data"

ETH_IP_UDP = 14 + 20 + 8  # bytes of headers per datagram as counted by a veth


def _sh(*cmd, check=True):
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def _bwm_ng_pids() -> set[int]:
    out = _sh("pgrep", "-x", "bwm-ng", check=False).stdout.split()
    return {int(p) for p in out}


def test_fixture_is_real_bwm_ng_and_counts_match():
    """tests/data/bwm-ng-veth.csv: a real capture of 200 x 1000 B (a->b) and 50 x 500 B (b->a)."""
    df = parse_bwm_ng(DATA / "bwm-ng-veth.csv")
    assert set(df["iface"]) == {"tbx0a", "tbx0b"}  # the 'total' lines are gone
    tot = df.groupby("iface")[["bytes_in", "bytes_out", "packets_in", "packets_out"]].sum()
    # switch-port view: a's port receives a's datagrams and sends b's
    assert tot.loc["tbx0a", "bytes_in"] == 200 * (1000 + ETH_IP_UDP)
    assert tot.loc["tbx0a", "packets_in"] == 200
    assert tot.loc["tbx0a", "bytes_out"] == 50 * (500 + ETH_IP_UDP)
    assert tot.loc["tbx0b", "bytes_out"] == 200 * (1000 + ETH_IP_UDP)
    assert tot.loc["tbx0b", "bytes_in"] == 50 * (500 + ETH_IP_UDP)
    # per-interval deltas, not cumulative: no line holds (nearly) the whole total
    assert df["bytes_in"].max() < 0.5 * tot["bytes_in"].max()
    # timestamps have sub-millisecond resolution and ~10 ms spacing
    gaps = df[df["iface"] == "tbx0a"]["time"].diff().dropna()
    assert 0.009 < gaps.median() < 0.02


def test_bwm_ng_rate_columns_are_quantized_but_ours_are_not():
    df = parse_bwm_ng(DATA / "bwm-ng-veth.csv", keep_rates=True)
    a = df[df["iface"] == "tbx0a"].sort_values("time").reset_index(drop=True)
    dt = a["time"].diff()
    busy = a[(a["bytes_in"] > 0) & dt.notna()]
    # bwm-ng's rate is bytes * 1000 / int(ms): a multiple of bytes*1000/k for an integer k
    k = busy["bytes_in"] * 1000 / busy["bytes_in_s"]
    assert ((k - k.round()).abs() < 1e-6).all()
    r = rates(df)
    r = r[(r["iface"] == "tbx0a") & (r["rx_bytes"] > 0)]
    assert (r["rx_bps"] - 8 * r["rx_bytes"] / r["dt_s"]).abs().max() < 1e-6
    # ours differ from bwm-ng's whenever the interval is not a whole number of ms
    merged = r.merge(df[["time", "iface", "bytes_in_s"]], on=["time", "iface"])
    assert (merged["rx_bps"] - 8 * merged["bytes_in_s"]).abs().max() > 0


def test_parser_tolerates_truncated_last_line_and_old_format(tmp_path):
    lines = (DATA / "bwm-ng-veth.csv").read_text().splitlines(keepends=True)
    p = tmp_path / "t.csv"
    p.write_text("".join(lines[:30]) + lines[30][:25])  # killed mid-line
    full = parse_bwm_ng(p)
    assert len(full) == sum(1 for l in lines[:30] if ";total;" not in l)
    old = tmp_path / "old.csv"  # bwm-ng 0.6.1: 16 fields, no bits columns
    old.write_text(
        "1.5;eth0;10.00;20.00;30.00;2;1;1.00;1.00;2.00;1;1;0.00;0.00;0;0\n"
        "1.5;total;10.00;20.00;30.00;2;1;1.00;1.00;2.00;1;1;0.00;0.00;0;0\ngarbage\n"
        "1.6;eth0;x;y;z;bad;bad;0;0;0;0;0;0;0;0;0\n"
    )
    o = parse_bwm_ng(old)
    assert list(o["bytes_in"]) == [2] and list(o["bytes_out"]) == [1]
    assert parse_bwm_ng(tmp_path / "missing.csv").empty


def test_bwm_ng_command_restricts_to_ports():
    cmd = bwm_ng_command(["s1-eth1", "s1-eth2"], 10, "/x/bwm-ng.csv")
    assert cmd[cmd.index("-I") + 1] == "s1-eth1,s1-eth2"
    assert cmd[cmd.index("-a") + 1] == "0"  # without -a 0, -I does not restrict the output
    assert cmd[cmd.index("-T") + 1] == "rate" and cmd[cmd.index("-t") + 1] == "10"


def test_missing_bwm_ng_raises_with_remedy(monkeypatch):
    monkeypatch.setattr(bwmng.shutil, "which", lambda name: None)
    monkeypatch.setattr(bwmng.os, "access", lambda *a: False)
    with pytest.raises(MissingRequirement, match="apt-get install bwm-ng"):
        find_bwm_ng()
    with pytest.raises(MissingRequirement):
        Capture("/nonexistent", ["lo"]).start()


def test_sampler_thread_never_piles_up_and_records_real_times():
    """A step slower than the period (25 ms vs 10 ms) runs on the next free slot of the
    grid: one step every 30 ms, never a burst of catch-up steps."""
    times, errors = [], []

    def slow_step():
        times.append(time.monotonic())
        time.sleep(0.025)

    t = _Periodic("slow", 0.010, slow_step, errors)
    t.start()
    time.sleep(0.32)
    t.stop_event.set()
    t.join(2)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert errors == [] and 6 <= len(times) <= 12
    assert min(gaps) >= 0.025  # no burst after an overrun
    assert t.overruns >= len(times) - 2 and t.steps == len(times)


def test_sampler_that_cannot_start_is_recorded_not_raised():
    errors, exited = [], []

    def boom():
        raise OSError("no netlink")

    t = _Periodic("qdisc", 0.01, lambda: None, errors, on_start=boom, on_exit=lambda: exited.append(1))
    t.start()
    t.join(2)
    assert not t.is_alive() and exited == [1] and t.steps == 0
    assert errors == ["capture-qdisc: could not start: no netlink"]
    with pytest.raises(TestbedError, match="before open"):
        QdiscSampler({1: "lo"}).read()


def test_unknown_port_is_an_error(tmp_path):
    if shutil.which("bwm-ng") is None:
        pytest.skip("bwm-ng not installed")
    with pytest.raises(TestbedError, match="tbx-no-such"):
        Capture(tmp_path, ["lo", "tbx-no-such"]).start()
    assert not (tmp_path / "traces" / "bwm-ng.csv").exists()


def test_cpu_sampler_reports_cores_named_processes_with_descendants_and_itself():
    """A process is reported from its second sample on, with the CPU of its descendants (the
    spinning Python is the child of the named ``sh``)."""
    spin = subprocess.Popen(["sh", "-c", f"{sys.executable} -c 'while True: pass' & wait"], start_new_session=True)
    sampler = CpuSampler(lambda: {"spin": spin.pid, "not yet": None})
    try:
        with pytest.raises(TestbedError, match="before open"):
            sampler.read()
        time.sleep(0.3)  # the child runs
        with sampler:
            time.sleep(0.2)
            first = sampler.read()
            time.sleep(0.3)
            second = sampler.read()
    finally:
        os.killpg(spin.pid, signal.SIGKILL)
        spin.wait()
    for rows in (first, second):
        assert {r[1] for r in rows if r[0] == "core"} >= set(range(os.cpu_count()))
        assert all(0 <= r[2] <= 100 for r in rows if r[0] == "core")
        assert ("proc", "harness") in {r[:2] for r in rows}
        assert all(0 <= r[2] <= 100 * os.cpu_count() for r in rows)
    assert "spin" not in {r[1] for r in first}  # its first sample is the baseline
    (spun,) = [r[2] for r in second if r[:2] == ("proc", "spin")]
    assert spun > 20  # a busy loop in a child: a good part of a core even on a loaded machine
    assert "not yet" not in {r[1] for r in first + second}
    assert CpuSampler.csv_row(("core", 0, 12.3456)) == ("core", 0, "12.35")
    with pytest.raises(TestbedError, match="before open"):
        sampler.read()  # closed


def test_cpu_sampler_reads_many_processes_every_few_periods_and_cores_every_period():
    """32 processes: process rows every ceil(32 / 16) = 2 samples, cores and the harness every sample."""
    sleepers = [subprocess.Popen(["sleep", "60"]) for _ in range(2 * PROCESSES_PER_SAMPLE)]
    try:
        with CpuSampler(lambda: {f"p{i}": p.pid for i, p in enumerate(sleepers)}) as sampler:
            samples = []
            for _ in range(6):
                time.sleep(0.1)  # the default period: 10 ticks, so every core's /proc times move forward
                samples.append(sampler.read())
    finally:
        for p in sleepers:
            p.kill()
            p.wait()
    procs = [sum(r[0] == "proc" and r[1] != "harness" for r in rows) for rows in samples]
    assert procs == [0, 32, 0, 32, 0, 32]  # the first read takes the baselines
    assert all({r[1] for r in rows if r[0] == "core"} >= set(range(os.cpu_count())) for rows in samples)
    assert all(("proc", "harness") in {r[:2] for r in rows} for rows in samples[1:])


def test_a_core_whose_times_have_not_moved_gets_no_row_and_its_next_row_covers_both_periods(monkeypatch):
    """/proc/stat counts in 10 ms ticks per field, so over a short period a core can show no
    progress: that core gets no row (not a made-up 0 or 100 %), and its next row covers both periods."""
    cputimes = type(psutil.cpu_times())  # psutil's named tuple of this platform's fields

    def times(busy, idle):
        return cputimes(**{f: 0.0 for f in cputimes._fields} | {"user": busy, "idle": idle})

    readings = iter(
        [
            [times(1.0, 1.0), times(1.0, 1.0)],  # baselines
            [times(1.5, 1.5), times(1.0, 1.0)],  # core 1 has not moved
            [times(2.0, 2.0), times(1.9, 1.1)],  # core 1: 0.9 s busy, 0.1 s idle since its baseline
        ]
    )
    monkeypatch.setattr("testbed.capture.cpu.psutil.cpu_times", lambda percpu: next(readings))
    with CpuSampler(dict) as sampler:
        first = [r for r in sampler.read() if r[0] == "core"]
        second = [r for r in sampler.read() if r[0] == "core"]
    assert first == [("core", 0, 50.0)]
    assert [r[:2] for r in second] == [("core", 0), ("core", 1)]
    assert second[0][2] == pytest.approx(50.0) and second[1][2] == pytest.approx(90.0)


def test_failing_recorder_start_stops_the_recorders_started_before_it(tmp_path, monkeypatch):
    if shutil.which("bwm-ng") is None:
        pytest.skip("bwm-ng not installed")
    started, real_start = [], SampledCsv.start

    def start(self):
        if self.name == "cpu":
            raise RuntimeError("cpu sampler cannot start")
        started.append(real_start(self))
        return self

    monkeypatch.setattr(SampledCsv, "start", start)
    cap = Capture(tmp_path, ["lo"], qdisc_ifaces=["lo"], spec=CaptureSpec(interval_ms=10, qdisc_interval_ms=10))
    with pytest.raises(RuntimeError, match="cpu sampler cannot start"):
        cap.start()
    assert cap.bwm is not None and cap.bwm.poll() is not None  # bwm-ng ran and was stopped
    assert cap.bwm.pid not in _bwm_ng_pids()
    assert [s.name for s in started] == ["qdisc"] and not started[0].thread.is_alive()
    assert not [t for t in cap._threads if t.is_alive()]
    assert cap.errors == []
    cap.stop()  # idempotent
    assert (tmp_path / "traces" / "qdisc.csv").read_text().startswith("time,iface,qdisc")
