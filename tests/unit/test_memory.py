"""A run's memory: the sampler's rows (from a fake psutil), ``memory.csv`` written by its
recorder and merged over machines, the summary's ``memory`` section computed from it and
written back key for key, and ``testbed show``'s columns. Nothing here builds a network."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pandas as pd
import psutil
import pytest

from analysis import metrics
from analysis.load import load
from testbed.capture import memory
from testbed.capture.merge import TracePart, merge_traces
from tests.unit.test_analysis import make_run
from tests.unit.test_cli import run_cli
from tests.unit.test_summary import same_json
from traffic.summary import RunSummary

GIB, MIB = 2**30, 2**20


def fake_psutil(used: list[int], uss: dict[int, int]) -> SimpleNamespace:
    """psutil with ``virtual_memory`` giving ``used`` in turn (total 16 GiB) and ``Process(pid)``
    with ``uss[pid]``; a pid not in ``uss`` has ended, a negative one is another user's."""
    it = iter(used)

    def process(pid):
        if pid not in uss:
            raise psutil.NoSuchProcess(pid)
        if pid < 0:
            raise psutil.AccessDenied(pid)
        return SimpleNamespace(memory_full_info=lambda: SimpleNamespace(uss=uss[pid]))

    return SimpleNamespace(
        virtual_memory=lambda: (lambda u: SimpleNamespace(total=16 * GIB, available=16 * GIB - u))(next(it)),
        Process=process,
        NoSuchProcess=psutil.NoSuchProcess,
        AccessDenied=psutil.AccessDenied,
        ZombieProcess=psutil.ZombieProcess,
    )


def test_the_sampler_reads_the_machine_every_sample_and_each_process_s_uss_every_period(monkeypatch):
    monkeypatch.setattr(
        memory, "psutil", fake_psutil([GIB, 2 * GIB, 3 * GIB, 4 * GIB], {1: 10 * MIB, 2: 20 * MIB, -3: 1})
    )
    now = [100.0]
    pids = {"worker0": 1, "worker1": 2, "not started": None, "ended": 99, "denied": -3}
    s = memory.MemorySampler(lambda: pids, uss_period_s=5.0, clock=lambda: now[0], cpu_clock=lambda: 0.0).open()
    assert s.read() == [("machine", "used", GIB), ("proc", "worker0", 10 * MIB), ("proc", "worker1", 20 * MIB)]
    now[0] = 104.9
    assert s.read() == [("machine", "used", 2 * GIB)]  # each process every 5 s only
    now[0] = 105.0
    assert [r[1] for r in s.read()] == ["used", "worker0", "worker1"]
    s.close()
    assert memory.MemorySampler(lambda: {}).open().read()[0][:2] == ("machine", "used")  # the real psutil


def test_the_uss_reads_keep_to_their_cpu_budget(monkeypatch):
    """Each read costs 10 ms of CPU against a budget of 2 % of a core: one read per 0.5 s,
    longest waiting first, so 4 processes are each read every 2 s instead of every 1 s."""
    monkeypatch.setattr(memory, "psutil", fake_psutil([GIB] * 100, {i: i * MIB for i in range(4)}))
    now, cpu = [0.0], [0.0]

    class Costly:  # a Process whose USS read costs 10 ms of CPU
        def __init__(self, pid):
            self.pid = pid

        def memory_full_info(self):
            cpu[0] += 0.01
            return SimpleNamespace(uss=self.pid * MIB)

    monkeypatch.setattr(memory.psutil, "Process", Costly)
    s = memory.MemorySampler(
        lambda: {f"w{i}": i for i in range(4)},
        uss_period_s=1.0,
        uss_cpu_share=0.02,
        clock=lambda: now[0],
        cpu_clock=lambda: cpu[0],
    ).open()
    read = []
    for k in range(40):  # a sample every 0.1 s for 4 s
        now[0] = 0.1 * k
        read += [r[1] for r in s.read() if r[0] == "proc"]
    assert read == ["w0", "w1", "w2", "w3"] * 2
    assert cpu[0] <= 0.02 * 4 + 0.01 + 1e-9


def test_the_recorder_writes_its_first_sample_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr(memory, "psutil", fake_psutil([5 * GIB] * 1000, {7: 3 * MIB}))
    errors: list[str] = []
    rec = memory.memory_recorder(tmp_path, lambda: {"worker0": 7}, 0.01, errors)
    with rec:
        assert rec.first_sample.wait(5.0)
    df = pd.read_csv(tmp_path / "memory.csv")
    assert list(df.columns) == memory.MEMORY_FIELDS and not errors
    assert df.iloc[0][["kind", "id", "bytes"]].tolist() == ["machine", "used", 5 * GIB]
    assert df.iloc[1][["kind", "id", "bytes"]].tolist() == ["proc", "worker0", 3 * MIB]


