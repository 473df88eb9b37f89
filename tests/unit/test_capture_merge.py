"""Cluster capture: merging machines' traces on the controller's clock
(:mod:`testbed.capture.merge`) and the per-machine capture agent (:mod:`testbed.capture.agent`).

The merge tests use tests/data/bwm-ng-veth.csv (a real bwm-ng 0.6.3 capture) as the
controller's part and a copy with renamed interfaces and shifted times as a remote
machine's part: after the merge the remote lines must carry the original time strings again.

The live agent test makes a veth pair ``tbag0``/``tbag1`` in the root namespace (no
namespaces, no Mininet), sends raw Ethernet frames of known size into ``tbag1`` so that
``tbag0`` receives them, and deletes the pair in the fixture's teardown.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import testbed.capture.agent as agent  # noqa: E402
from analysis.traces import CPU_COLUMNS, QDISC_COLUMNS, parse_bwm_ng, read_table  # noqa: E402
from testbed.capture.agent import RuntimePids, runtime_pids  # noqa: E402
from testbed.capture.merge import TracePart, merge_traces  # noqa: E402

DATA = Path(__file__).parents[1] / "data"
FIXTURE = DATA / "bwm-ng-veth.csv"
RENAME = {"tbx0a": "tor2-eth1", "tbx0b": "tor2-eth2"}


def _us(t: str) -> int:
    whole, _, frac = t.partition(".")
    return int(whole) * 1_000_000 + int(frac.ljust(6, "0"))


def _fmt(us: int) -> str:
    return f"{us // 1_000_000}.{us % 1_000_000:06d}"


def _remote_copy(offset_us: int, fields: int = 21) -> list[str]:
    """The fixture's lines as a remote machine would have written them: interfaces renamed,
    times on a clock ``offset_us`` ahead, only the first ``fields`` fields."""
    out = []
    for line in FIXTURE.read_text().splitlines():
        f = line.split(";")
        f[0] = _fmt(_us(f[0]) + offset_us)
        f[1] = RENAME.get(f[1], f[1])
        out.append(";".join(f[:fields]))
    return out


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# ----------------------------------------------------------------------------- merge: bwm-ng


def test_bwm_ng_merge_corrects_times_drops_totals_and_keeps_bytes(tmp_path):
    offset_us = 250_123_457  # the remote clock is 250.123457 s ahead of the controller's
    remote = _remote_copy(offset_us)
    # a malformed line, a line of 20 fields, a non-number, then a line cut mid-write
    garbage = ["garbage", remote[0].rsplit(";", 1)[0], remote[3].replace(";0;", ";x;", 1)]
    _write(tmp_path / "b" / "bwm-ng.csv", "\n".join(remote[:5] + garbage + remote[5:]) + "\n" + remote[0][:40])
    ctl = tmp_path / "a"
    _write(ctl / "bwm-ng.csv", FIXTURE.read_text())

    got = merge_traces(
        tmp_path / "out", [TracePart(None, ctl, 0.0), TracePart("10.0.0.2", tmp_path / "b", offset_us / 1e6)]
    )

    fixture = FIXTURE.read_text().splitlines()
    per_iface = [ln for ln in fixture if ln.split(";")[1] != "total"]
    assert len(per_iface) < len(fixture)  # the fixture has total lines to drop
    merged = (tmp_path / "out" / "bwm-ng.csv").read_text().splitlines()
    assert got == {"bwm-ng.csv": 2 * len(per_iface)} and len(merged) == 2 * len(per_iface)
    # the controller's lines unchanged, the remote's back on the original time strings
    renamed = [";".join([f[0], RENAME[f[1]], *f[2:]]) for f in (ln.split(";") for ln in per_iface)]
    assert sorted(merged) == sorted(per_iface + renamed)
    assert [_us(ln.split(";")[0]) for ln in merged] == sorted(_us(ln.split(";")[0]) for ln in merged)
    assert all(len(ln.split(";")) == 21 and ln.split(";")[1] != "total" for ln in merged)
    # equal times: the controller's line first (parts' order), then the remote copy
    first = per_iface[0]
    assert merged[:2] == [first, renamed[0]]

    df = parse_bwm_ng(tmp_path / "out" / "bwm-ng.csv")
    ref = parse_bwm_ng(FIXTURE)
    counters = ["bytes_in", "bytes_out", "packets_in", "packets_out"]
    want = ref.groupby("iface")[counters].sum()
    sums = df.groupby("iface")[counters].sum()
    assert set(sums.index) == {"tbx0a", "tbx0b", "tor2-eth1", "tor2-eth2"}
    for iface, remote_iface in RENAME.items():
        assert sums.loc[iface].tolist() == want.loc[iface].tolist()
        assert sums.loc[remote_iface].tolist() == want.loc[iface].tolist()
    assert want.loc["tbx0b", "bytes_out"] == 200 * 1042  # the fixture's known traffic
    r = df[df["iface"] == "tor2-eth1"]["time"].to_numpy()
    assert r.tolist() == ref[ref["iface"] == "tbx0a"]["time"].tolist()


def test_bwm_ng_offsets_are_subtracted_to_the_microsecond(tmp_path):
    rest = ";" + ";".join(["0.00", "0.00", "0.00", "1", "2"] + ["0"] * 14)
    _write(tmp_path / "a" / "bwm-ng.csv", f"100.000100;eth-a{rest}\n100.000100;total{rest}\n100.010200;eth-a{rest}\n")
    _write(tmp_path / "b" / "bwm-ng.csv", f"100.255000;eth-b{rest}\n100.262000;eth-b{rest}\n")
    _write(tmp_path / "c" / "bwm-ng.csv", f"99.9999995;eth-c{rest}\n")  # 7 decimals: rounded half up
    merge_traces(
        tmp_path / "out",
        [
            TracePart(None, tmp_path / "a", 0.0),
            TracePart("m2", tmp_path / "b", 0.25),
            TracePart("m3", tmp_path / "c", -0.004),
        ],
    )
    lines = (tmp_path / "out" / "bwm-ng.csv").read_text().splitlines()
    assert [ln.split(";", 2)[:2] for ln in lines] == [
        ["100.000100", "eth-a"],
        ["100.004000", "eth-c"],
        ["100.005000", "eth-b"],
        ["100.010200", "eth-a"],
        ["100.012000", "eth-b"],
    ]
    assert all(ln.endswith(rest) for ln in lines)


def test_old_16_field_lines_are_padded_when_merged_with_21_field_lines(tmp_path):
    _write(tmp_path / "old" / "bwm-ng.csv", "\n".join(_remote_copy(-3_000, fields=16)) + "\n")
    _write(tmp_path / "new" / "bwm-ng.csv", FIXTURE.read_text())
    # the old machine first, so that the first merged line would be a 16-field one
    merge_traces(tmp_path / "out", [TracePart("old", tmp_path / "old", -0.003), TracePart(None, tmp_path / "new", 0)])
    lines = (tmp_path / "out" / "bwm-ng.csv").read_text().splitlines()
    assert {len(ln.split(";")) for ln in lines} == {21}
    assert lines[0].endswith(";;;;;") and lines[0].split(";")[1] == "tor2-eth1"
    df = parse_bwm_ng(tmp_path / "out" / "bwm-ng.csv")
    ref = parse_bwm_ng(FIXTURE).groupby("iface")["bytes_in"].sum()
    got = df.groupby("iface")["bytes_in"].sum()
    assert got["tor2-eth1"] == ref["tbx0a"] and got["tbx0a"] == ref["tbx0a"]
    assert got["tor2-eth2"] == ref["tbx0b"] and got["tbx0b"] == ref["tbx0b"]


# ----------------------------------------------------------------------------- merge: qdisc, cpu


CPU_A = (
    "time,kind,id,busy_pct\r\n"
    "10.100000,core,0,12.50\r\n10.100000,core,1,3.00\r\n10.100000,proc,w0,97.00\r\n"
    "10.100000,proc,bwm-ng,1.00\r\n10.100000,proc,harness,2.50\r\n"
    "10.200000,core,0,14.00\r\n"
)
CPU_B = (
    "time,kind,id,busy_pct\r\n"
    "12.150000,core,0,50.00\r\n12.150000,proc,w1,99.10\r\n12.150000,proc,bwm-ng,0.90\r\n"
    "12.150000,proc,harness,4.00\r\n12.250000,core,0,51.00\r\n12.2"
)  # cut mid-write
QDISC_A = (
    "time,iface,qdisc,backlog_bytes,backlog_packets,drops,overlimits,sent_bytes,sent_packets\r\n"
    "10.120000,tor1-eth1,htb,0,0,0,0,1000,10\r\n10.170000,tor1-eth1,htb,1500,1,2,3,4000,40\r\n"
)
QDISC_B = (
    "time,iface,qdisc,backlog_bytes,backlog_packets,drops,overlimits,sent_bytes,sent_packets\r\n"
    "12.140000,tor2-eth1,htb,0,0,0,0,500,5\r\n12.190000,tor2-eth1,noqueue,,,,,,\r\n"
)


def test_cpu_and_qdisc_merge_shift_times_and_prefix_machine_rows_of_remote_machines_only(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _write(a / "cpu.csv", CPU_A), _write(a / "qdisc.csv", QDISC_A)
    _write(b / "cpu.csv", CPU_B), _write(b / "qdisc.csv", QDISC_B)
    got = merge_traces(tmp_path / "out", [TracePart(None, a, 0.0), TracePart("10.0.0.2", b, 2.0)])
    assert got == {"cpu.csv": 11, "qdisc.csv": 4}
    assert not (tmp_path / "out" / "bwm-ng.csv").exists()

    cpu = pd.read_csv(tmp_path / "out" / "cpu.csv", dtype=str)
    assert list(cpu.columns) == CPU_COLUMNS
    assert cpu.values.tolist() == [
        ["10.100000", "core", "0", "12.50"],
        ["10.100000", "core", "1", "3.00"],
        ["10.100000", "proc", "w0", "97.00"],
        ["10.100000", "proc", "bwm-ng", "1.00"],
        ["10.100000", "proc", "harness", "2.50"],
        ["10.150000", "core", "10.0.0.2:0", "50.00"],
        ["10.150000", "proc", "w1", "99.10"],
        ["10.150000", "proc", "10.0.0.2:bwm-ng", "0.90"],
        ["10.150000", "proc", "10.0.0.2:harness", "4.00"],
        ["10.200000", "core", "0", "14.00"],
        ["10.250000", "core", "10.0.0.2:0", "51.00"],
    ]  # "12.2" (cut) is gone
    q = pd.read_csv(tmp_path / "out" / "qdisc.csv", dtype=str, keep_default_na=False)
    assert list(q.columns) == QDISC_COLUMNS
    assert q[["time", "iface", "qdisc", "sent_bytes"]].values.tolist() == [
        ["10.120000", "tor1-eth1", "htb", "1000"],
        ["10.140000", "tor2-eth1", "htb", "500"],
        ["10.170000", "tor1-eth1", "htb", "4000"],
        ["10.190000", "tor2-eth1", "noqueue", ""],
    ]
    # what analysis reads
    t = read_table(tmp_path / "out" / "cpu.csv", CPU_COLUMNS)
    assert t["time"].dtype == float and t["busy_pct"].sum() == pytest.approx(
        12.5 + 3 + 97 + 1 + 2.5 + 50 + 99.1 + 0.9 + 4 + 14 + 51
    )


def test_cpu_missing_rows_line_is_not_merged(tmp_path):
    """Cut just before the newline of the last row: the row is incomplete and left out."""
    _write(tmp_path / "b" / "cpu.csv", CPU_A.rstrip("\n"))
    got = merge_traces(tmp_path / "out", [TracePart("m2", tmp_path / "b", 0.0)])
    assert got == {"cpu.csv": 5}
    ids = pd.read_csv(tmp_path / "out" / "cpu.csv", dtype=str)["id"].tolist()
    assert ids == ["m2:0", "m2:1", "w0", "m2:bwm-ng", "m2:harness"]


# ----------------------------------------------------------------------------- merge: files and dirs


def test_merge_into_a_parts_own_directory(tmp_path):
    ctl, remote = tmp_path / "run" / "traces", tmp_path / "m2"
    _write(ctl / "bwm-ng.csv", FIXTURE.read_text())
    _write(ctl / "cpu.csv", CPU_A)
    _write(remote / "bwm-ng.csv", "\n".join(_remote_copy(1_500_000)) + "\n")
    _write(remote / "cpu.csv", CPU_B)
    _write(remote / "qdisc.csv", QDISC_B)
    got = merge_traces(ctl, [TracePart(None, ctl, 0.0), TracePart("m2", remote, 1.5)])
    n = len(parse_bwm_ng(FIXTURE))
    assert got == {"bwm-ng.csv": 2 * n, "cpu.csv": 11, "qdisc.csv": 2}
    assert len(parse_bwm_ng(ctl / "bwm-ng.csv")) == 2 * n
    assert sorted(p.name for p in ctl.iterdir()) == ["bwm-ng.csv", "cpu.csv", "qdisc.csv"]  # no temporary files
    cpu = pd.read_csv(ctl / "cpu.csv", dtype=str)
    assert cpu["time"].tolist()[:6] == ["10.100000"] * 5 + ["10.200000"]
    assert cpu["time"].tolist()[6:] == ["10.650000"] * 4 + ["10.750000"]  # 12.15 - 1.5, 12.25 - 1.5


def test_missing_files_are_skipped_and_not_created(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    _write(a / "bwm-ng.csv", FIXTURE.read_text())
    _write(b / "cpu.csv", "time,kind,id,busy_pct\r\n")  # header only: written, with no rows
    c.mkdir()
    got = merge_traces(
        tmp_path / "out",
        [
            TracePart(None, a, 0.0),
            TracePart("m2", b, 0.1),
            TracePart("m3", c, 0.2),
            TracePart("m4", tmp_path / "absent", 0.0),
        ],
    )
    assert got == {"bwm-ng.csv": len(parse_bwm_ng(FIXTURE)), "cpu.csv": 0}
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["bwm-ng.csv", "cpu.csv"]
    assert (tmp_path / "out" / "cpu.csv").read_text().splitlines() == ["time,kind,id,busy_pct"]

    assert merge_traces(tmp_path / "none", [TracePart("m3", c, 0.0)]) == {}
    assert not (tmp_path / "none").exists()


def test_merge_refuses_ambiguous_parts():
    with pytest.raises(ValueError, match="more than one part"):
        merge_traces(Path("/nonexistent"), [TracePart("m2", Path("/x"), 0.0), TracePart("m2", Path("/y"), 1.0)])
    with pytest.raises(ValueError, match="finite"):
        TracePart("m2", Path("/x"), float("nan"))
    with pytest.raises(ValueError, match="machine name"):
        TracePart("", Path("/x"), 0.0)


# ----------------------------------------------------------------------------- agent: training processes


def _fake_runtime(stage: str, name: str, code: str = "import time; time.sleep(60)") -> subprocess.Popen:
    """A real process whose argv is ``python -c CODE -m traffic.runtime STAGE NAME``."""
    return subprocess.Popen([sys.executable, "-c", code, "-m", "traffic.runtime", stage, name], start_new_session=True)


def _kill(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait(10)


def _wait_for(cond, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


def test_runtime_pids_finds_the_runs_training_processes(tmp_path):
    stage = str(tmp_path / "stage")
    # w0 forks a child with the same argv: the root is reported, not the fork
    w0 = _fake_runtime(stage, "w0", "import os, time; os.fork(); time.sleep(60)")
    ps1 = _fake_runtime(stage, "ps1")
    other = _fake_runtime(str(tmp_path / "other-stage"), "w1")  # another run's process
    extra = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "-m", "traffic.runtime", stage, "w2", "x"],
        start_new_session=True,
    )  # not ``... RUN_DIR NAME`` at the end
    try:
        _wait_for(lambda: psutil.Process(w0.pid).children())
        _wait_for(lambda: psutil.Process(ps1.pid).cmdline()[-1] == "ps1")
        assert runtime_pids(stage) == {"w0": w0.pid, "ps1": ps1.pid}
        assert runtime_pids(str(tmp_path / "other-stage")) == {"w1": other.pid}
    finally:
        for p in (w0, ps1, other, extra):
            _kill(p)
    assert runtime_pids(stage) == {}
    with pytest.raises(ValueError):
        runtime_pids("")


def test_runtime_pids_rescan_at_most_every_period():
    calls = []

    def scan(match):
        calls.append(match)
        return {"w0": 100 + len(calls)}

    cached = RuntimePids("/stage", every_s=3600, scan=scan)
    assert [cached(), cached(), cached()] == [{"w0": 101}] * 3 and calls == ["/stage"]
    always = RuntimePids("/stage", every_s=0, scan=scan)
    assert [always(), always()] == [{"w0": 102}, {"w0": 103}]


# ----------------------------------------------------------------------------- agent: the process


def _agent(run_dir: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen(
        [sys.executable, "-m", "testbed.capture.agent", str(run_dir), *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _read_line(p: subprocess.Popen, timeout_s: float = 20.0) -> str:
    """The next line of the agent's stdout ('' at end of file)."""
    buf = b""
    deadline = time.monotonic() + timeout_s
    fd = p.stdout.fileno()
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no line from the agent within {timeout_s} s (got {buf!r})")
        if select.select([fd], [], [], left)[0]:
            b = os.read(fd, 1)
            if not b:
                break
            buf += b
    return buf.decode().rstrip("\n")


