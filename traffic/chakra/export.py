"""A run directory's events written as a Chakra execution trace (``testbed export chakra``).

One file per process, ``<out>/<name>.<rank>.et`` (rank: the process's torch.distributed rank in
``processes.json``), from its ``events/<proc>.jsonl`` (:mod:`traffic.runtime.events`), with
mlc-chakra's own classes (:mod:`traffic.chakra.proto`). Only what happened inside the
process's training iterations (its ``iteration`` spans) is exported:

* every communication event becomes a node: a collective (an event with ``group_size``)
  ``COMM_COLL_NODE`` with ``comm_type`` (from the event's kind: ``allreduce``, ``all_gather``,
  ``broadcast``, ``reduce``, ``reduce_scatter``, ``all_to_all``, ``gather``, ``scatter``,
  ``barrier``; a scheme's own kind by its fields: ``op`` an all-reduce, ``src`` a broadcast,
  else an all-gather), ``comm_size`` (bytes, with :mod:`traffic.chakra.trace`'s convention:
  the whole buffer for the collectives of parts, i.e. ``group_size x`` the event's
  contribution for an all-gather, gather or scatter), ``pg_name`` and, when the event names
  its members (``group``), ``pg_ranks``; ``root`` for a rooted one. A point-to-point event
  (``dir``) becomes ``COMM_SEND_NODE`` (``comm_dst``) or ``COMM_RECV_NODE`` (``comm_src``)
  with ``comm_size`` and ``comm_tag``;
* the main thread's time between them is compute: one ``COMP_NODE`` per stretch between two
  communication events (and from the iteration's start to the first, from the last to the
  iteration's end), ``duration_micros`` its length in emulated microseconds (real seconds /
  the run's ``scale``), named after the events it covers (``forward 0-2, backward 2-0,
  update``). So the replay's iteration takes the run's time whatever the compute was (real,
  emulated, host costs, the runtime's own overhead);
* dependencies, in program order: each node depends (``data_deps``) on the node before it on
  its thread; a node of another thread (a scheme's communication thread) also on the main
  thread's node that started last before it;
* every node has the attribute ``iteration`` (the run's iteration), and its ``start_time_micros``
  (unix microseconds) and, for communication, its ``duration_micros`` as measured (emulated).

A replay runs every step of a rank one after another: what a scheme overlapped (a
communication thread beside the compute) is replayed in sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from common.errors import TestbedError
from traffic.chakra.proto import et_def, write_trace_file
from traffic.rundir import is_run, read_json, read_spec
from traffic.runtime.events import read_events

__all__ = ["export_run", "ExportError", "TRACE_NAME"]

#: the file name prefix of an exported trace: ``<out>/trace.<rank>.et``
TRACE_NAME = "trace"
#: event kinds that are not part of the exported program (containers and set-up)
_SKIP = frozenset({"iteration", "init", "setup", "finish", "eval"})
#: event kind -> Chakra collective name (``CollectiveCommType``)
_COLLECTIVE_KINDS = {
    "allreduce": "ALL_REDUCE",
    "all_reduce": "ALL_REDUCE",
    "all_gather": "ALL_GATHER",
    "allgather": "ALL_GATHER",
    "broadcast": "BROADCAST",
    "reduce": "REDUCE",
    "reduce_scatter": "REDUCE_SCATTER",
    "all_to_all": "ALL_TO_ALL",
    "gather": "GATHER",
    "scatter": "SCATTER",
    "barrier": "BARRIER",
}
#: collectives whose comm_size is group_size x the event's bytes (the event's is one part)
_PART_EVENTS = frozenset({"ALL_GATHER", "GATHER", "SCATTER"})


class ExportError(TestbedError):
    """The run cannot be exported (not a run, no events, an existing output), or the output
    directory is not empty; the message says which."""


def export_run(run_dir: str | Path, out: str | Path, name: str = TRACE_NAME) -> list[Path]:
    """Write the trace of the run ``run_dir`` to ``out`` (module docstring).

    Args:
        run_dir: a run directory (with ``processes.json``, ``spec.yaml`` and ``events/``).
        out: the output directory: created, or an existing empty one.
        name: the files' prefix (``<out>/<name>.<rank>.et``; replay with ``--trace out/name``).

    Returns:
        The files written, rank order.

    Raises:
        ExportError: ``out`` exists and is not an empty directory; ``run_dir`` is not a run;
            a process has no events or no iteration.
        MissingRequirement: mlc-chakra is not installed.
    """
    run_dir, out = Path(run_dir), Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"{out} exists and is not an empty directory: the export never overwrites; give a new --out")
    if not is_run(run_dir):
        raise ExportError(f"{run_dir} is not a run directory (no spec.yaml and processes.json); see 'testbed ls'")
    procs = sorted(read_json(run_dir / "processes.json")["processes"], key=lambda p: p["rank"])
    scale = read_spec(run_dir).get("scale", 1.0)
    scale = float(scale) if isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale > 0 else 1.0
    world = len(procs)
    ranks = []
    for p in procs:
        path = run_dir / "events" / f"{p['name']}.jsonl"
        if not path.is_file():
            raise ExportError(f"{path}: missing; every process of the run needs its events to be exported")
        try:
            events = read_events(path)
        except ValueError as e:
            raise ExportError(str(e)) from None
        nodes = _rank_nodes(events, scale, world)
        if nodes is None:
            raise ExportError(f"{path}: no iteration events (the process never trained); nothing to export")
        ranks.append(nodes)
    pb = et_def()
    out.mkdir(parents=True, exist_ok=True)
    meta = pb.GlobalMetadata(
        version="0.0.4",
        attr=[
            pb.AttributeProto(name="source", string_val=f"dl-netbed run {run_dir.name}"),
            pb.AttributeProto(name="scale", double_val=scale),
        ],
    )
    return [
        write_trace_file(out / f"{name}.{p['rank']}.et", meta, [n.proto(pb) for n in nodes])
        for p, nodes in zip(procs, ranks)
    ]


@dataclass
class _Node:
    id: int
    name: str
    type: str
    iteration: int
    start_us: int
    duration_us: int
    attrs: dict = field(default_factory=dict)
    deps: list[int] = field(default_factory=list)

    def proto(self, pb):
        n = pb.Node(
            id=self.id,
            name=self.name,
            type=pb.NodeType.Value(self.type),
            start_time_micros=self.start_us,
            duration_micros=self.duration_us,
            data_deps=self.deps,
        )
        n.attr.append(pb.AttributeProto(name="iteration", int64_val=self.iteration))
        for k, v in self.attrs.items():
            if isinstance(v, str):
                n.attr.append(pb.AttributeProto(name=k, string_val=v))
            elif isinstance(v, list):
                n.attr.append(pb.AttributeProto(name=k, int64_list=pb.Int64List(values=v)))
            elif isinstance(v, bool):
                n.attr.append(pb.AttributeProto(name=k, bool_val=v))
            else:
                n.attr.append(pb.AttributeProto(name=k, int64_val=int(v)))
        return n


def _is_comm(e: dict) -> bool:
    return e["kind"] == "barrier" or ("bytes" in e and ("group_size" in e or "dir" in e))


def _rank_nodes(events: list[dict], scale: float, world: int) -> list[_Node] | None:
    """The nodes of one process, program order; None without iterations."""
    windows = {
        e["iteration"]: (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e["kind"] == "iteration" and e.get("thread", "main") == "main" and e.get("iteration") is not None
    }
    if not windows:
        return None

    def iteration_of(e: dict) -> int | None:
        it = e.get("iteration")
        if it in windows:
            return it
        mid = e["ts"] + e.get("dur", 0) / 2
        return next((i for i, (a, b) in windows.items() if a <= mid <= b), None)

    def us(seconds: float) -> int:
        return max(int(round(seconds / scale * 1e6)), 0)

    nodes: list[_Node] = []
    last_on: dict[str, _Node] = {}
    main_nodes: list[_Node] = []

    def add(node: _Node, thread: str) -> None:
        node.id = len(nodes)
        prev = last_on.get(thread)
        if prev is not None:
            node.deps.append(prev.id)
        if thread != "main":
            before = [m for m in main_nodes if m.start_us <= node.start_us]
            if before and before[-1].id not in node.deps:
                node.deps.append(before[-1].id)
        else:
            main_nodes.append(node)
        last_on[thread] = node
        nodes.append(node)

    comm = sorted(
        (e for e in events if e["kind"] not in _SKIP and _is_comm(e) and iteration_of(e) is not None),
        key=lambda e: e["ts"],
    )
    others = [e for e in events if e["kind"] not in _SKIP and not _is_comm(e) and e.get("thread", "main") == "main"]
    items: list[tuple[float, int, str, _Node]] = []  # (start, order, thread, node) before ids
    for it in sorted(windows):
        start, end = windows[it]
        cursor = start
        mine = [e for e in comm if iteration_of(e) == it]
        for e in mine:
            thread = e.get("thread", "main")
            if thread == "main":
                if e["ts"] > cursor:
                    items.append((cursor, len(items), "main", _compute(cursor, e["ts"], it, others, us)))
                cursor = max(cursor, e["ts"] + e["dur"])
            items.append((e["ts"], len(items), thread, _comm(e, it, world, us)))
        if end > cursor:
            items.append((cursor, len(items), "main", _compute(cursor, end, it, others, us)))
    for _, _, thread, node in sorted(items, key=lambda x: (x[0], x[1])):
        add(node, thread)
    return nodes


def _compute(a: float, b: float, it: int, others: list[dict], us) -> _Node:
    """A compute node for the main thread's time [a, b], named after the events inside it."""
    parts: list[list] = []  # [kind, first layer, last layer]
    for e in sorted((e for e in others if a - 1e-6 <= e["ts"] < b), key=lambda e: e["ts"]):
        layer = e.get("layer")
        if parts and parts[-1][0] == e["kind"]:
            parts[-1][2] = layer if layer is not None else parts[-1][2]
        else:
            parts.append([e["kind"], layer, layer])
    name = ", ".join(k if l0 is None else (f"{k} {l0}" if l0 == l1 else f"{k} {l0}-{l1}") for k, l0, l1 in parts)
    return _Node(0, name or "compute", "COMP_NODE", it, int(a * 1e6), us(b - a))


