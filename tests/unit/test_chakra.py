"""Chakra execution traces: reading, checking and ordering (traffic.chakra.trace), the spec's
``workload.trace`` and the plan, the export of a run's events (traffic.chakra.export; the
files parse with mlc-chakra's own reader and ``chakra_jsonizer``), the command line's
``run --trace`` and ``export chakra``, and a loopback round trip (no Mininet, no root). The
runs on the emulated network are in test_chakra_e2e.py (slow, root)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("chakra", reason="needs mlc-chakra (the extra 'chakra')")

from chakra.schema.protobuf import et_def_pb2 as pb  # noqa: E402
from chakra.src.third_party.utils.protolib import decodeMessage, encodeMessage  # noqa: E402

from common.errors import SpecError  # noqa: E402
from testbed.loopback import run_local  # noqa: E402
from testbed.runner import plan_point  # noqa: E402
from testbed.spec import from_dict, load_spec  # noqa: E402
from tests.unit.test_cli import run_cli  # noqa: E402
from traffic.chakra import TraceFileError, load_trace  # noqa: E402
from traffic.chakra.export import export_run  # noqa: E402
from traffic.runtime.events import read_events  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PYTORCH_TRACE = ROOT / "tests" / "data" / "chakra" / "ddp"


# ---------------------------------------------------------------------------------- helpers


def attr(name, value):
    if isinstance(value, str):
        return pb.AttributeProto(name=name, string_val=value)
    if isinstance(value, list):
        return pb.AttributeProto(name=name, int64_list=pb.Int64List(values=value))
    return pb.AttributeProto(name=name, int64_val=value)


def node(id, type="COMP_NODE", name=None, deps=(), ctrl=(), dur=0, **attrs):
    n = pb.Node(
        id=id,
        name=name if name is not None else f"n{id}",
        type=pb.NodeType.Value(type),
        data_deps=list(deps),
        ctrl_deps=list(ctrl),
        duration_micros=dur,
    )
    n.attr.extend(attr(k, v) for k, v in attrs.items())
    return n


def coll(id, kind="ALL_REDUCE", size=4096, deps=(), **attrs):
    return node(
        id,
        "COMM_COLL_NODE",
        name=kind.lower(),
        deps=deps,
        comm_type=pb.CollectiveCommType.Value(kind),
        comm_size=size,
        **attrs,
    )


def write(prefix: Path, ranks: list[list]) -> Path:
    prefix.parent.mkdir(parents=True, exist_ok=True)
    for r, nodes in enumerate(ranks):
        with open(f"{prefix}.{r}.et", "wb") as f:
            encodeMessage(f, pb.GlobalMetadata(version="0.0.4"))
            for n in nodes:
                encodeMessage(f, n)
    return prefix


def two_ranks(prefix: Path, iterations: int = 1) -> Path:
    """Per iteration: compute, compute, all-reduce of 4 KiB, rank 0 sends 1 KiB to rank 1."""
    ranks = [[], []]
    for r in range(2):
        prev = None
        for it in range(iterations):
            base = it * 10
            a = node(base + 1, dur=100, deps=[prev] if prev is not None else [], iteration=it)
            b = node(base + 2, dur=50, deps=[base + 1], iteration=it)
            c = coll(base + 3, deps=[base + 2], iteration=it)
            if r == 0:
                p = node(base + 4, "COMM_SEND_NODE", deps=[base + 3], comm_dst=1, comm_size=1024, iteration=it)
            else:
                p = node(base + 4, "COMM_RECV_NODE", deps=[base + 3], comm_src=0, comm_size=1024, iteration=it)
            ranks[r] += [a, b, c, p]
            prev = base + 4
    return write(prefix, ranks)


# ---------------------------------------------------------------------------------- reading


def test_a_trace_is_read_merged_and_put_in_iterations(tmp_path):
    trace = load_trace(two_ranks(tmp_path / "t", iterations=3))
    assert trace.world_size == 2 and trace.iterations == 3
    ops = trace.ranks[0].iterations[1]
    assert [o.kind for o in ops] == ["compute", "collective", "send"]
    assert ops[0].nodes == (11, 12) and ops[0].seconds == pytest.approx(150e-6)  # consecutive compute: one sleep
    assert ops[1].collective == "all_reduce" and ops[1].nbytes == 4096 and ops[1].group == (0, 1)
    assert ops[2].peer == 1 and ops[2].nbytes == 1024
    assert trace.ranks[1].iterations[0][-1].kind == "recv"


def test_the_order_follows_the_dependencies_not_the_ids(tmp_path):
    # node 1 depends on node 5: 5 (compute) runs first; 9 has no iteration and no deps
    ranks = [
        [
            node(1, "COMM_COLL_NODE", name="ar", deps=[5], comm_type=pb.ALL_REDUCE, comm_size=8),
            node(5, dur=10),
            node(9, "METADATA_NODE"),
        ]
    ]
    trace = load_trace(write(tmp_path / "t", ranks))
    assert [o.nodes for o in trace.ranks[0].ops()] == [(5,), (1,)]


def test_profiler_steps_make_the_iterations(tmp_path):
    ranks = [
        [
            node(1, name="ProfilerStep#7", dur=5),
            node(2, ctrl=[1], dur=10),
            node(3, deps=[2], ctrl=[1], dur=10),
            node(4, name="ProfilerStep#8", deps=[3], dur=5),
            node(5, ctrl=[4], dur=20),
        ]
    ]
    trace = load_trace(write(tmp_path / "t", ranks))
    assert trace.iterations == 2
    assert [o.nodes for o in trace.ranks[0].iterations[1]] == [(4, 5)]


def test_a_trace_without_iterations_is_one(tmp_path):
    trace = load_trace(write(tmp_path / "t", [[node(1, dur=3), node(2, deps=[1], dur=4)]]))
    assert trace.iterations == 1 and trace.ranks[0].ops()[0].seconds == pytest.approx(7e-6)


def test_groups_come_from_pg_ranks_or_pg_name(tmp_path):
    ranks = [
        [coll(1, pg_name="a"), coll(2, size=8, pg_ranks=[0, 2])],
        [coll(1, pg_name="a")],
        [coll(1, pg_name="a"), coll(2, size=8, pg_ranks=[0, 2])],
    ]
    trace = load_trace(write(tmp_path / "t", ranks))
    assert [o.group for o in trace.ranks[0].ops()] == [(0, 1, 2), (0, 2)]


# ---------------------------------------------------------------------------------- bad input


def broken(tmp_path, ranks) -> str:
    with pytest.raises(TraceFileError) as err:
        load_trace(write(tmp_path / "t", ranks))
    return str(err.value)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(TraceFileError, match=r"no such files"):
        load_trace(tmp_path / "nothing")
    two_ranks(tmp_path / "t")
    shutil.copy(tmp_path / "t.1.et", tmp_path / "t.3.et")
    with pytest.raises(TraceFileError, match=r"t\.2\.et: missing"):
        load_trace(tmp_path / "t")


def test_a_truncated_file_is_named_with_the_last_node(tmp_path):
    two_ranks(tmp_path / "t")
    data = (tmp_path / "t.1.et").read_bytes()
    (tmp_path / "t.1.et").write_bytes(data[:-3])
    with pytest.raises(TraceFileError, match=r"t\.1\.et: truncated.*after node 3 \('all_reduce'\)"):
        load_trace(tmp_path / "t")


def test_a_malformed_file_is_named(tmp_path):
    two_ranks(tmp_path / "t")
    (tmp_path / "t.0.et").write_bytes(b"\x05\xff\xff\xff\xff\xff")
    with pytest.raises(TraceFileError, match=r"t\.0\.et: malformed at byte 0"):
        load_trace(tmp_path / "t")
    (tmp_path / "t.0.et").write_bytes(b"")
    with pytest.raises(TraceFileError, match=r"t\.0\.et: empty file"):
        load_trace(tmp_path / "t")


@pytest.mark.parametrize(
    "bad, says",
    [
        (node(2, "MEM_LOAD_NODE", name="load"), r"node 2 \('load'\): node type MEM_LOAD_NODE is not replayed"),
        (node(2, "COMM_COLL_NODE", name="odd", comm_type=42, comm_size=8), r"node 2 \('odd'\): collective 42 is not"),
        (node(2, "COMM_COLL_NODE", name="nosize", comm_type=pb.ALL_REDUCE), r"node 2 \('nosize'\): comm_size None"),
        (node(2, "COMM_COLL_NODE", name="notype", comm_size=8), r"node 2 \('notype'\): a collective without"),
        (node(2, "COMM_SEND_NODE", name="s", comm_size=8), r"node 2 \('s'\): comm_dst None"),
        (node(2, name="orphan", deps=[77]), r"node 2 \('orphan'\): depends on node 77"),
        (node(1, name="twice"), r"node 1 \('twice'\): a second node with id 1"),
    ],
)
def test_a_node_the_replay_cannot_run_is_named(tmp_path, bad, says):
    msg = broken(tmp_path, [[node(1, dur=1), bad]])
    assert "t.0.et" in msg
    assert __import__("re").search(says, msg), msg


def test_a_dependency_cycle_is_named(tmp_path):
    msg = broken(
        tmp_path, [[node(1), node(2, name="a", deps=[1, 4]), node(3, name="b", deps=[2]), node(4, name="c", deps=[3])]]
    )
    assert "dependency cycle" in msg and "node 2 ('a') -> node 4 ('c') -> node 3 ('b') -> node 2 ('a')" in msg


def test_collectives_that_differ_between_ranks_are_named(tmp_path):
    msg = broken(tmp_path, [[coll(1, size=8)], [coll(1, size=16)]])
    assert "differs between ranks" in msg and "t.1.et: node 1 ('all_reduce') is all_reduce of 16 bytes" in msg


def test_a_send_without_its_receive_is_named(tmp_path):
    msg = broken(tmp_path, [[node(1, "COMM_SEND_NODE", name="s", comm_dst=1, comm_size=8)], [node(1)]])
    assert "t.0.et: node 1 ('s'): 1 sends of 8 bytes from rank 0 to rank 1" in msg


def test_a_peer_outside_the_trace_is_named(tmp_path):
    msg = broken(tmp_path, [[node(1, "COMM_SEND_NODE", name="s", comm_dst=5, comm_size=8)], [node(1)]])
    assert "node 1 ('s'): comm_dst 5" in msg


def test_ranks_with_different_iteration_counts(tmp_path):
    msg = broken(tmp_path, [[node(1, iteration=0), node(2, deps=[1], iteration=1)], [node(1, iteration=0)]])
    assert "different numbers of iterations (t.0.et: 2, t.1.et: 1)" in msg


# ---------------------------------------------------------------------------------- spec and plan


def trace_spec(prefix, **workload):
    return {
        "topology": {"kind": "rack", "racks": 1, "hosts_per_rack": 2},
        "workload": {"trace": {"path": str(prefix)}, **workload},
    }


def test_a_trace_in_the_spec_replays_its_iterations(tmp_path):
    exp = from_dict(trace_spec(two_ranks(tmp_path / "t", iterations=3)))
    assert exp.workload.scheme == "trace" and exp.workload.iterations == 3 and exp.workload.warmup_iterations == 2
    exp = from_dict(trace_spec(tmp_path / "t", iterations=10))
    assert exp.workload.iterations == 10


def test_a_spec_files_trace_is_relative_to_its_folder(tmp_path):
    two_ranks(tmp_path / "traces" / "t")
    spec = tmp_path / "exp.yaml"
    spec.write_text("topology: {kind: rack, racks: 1, hosts_per_rack: 2}\nworkload: {trace: {path: traces/t}}\n")
    assert load_spec(spec).workload.trace.path == str(tmp_path / "traces" / "t")


def test_a_bad_trace_is_a_spec_error_naming_the_file_and_node(tmp_path):
    write(tmp_path / "t", [[node(1, "MEM_STORE_NODE", name="store")]])
    with pytest.raises(SpecError) as err:
        from_dict(trace_spec(tmp_path / "t", iterations=2))
    (e,) = [e for e in err.value.errors if e.field == "workload.trace.path"]
    assert "t.0.et" in e.allowed and "node 1 ('store')" in e.allowed


@pytest.mark.parametrize(
    "workload, field", [({"scheme": "ps"}, "workload.scheme"), ({"program": {"command": ["python"]}}, "workload.trace")]
)
def test_a_trace_with_a_scheme_or_program_is_refused(tmp_path, workload, field):
    with pytest.raises(SpecError) as err:
        from_dict(trace_spec(two_ranks(tmp_path / "t"), **workload))
    assert any(e.field == field for e in err.value.errors), err.value


def test_the_rank_count_must_match_the_worker_processes(tmp_path):
    exp = from_dict(trace_spec(two_ranks(tmp_path / "t")))
    hosts, procs = plan_point(exp)
    assert [p.host for p in procs] == ["h1", "h2"]
    exp = from_dict({**trace_spec(tmp_path / "t"), "topology": {"kind": "rack", "racks": 1, "hosts_per_rack": 3}})
    with pytest.raises(SpecError, match=r"it has 2 .* the run 3 .*workload.workers: 2"):
        plan_point(exp)


# ---------------------------------------------------------------------------------- export


def fake_run(run: Path, scale: float = 2.0) -> Path:
    """A run directory of two workers, two iterations each: forward, an all-reduce, update;
    worker0 sends worker1 a message on another thread."""
    (run / "events").mkdir(parents=True)
    (run / "spec.yaml").write_text(f"name: fake\nscale: {scale}\n")
    procs = [{"name": f"worker{r}", "role": "worker", "index": r, "rank": r} for r in range(2)]
    (run / "processes.json").write_text(json.dumps({"world_size": 2, "processes": procs}))
    for r in range(2):
        ev, t = [], 100.0
        for it in range(2):
            ev.append({"kind": "iteration", "thread": "main", "ts": t, "dur": 0.010, "iteration": it})
            ev.append({"kind": "forward", "thread": "main", "ts": t, "dur": 0.002, "iteration": it, "layer": 0})
            ev.append(
                {
                    "kind": "allreduce",
                    "thread": "main",
                    "ts": t + 0.002,
                    "dur": 0.004,
                    "iteration": it,
                    "bytes": 4096,
                    "group_size": 2,
                    "op": "sum",
                }
            )
            ev.append({"kind": "update", "thread": "main", "ts": t + 0.007, "dur": 0.001, "iteration": it})
            ev.append(
                {
                    "kind": "send" if r == 0 else "recv",
                    "thread": "comm",
                    "ts": t + 0.008,
                    "dur": 0.001,
                    "iteration": it,
                    "bytes": 64,
                    "peer": 1 - r,
                    "dir": "tx" if r == 0 else "rx",
                    "tag": 3,
                }
            )
            t += 0.020
        (run / "events" / f"worker{r}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in ev))
    return run


def test_the_export_reads_back_as_the_run(tmp_path):
    files = export_run(fake_run(tmp_path / "run"), tmp_path / "out")
    assert [f.name for f in files] == ["trace.0.et", "trace.1.et"]
    trace = load_trace(tmp_path / "out" / "trace")
    assert trace.iterations == 2
    ops = trace.ranks[0].iterations[0]
    assert [o.kind for o in ops] == ["compute", "collective", "compute", "send"]
    assert ops[0].seconds == pytest.approx(0.001) and ops[0].name == "forward 0"  # 2 ms real at scale 2
    assert ops[1].collective == "all_reduce" and ops[1].nbytes == 4096 and ops[1].group == (0, 1)
    assert ops[2].seconds == pytest.approx(0.002) and ops[2].name == "update"  # to the iteration's end
    assert ops[3].peer == 1 and ops[3].nbytes == 64 and ops[3].tag == 3
    with open(files[0], "rb") as f:  # mlc-chakra's own reader
        meta, n = pb.GlobalMetadata(), pb.Node()
        assert decodeMessage(f, meta) and decodeMessage(f, n)
    assert n.type == pb.COMP_NODE and n.duration_micros == 1000


def test_the_export_is_read_by_chakra_jsonizer(tmp_path):
    files = export_run(fake_run(tmp_path / "run"), tmp_path / "out")
    jsonizer = shutil.which("chakra_jsonizer") or str(Path(sys.executable).parent / "chakra_jsonizer")
    out = tmp_path / "trace.0.json"
    subprocess.run(
        [jsonizer, "--input_filename", str(files[0]), "--output_filename", str(out)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    text = out.read_text()
    assert "allreduce" in text and "comm_size" in text


def test_the_export_never_writes_into_a_non_empty_directory(tmp_path):
    run = fake_run(tmp_path / "run")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("x")
    rc, out, err = run_cli("export", "chakra", run, "--out", tmp_path / "out")
    assert rc == 2 and "is not an empty directory" in err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["keep.txt"]
    rc, out, err = run_cli("export", "chakra", run, "--out", tmp_path / "new")
    assert rc == 0 and "trace.0.et to" in out and (tmp_path / "new" / "trace.1.et").is_file()
    rc, out, err = run_cli("export", "chakra", tmp_path / "missing", "--out", tmp_path / "new2")
    assert rc == 2 and not (tmp_path / "new2").exists()


# ---------------------------------------------------------------------------------- command line


def test_run_trace_refuses_a_bad_trace_before_anything_is_built(tmp_path):
    write(tmp_path / "t", [[node(1), node(2, name="x", deps=[3]), node(3, name="y", deps=[2])]])
    rc, out, err = run_cli("run", "--trace", tmp_path / "t", "--dry-run")
    assert rc == 2 and "workload.trace.path" in err and "t.0.et" in err and "node 2 ('x')" in err
    rc, out, err = run_cli("run", "--trace", tmp_path / "none", "--dry-run")
    assert rc == 2 and "none.<rank>.et: no such files" in err


def test_run_trace_with_a_topology_plans_one_worker_per_rank(tmp_path):
    two_ranks(tmp_path / "t")
    spec = tmp_path / "net.yaml"
    spec.write_text("name: net\ntopology: {kind: rack, racks: 1, hosts_per_rack: 2}\n")
    rc, out, err = run_cli("run", "--trace", tmp_path / "t", "--topology", spec, "--dry-run")
    assert rc == 0, err
    assert "trace" in out and "worker1" in out
    spec.write_text("name: net\ntopology: {kind: rack, racks: 1, hosts_per_rack: 4}\n")
    rc, out, err = run_cli("run", "--trace", tmp_path / "t", "--topology", spec, "--dry-run")
    assert rc == 2 and "as many ranks as worker processes" in err


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--trace", "t", "--program", "python x.py"], "left out with --program"),
        (["experiments/quickstart.yaml", "--trace", "t"], "no spec file with --trace"),
    ],
)
def test_run_trace_usage_errors(argv, says):
    rc, out, err = run_cli("run", *argv)
    assert rc == 2 and says in err


# ---------------------------------------------------------------------------------- loopback round trip


def test_an_exported_allreduce_run_replays_the_same_collectives(tmp_path):
    from tests.conftest import experiment

    exp = experiment("allreduce", hosts_per_rack=2, iterations=3, batch_size=16, options={"bucket_mb": 0.01})
    run = run_local(exp, tmp_path / "run")
    export_run(run, tmp_path / "out")
    replay = from_dict(
        {
            "topology": exp.to_dict()["topology"],
            "workload": {"trace": {"path": str(tmp_path / "out" / "trace")}},
            "run": {"timeout_s": 120},
        }
    )
    assert replay.workload.iterations == 3
    again = run_local(replay, tmp_path / "replay")
    for w in range(2):

        def reduced(d):
            return [
                (e["iteration"], e["bytes"])
                for e in read_events(d / "events" / f"worker{w}.jsonl")
                if e["kind"] == "allreduce"
            ]

        assert reduced(again) == reduced(run) and len(reduced(run)) > 3
        its = [e for e in read_events(again / "events" / f"worker{w}.jsonl") if e["kind"] == "iteration"]
        assert [e["iteration"] for e in its] == [0, 1, 2]


def test_the_pytorch_made_trace_is_read(tmp_path):
    if not PYTORCH_TRACE.with_name("ddp.0.et").is_file():
        pytest.skip("tests/data/chakra/ddp.*.et not made (scripts/make_chakra_trace.py)")
    trace = load_trace(PYTORCH_TRACE)
    assert trace.world_size == 2 and trace.iterations >= 1
    assert sum(o.kind == "collective" for o in trace.ranks[0].ops()) >= 1


def test_setup_installs_the_extra_chakra():
    """scripts/setup.sh installs the extra's packages itself (without mlc-chakra's declared
    dependencies): every requirement of the extra is on its line."""
    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["chakra"]
    line = next(
        l for l in (ROOT / "scripts" / "setup.sh").read_text().splitlines() if "mlc-chakra" in l and "pipq" in l
    )
    assert all(req in line for req in extra), (extra, line)


def test_every_collective_and_message_replays_on_loopback(tmp_path):
    """Each collective the reader accepts runs with gloo (2 ranks, one iteration), and the
    replay's events carry the trace's sizes."""
    from traffic.chakra.trace import COLLECTIVES

    kinds = sorted({k for k, v in COLLECTIVES.items() if k != "REDUCE_SCATTER_BLOCK"})
    ranks = [[], []]
    for r in range(2):
        prev = []
        for i, k in enumerate(kinds, 1):
            ranks[r].append(coll(i, k, size=64, deps=prev))
            prev = [i]
        peer = {"comm_dst": 1} if r == 0 else {"comm_src": 0}
        ranks[r].append(node(99, "COMM_SEND_NODE" if r == 0 else "COMM_RECV_NODE", deps=prev, comm_size=40, **peer))
    write(tmp_path / "t", ranks)
    exp = from_dict({**trace_spec(tmp_path / "t"), "run": {"timeout_s": 60}})
    run = run_local(exp, tmp_path / "run")
    ev = read_events(run / "events" / "worker0.jsonl")
    got = {e["kind"]: e["bytes"] for e in ev if "bytes" in e and e["kind"] != "host_message"}
    assert got["allreduce"] == 64 and got["reduce_scatter"] == 64 and got["all_to_all"] == 64
    assert got["all_gather"] == 32 and got["gather"] == 32 and got["scatter"] == 32  # each rank's part
    assert got["send"] == 40 and "barrier" in {e["kind"] for e in ev}