def _bwm_ngs_writing_into(run_dir: Path) -> list[int]:
    out = []
    for p in psutil.process_iter(["name", "cmdline"]):
        if p.info["name"] == "bwm-ng" and str(run_dir) in " ".join(p.info["cmdline"] or []):
            out.append(p.pid)
    return out


CAPTURE = json.dumps(
    {"interval_ms": 10, "qdisc_interval_ms": 20, "cpu_interval_ms": 50, "pcap": {"ports": ["uplinks"]}}
)  # pcap is turned off by the agent


def test_agent_reports_a_port_that_does_not_exist(tmp_path):
    p = _agent(tmp_path / "stage", "--ports", "tbnosuch0", "--capture", CAPTURE)
    try:
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 1
    (line,) = out.decode().splitlines()
    assert line.startswith("error ")
    assert ("tbnosuch0" in line) if shutil.which("bwm-ng") else ("bwm-ng" in line)
    assert not _bwm_ngs_writing_into(tmp_path / "stage")


@pytest.mark.parametrize(
    "args, status, says",
    [
        (["--ports", "lo"], 2, "--capture"),  # a malformed command line
        (["--ports", "lo", "--capture", '{"interval_ms": 0}'], 1, "interval_ms"),
        (["--ports", "lo", "--capture", "[1]"], 1, "JSON object"),
    ],
)
def test_agent_reports_bad_arguments_in_the_protocol(tmp_path, args, status, says):
    p = _agent(tmp_path / "stage", *args)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == status
    (line,) = out.decode().splitlines()
    assert line.startswith("error ") and says in line