def test_used_memory_from_a_machine_s_meminfo():
    assert memory.used_from_meminfo("MemTotal:  1000 kB\nMemFree: 10 kB\nMemAvailable:   400 kB\n") == 600 * 1024
    with pytest.raises(ValueError, match="without MemAvailable"):
        memory.used_from_meminfo("MemTotal:  1000 kB\nMemFree: 10 kB\n")


def write_memory(run_dir, rows) -> None:
    (run_dir / "traces" / "memory.csv").write_text(
        "time,kind,id,bytes\n" + "".join(f"{t:.6f},{k},{i},{b}\n" for t, k, i, b in rows)
    )


# one machine: 4 GiB before the build, 10 GiB at the peak, back to 6 GiB; USS of two processes
ROWS = [(90.0 + 0.1 * j, "machine", "used", u * GIB) for j, u in enumerate([4, 5, 10, 6])] + [
    (90.0, "proc", "worker0", 100 * MIB),
    (95.0, "proc", "worker0", 300 * MIB),
    (95.0, "proc", "worker1", 200 * MIB),
    (95.0, "proc", "server0", 50 * MIB),
]


def test_the_summary_s_memory_section_round_trips_and_show_prints_it(tmp_path):
    d = make_run(tmp_path)
    write_memory(d, ROWS)
    s = metrics.summarize(d)
    m = s.memory
    assert (m.machine_used_start_bytes, m.machine_used_peak_bytes, m.machine_growth_bytes) == (
        4 * GIB,
        10 * GIB,
        6 * GIB,
    )
    u = m.process_uss_peak_bytes
    assert (u.median, u.max, u.sum, u.processes) == (200 * MIB, 300 * MIB, 550 * MIB, 3)
    assert m.period_s == pytest.approx(0.1) and m.uss_period_s == pytest.approx(5.0) and m.machines is None
    doc = json.loads((d / "summary.json").read_text())
    assert set(doc["memory"]) == set(type(m).model_fields) - {"machines", "worst_machine"}
    assert same_json(RunSummary.load(d).dump(), doc) is None
    rc, out, _ = run_cli("show", d)
    header, _, row = out.splitlines()[:3]
    assert rc == 0 and header.split()[-8:] == ["mem", "+GiB", "USS", "med", "MiB", "USS", "max", "MiB"]
    assert row.split()[-3:] == ["6.00", "200", "300"]
    (d / "traces" / "memory.csv").unlink()  # a run from before: no section, no columns
    assert metrics.summarize(d).memory is None
    assert "USS" not in run_cli("show", d)[1]


def test_a_cluster_run_s_memory_is_per_machine(tmp_path):
    """The controller's rows read over SSH before the build and each agent's memory.csv are
    merged with every id prefixed by its machine; the top-level machine figures are those of
    the machine that grew most, the USS over every process."""
    run = make_run(tmp_path)
    write_memory(run, [(50.0, "machine", "10.0.0.2:used", 2 * GIB), (50.0, "machine", "10.0.0.3:used", 1 * GIB)])
    parts = [TracePart(None, run / "traces")]
    for addr, used, uss in (("10.0.0.2", 3, 100), ("10.0.0.3", 5, 300)):
        agent = tmp_path / addr
        agent.mkdir()
        (agent / "memory.csv").write_text(
            f"time,kind,id,bytes\n60.0,machine,used,{used * GIB}\n60.0,proc,worker{used},{uss * MIB}\n"
        )
        parts.append(TracePart(addr, agent, offset_s=1.0))
    merge_traces(run / "traces", parts)
    df = pd.read_csv(run / "traces" / "memory.csv")
    assert df["id"].tolist() == [
        "10.0.0.2:used",
        "10.0.0.3:used",
        "10.0.0.2:used",
        "10.0.0.2:worker3",
        "10.0.0.3:used",
        "10.0.0.3:worker5",
    ]
    (run / "cluster.json").write_text(json.dumps({"machines": ["10.0.0.2", "10.0.0.3", "10.0.0.4"]}))
    m = metrics.summarize(run).memory
    assert m.worst_machine == "10.0.0.3" and m.machine_growth_bytes == 4 * GIB
    assert (
        m.machines["10.0.0.2"].machine_growth_bytes == GIB and m.machines["10.0.0.4"].machine_used_start_bytes is None
    )
    assert m.process_uss_peak_bytes.processes == 2 and m.process_uss_peak_bytes.max == 300 * MIB
    assert m.machines["10.0.0.2"].process_uss_peak_bytes.max == 100 * MIB
    assert load(run).memory["time"].min() == 50.0  # wall clock as written