def _comm(e: dict, it: int, world: int, us) -> _Node:
    """The communication node of event ``e`` (module docstring)."""
    start = int(e["ts"] * 1e6)
    dur = us(e.get("dur", 0.0))
    nbytes = int(e.get("bytes") or 0)
    if "dir" in e and "group_size" not in e:
        send = e["dir"] == "tx"
        attrs = {
            "comm_dst" if send else "comm_src": int(e["peer"]),
            "comm_size": nbytes,
            "comm_tag": int(e.get("tag") or 0),
        }
        return _Node(0, e["kind"], "COMM_SEND_NODE" if send else "COMM_RECV_NODE", it, start, dur, attrs)
    coll = _COLLECTIVE_KINDS.get(e["kind"])
    if coll is None:
        coll = ("REDUCE" if "dst" in e else "ALL_REDUCE") if "op" in e else "BROADCAST" if "src" in e else "ALL_GATHER"
    size = e.get("group_size") or world
    pb = et_def()
    attrs: dict = {
        "comm_type": pb.CollectiveCommType.Value(coll),
        "comm_size": nbytes * size if coll in _PART_EVENTS else nbytes,
    }
    members = e.get("group")
    if isinstance(members, list) and members:
        attrs["pg_name"] = "ranks " + ",".join(map(str, sorted(members)))
        attrs["pg_ranks"] = sorted(int(r) for r in members)
    else:
        attrs["pg_name"] = "0" if size == world else f"size {size}"
    root = e.get("src", e.get("dst"))
    if coll in ("BROADCAST", "REDUCE", "GATHER", "SCATTER") and root is not None:
        attrs["root"] = int(root)
    return _Node(0, e["kind"], "COMM_COLL_NODE", it, start, dur, attrs)