can_veth = os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("bwm-ng") is not None


def _sh(*cmd, check=True):
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


@pytest.fixture
def veth():
    """``tbag0``/``tbag1``, a veth pair in the root namespace, up, without IPv6 (so that the
    only frames on it are the test's). Deleted afterwards."""
    if not can_veth:
        pytest.skip("needs root, iproute2 and bwm-ng")
    _sh("ip", "link", "del", "tbag0", check=False)
    try:
        _sh("ip", "link", "add", "tbag0", "type", "veth", "peer", "name", "tbag1")
        for d in ("tbag0", "tbag1"):
            _sh("sysctl", "-qw", f"net.ipv6.conf.{d}.disable_ipv6=1")
            _sh("ip", "link", "set", d, "multicast", "off", "up")
        yield "tbag0", "tbag1"
    finally:
        _sh("ip", "link", "del", "tbag0", check=False)


def _send_frames(dev: str, count: int, size: int) -> None:
    """``count`` Ethernet frames of ``size`` bytes out of ``dev`` (an unused EtherType, to a
    MAC nobody has: the peer counts and drops them)."""
    frame = bytes.fromhex("02aabbccddee02aabbccddef88b5")  # local experimental EtherType
    frame += b"\0" * (size - len(frame))
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as s:
        s.bind((dev, 0))
        for _ in range(count):
            s.send(frame)
            time.sleep(0.001)


@pytest.mark.parametrize("stop", ["eof", "SIGTERM", "SIGHUP", "SIGINT"])
def test_agent_captures_this_machine_and_leaves_nothing(veth, tmp_path, stop):
    stage = tmp_path / "stage"
    w0 = _fake_runtime(str(stage), "w0")
    p = _agent(stage, "--ports", "tbag0", "--qdisc", "tbag0", "--capture", CAPTURE)
    try:
        line = _read_line(p)
        assert line.startswith("ready "), line + p.stderr.read1().decode() if p.poll() is not None else line
        ready = json.loads(line[len("ready ") :])
        assert ready["pid"] == p.pid
        assert _bwm_ngs_writing_into(stage) == [ready["bwm_ng_pid"]]
        _send_frames("tbag1", 50, 1000)
        bwm = stage / "traces" / "bwm-ng.csv"
        _wait_for(lambda: parse_bwm_ng(bwm)["bytes_in"].sum() >= 50 * 1000)
        _wait_for(lambda: "w0" in set(read_table(stage / "traces" / "cpu.csv", CPU_COLUMNS)["id"].astype(str)))
        if stop == "eof":
            p.stdin.close()
        else:
            p.send_signal(getattr(signal, stop))
        assert _read_line(p) == "stopped"
        assert p.wait(20) == 0
        assert _read_line(p) == ""  # nothing after "stopped"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
        _kill(w0)
    assert not psutil.pid_exists(ready["bwm_ng_pid"]) or psutil.Process(ready["bwm_ng_pid"]).name() != "bwm-ng"
    assert not _bwm_ngs_writing_into(stage)

    df = parse_bwm_ng(stage / "traces" / "bwm-ng.csv")
    assert set(df["iface"]) == {"tbag0"}
    assert 50 * 1000 <= df["bytes_in"].sum() <= 50 * 1000 + 200 and df["packets_in"].sum() in range(50, 53)
    cpu = read_table(stage / "traces" / "cpu.csv", CPU_COLUMNS)
    assert {"w0", "bwm-ng", "harness"} <= set(cpu.loc[cpu["kind"] == "proc", "id"].astype(str))
    q = read_table(stage / "traces" / "qdisc.csv", QDISC_COLUMNS)
    assert set(q["iface"]) == {"tbag0"} and len(q) >= 2
    assert not (stage / "traces" / "endpoints.csv").exists() and not (stage / "traces" / "pcap").exists()


def test_a_stop_signal_during_the_start_stops_the_capture_before_ready(monkeypatch, capsys, tmp_path):
    """SIGTERM while Capture.start() runs (here: raised by it) is kept, not lost: the capture
    is stopped as soon as the start returns and ``ready`` is never said."""
    calls = []

    class FakeCapture:
        def __init__(self, run_dir, ports, qdisc_ifaces, pids, spec, memory):
            calls.append(("init", Path(run_dir), ports, qdisc_ifaces, spec.pcap, spec.endpoints, pids.match, memory))
            self.bwm = None

        def start(self):
            calls.append("start")
            signal.raise_signal(signal.SIGTERM)  # delivered to the agent's handler, which must not raise
            calls.append("started")
            return self

        def stop(self):
            calls.append("stop")

    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(agent, "Capture", FakeCapture)
    status = agent.main([str(tmp_path), "--ports", "a,b", "--qdisc", "b", "--capture", CAPTURE, "--match", "/m"])
    assert status == 0 and capsys.readouterr().out == "stopped\n"
    assert calls == [("init", tmp_path, ["a", "b"], ["b"], None, False, "/m", True), "start", "started", "stop"]
    assert signal.getsignal(signal.SIGTERM) is before  # the handlers are put back
