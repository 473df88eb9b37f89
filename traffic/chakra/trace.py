"""A Chakra execution trace read, checked and put in replay order.

A trace is one file per rank, ``<prefix>.<rank>.et`` for ranks ``0 .. N-1`` (Chakra's naming,
as ASTRA-sim reads it). :func:`load_trace` reads every file with mlc-chakra's classes
(:mod:`traffic.chakra.proto`), checks it, and turns each rank's nodes into the steps its
process replays (:class:`Op`), iteration by iteration.

What a node becomes:

* ``COMP_NODE``: emulated compute of ``duration_micros`` (emulated microseconds; the replay
  dilates them by ``scale`` like any compute). Consecutive compute nodes of the replay order
  are one :class:`Op` (one sleep of their sum).
* ``COMM_COLL_NODE``: a collective of ``comm_size`` bytes (attribute ``comm_type``, one of
  :data:`COLLECTIVES`) over the node's group. For ``all_reduce``, ``broadcast``, ``reduce``
  and ``barrier`` ``comm_size`` is the tensor every member holds; for ``all_gather``,
  ``gather``, ``reduce_scatter``, ``scatter`` and ``all_to_all`` it is the whole buffer,
  ``group size x`` each member's part (ASTRA-sim's convention). Roots (``broadcast``,
  ``reduce``, ``gather``, ``scatter``) are the attribute ``root`` (a rank) or the group's first
  rank.
* ``COMM_SEND_NODE`` / ``COMM_RECV_NODE``: a point-to-point message of ``comm_size`` bytes to
  ``comm_dst`` / from ``comm_src`` (ranks), with tag ``comm_tag`` (0 when left out).
* ``METADATA_NODE``: nothing (it keeps its place in the dependencies).

A collective's group: the attribute ``pg_ranks`` (a list of ranks) when the node has it;
else the ranks whose traces hold a collective with the same ``pg_name`` (PyTorch's process
group name, which ``chakra_converter`` keeps); else every rank.

Order: a node runs after every node of its ``data_deps`` and ``ctrl_deps``. Each rank's nodes
are replayed one after another in a topological order that takes, among the nodes ready,
the one of the earliest iteration, then the smallest id. Iterations: the node attribute
``iteration`` (an integer; what ``testbed export chakra`` writes), else the ``N`` of the
nearest ``ProfilerStep#N`` node up its ``ctrl_deps`` (PyTorch's profiler steps); a node with
neither takes the latest iteration of its dependencies (the first iteration when it has
none). A trace with no iteration at all is one iteration.

Checks, each a :class:`~traffic.chakra.proto.TraceFileError` naming the file and the node
(id and name): a missing rank file, a truncated or malformed file, a node type or collective
the replay does not support, a missing ``comm_size``/``comm_type``/peer, a dependency on a
node the file does not have, a dependency cycle, a dependency on a later iteration, ranks
whose iteration counts differ, a group whose members do not issue the same collectives in the
same order, and a send without its receive (or the reverse).
"""

from __future__ import annotations

import heapq
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from traffic.chakra.proto import TraceFileError, attr_value, et_def, read_trace_file

__all__ = ["Op", "RankTrace", "Trace", "load_trace", "trace_files", "COLLECTIVES", "TraceFileError"]

#: Chakra's ``CollectiveCommType`` names the replay runs, and the name it runs them as
COLLECTIVES = {
    "ALL_REDUCE": "all_reduce",
    "ALL_GATHER": "all_gather",
    "REDUCE_SCATTER": "reduce_scatter",
    "REDUCE_SCATTER_BLOCK": "reduce_scatter",
    "ALL_TO_ALL": "all_to_all",
    "BROADCAST": "broadcast",
    "REDUCE": "reduce",
    "GATHER": "gather",
    "SCATTER": "scatter",
    "BARRIER": "barrier",
}
#: collectives whose ``comm_size`` is the whole buffer, ``group size x`` each member's part
PARTS = frozenset({"all_gather", "gather", "reduce_scatter", "scatter", "all_to_all"})
#: collectives with a root rank
ROOTED = frozenset({"broadcast", "reduce", "gather", "scatter"})

_STEP = re.compile(r"ProfilerStep#(\d+)$")
#: the last traces loaded, by their files' names, modification times and sizes
_LOADED: dict[tuple, Trace] = {}


@dataclass(frozen=True)
class Op:
    """One step of a rank's replay.

    Attributes:
        kind: ``compute``, ``collective``, ``send`` or ``recv``.
        nodes: the ids of the trace nodes it stands for (several for merged compute).
        name: the (first) node's name.
        seconds: compute: emulated seconds (the nodes' ``duration_micros`` summed / 1e6).
        collective: a name of :data:`COLLECTIVES` (kind ``collective``).
        nbytes: bytes (``comm_size``).
        group: the collective's ranks, sorted.
        root: the root rank of a rooted collective, else None.
        peer: the other end's rank (``send``, ``recv``).
        tag: the message's tag.
    """

    kind: str
    nodes: tuple[int, ...]
    name: str
    seconds: float = 0.0
    collective: str | None = None
    nbytes: int = 0
    group: tuple[int, ...] = ()
    root: int | None = None
    peer: int | None = None
    tag: int = 0


@dataclass
class RankTrace:
    """One rank's trace: its file and its steps, iteration by iteration (replay order)."""

    rank: int
    path: Path
    iterations: list[list[Op]] = field(default_factory=list)

    def ops(self) -> list[Op]:
        """Every step, in replay order."""
        return [op for it in self.iterations for op in it]


@dataclass
class Trace:
    """A whole trace: ``ranks[r]`` is rank ``r``'s."""

    prefix: str
    ranks: list[RankTrace]

    @property
    def world_size(self) -> int:
        """Number of ranks."""
        return len(self.ranks)

    @property
    def iterations(self) -> int:
        """Iterations of one pass over the trace (the same on every rank)."""
        return len(self.ranks[0].iterations) if self.ranks else 0


def trace_files(prefix: str | Path) -> list[Path]:
    """The files ``<prefix>.<rank>.et``, rank order.

    Raises:
        TraceFileError: none exist, or a rank between 0 and the highest is missing.
    """
    prefix = Path(prefix)
    folder = prefix.parent
    pat = re.compile(re.escape(prefix.name) + r"\.(\d+)\.et$")
    try:
        found = {int(m.group(1)): p for p in folder.iterdir() if (m := pat.match(p.name))} if folder.is_dir() else {}
    except OSError as e:
        raise TraceFileError(f"{folder}: cannot list the trace's folder ({e.strerror or e})") from None
    if not found:
        raise TraceFileError(
            f"{prefix}.<rank>.et: no such files (a Chakra trace is one file per rank, "
            f"{prefix.name}.0.et, {prefix.name}.1.et, ... in {folder})"
        )
    missing = [r for r in range(max(found) + 1) if r not in found]
    if missing:
        raise TraceFileError(
            f"{prefix}.{missing[0]}.et: missing (the trace has files up to rank {max(found)}; "
            f"ranks {', '.join(map(str, missing[:8]))} have none)"
        )
    return [found[r] for r in range(len(found))]


def load_trace(prefix: str | Path) -> Trace:
    """Read, check and order the trace ``<prefix>.<rank>.et`` (module docstring). A trace whose
    files have not changed since it was last loaded is not read again (the same object is
    returned: do not change it).

    Raises:
        TraceFileError: the first problem found, naming the file and the node (module docstring).
        MissingRequirement: mlc-chakra is not installed.
    """
    files = trace_files(prefix)
    try:
        stamp = (str(prefix), tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in files))
    except OSError as e:
        raise TraceFileError(f"{e.filename}: cannot read the trace file ({e.strerror or e})") from None
    if stamp in _LOADED:
        return _LOADED[stamp]
    raw = [_read_rank(r, p) for r, p in enumerate(files)]
    groups = _groups(raw)
    ranks = [_order(r, files[r], nodes, groups, len(files)) for r, nodes in enumerate(raw)]
    counts = {len(rt.iterations) for rt in ranks}
    if len(counts) > 1:
        by = ", ".join(f"{rt.path.name}: {len(rt.iterations)}" for rt in ranks)
        raise TraceFileError(f"{prefix}: the ranks' traces have different numbers of iterations ({by})")
    _check_collectives(ranks)
    _check_messages(ranks)
    if len(_LOADED) >= 8:
        _LOADED.clear()
    _LOADED[stamp] = trace = Trace(str(prefix), ranks)
    return trace


# ---------------------------------------------------------------------------------- reading


@dataclass
class _Node:
    id: int
    name: str
    type: str
    deps: tuple[int, ...]
    ctrl: tuple[int, ...]
    duration_us: int
    attrs: dict
    path: Path

    def label(self) -> str:
        return f"node {self.id} ({self.name!r})" if self.name else f"node {self.id}"

    def error(self, what: str) -> TraceFileError:
        return TraceFileError(f"{self.path}: {self.label()}: {what}")


_RUN = {"COMP_NODE", "COMM_COLL_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE", "METADATA_NODE"}


def _read_rank(rank: int, path: Path) -> dict[int, _Node]:
    pb = et_def()
    _, nodes = read_trace_file(path)
    out: dict[int, _Node] = {}
    for n in nodes:
        kind = pb.NodeType.Name(n.type) if n.type in pb.NodeType.values() else f"type {n.type}"
        node = _Node(
            n.id,
            n.name,
            kind,
            tuple(dict.fromkeys([*n.data_deps, *n.ctrl_deps])),
            tuple(n.ctrl_deps),
            n.duration_micros,
            {a.name: attr_value(a) for a in n.attr},
            path,
        )
        if n.id in out:
            raise node.error(f"a second node with id {n.id} (the first is {out[n.id].label()})")
        if kind not in _RUN:
            raise node.error(f"node type {kind} is not replayed (replayed: {', '.join(sorted(_RUN))})")
        if kind == "COMM_COLL_NODE":
            ct = node.attrs.get("comm_type")
            names = dict(zip(pb.CollectiveCommType.values(), pb.CollectiveCommType.keys()))
            if ct is None:
                raise node.error("a collective without the attribute comm_type")
            if names.get(ct) not in COLLECTIVES:
                raise node.error(
                    f"collective {names.get(ct, ct)} is not replayed (replayed: {', '.join(sorted(COLLECTIVES))})"
                )
            node.attrs["comm_type"] = COLLECTIVES[names[ct]]
        if kind.startswith("COMM_"):
            size = node.attrs.get("comm_size")
            if node.attrs.get("comm_type") != "barrier" and (not isinstance(size, int) or size < 0):
                raise node.error(f"comm_size {size!r}: a communication node needs its size in bytes (an integer >= 0)")
        peer_attr = {"COMM_SEND_NODE": "comm_dst", "COMM_RECV_NODE": "comm_src"}.get(kind)
        if peer_attr and not isinstance(node.attrs.get(peer_attr), int):
            raise node.error(f"{peer_attr} {node.attrs.get(peer_attr)!r}: the rank at the other end (an integer)")
        out[n.id] = node
    for node in out.values():
        for d in node.deps:
            if d not in out:
                raise node.error(f"depends on node {d}, which the file does not have")
    return out


def _groups(raw: list[dict[int, _Node]]) -> dict[str, tuple[int, ...]]:
    """pg_name -> the ranks whose traces hold a collective of that name."""
    members: dict[str, set[int]] = defaultdict(set)
    for r, nodes in enumerate(raw):
        for n in nodes.values():
            if n.type == "COMM_COLL_NODE" and isinstance(n.attrs.get("pg_name"), str):
                members[n.attrs["pg_name"]].add(r)
    return {k: tuple(sorted(v)) for k, v in members.items()}


# ---------------------------------------------------------------------------------- ordering


def _own_iteration(n: _Node) -> int | None:
    v = n.attrs.get("iteration")
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    m = _STEP.search(n.name)
    return int(m.group(1)) if m else None


def _iterations(nodes: dict[int, _Node]) -> dict[int, int | None]:
    """Each node's iteration: attribute ``iteration``, else the nearest ProfilerStep#N up its
    ctrl_deps (its callers; module docstring); None when neither."""
    out: dict[int, int | None] = {}
    for i in nodes:
        chain, v, seen = [], None, set()
        j = i
        while j is not None and j not in seen:
            if j in out:
                v = out[j]
                break
            seen.add(j)
            chain.append(j)
            v = _own_iteration(nodes[j])
            if v is not None:
                break
            j = next((c for c in nodes[j].ctrl if c in nodes), None)
        for k in chain:
            out[k] = v
    return out


def _order(rank: int, path: Path, nodes: dict[int, _Node], groups: dict[str, tuple[int, ...]], world: int) -> RankTrace:
    its = _iterations(nodes)
    children: dict[int, list[int]] = defaultdict(list)
    waiting = {i: len(n.deps) for i, n in nodes.items()}
    for i, n in nodes.items():
        for d in n.deps:
            children[d].append(i)
    # a node without an iteration takes its dependencies' latest (resolved as the order reaches it)
    it_of = dict(its)
    first = min((v for v in its.values() if v is not None), default=0)
    for i, c in waiting.items():
        if c == 0 and it_of[i] is None:
            it_of[i] = first
    ready = [(it_of[i], i) for i, c in waiting.items() if c == 0]
    heapq.heapify(ready)
    order: list[tuple[int, _Node]] = []
    while ready:
        it, i = heapq.heappop(ready)
        order.append((it, nodes[i]))
        for c in children[i]:
            if it_of[c] is not None and it_of[c] < it:
                raise nodes[c].error(f"iteration {it_of[c]} depends on {nodes[i].label()} of a later iteration {it}")
            waiting[c] -= 1
            if waiting[c] == 0:
                if it_of[c] is None:
                    it_of[c] = max([it_of[d] for d in nodes[c].deps if it_of[d] is not None], default=first)
                heapq.heappush(ready, (it_of[c], c))
    if len(order) < len(nodes):
        raise _cycle_error(nodes, {i for i, c in waiting.items() if c > 0})
    rt = RankTrace(rank, path)
    last_it = None
    for it, n in order:
        if it != last_it:
            rt.iterations.append([])
            last_it = it
        op = _op(n, rank, groups, world)
        if op is None:
            continue
        steps = rt.iterations[-1]
        if op.kind == "compute" and steps and steps[-1].kind == "compute":
            prev = steps[-1]
            steps[-1] = Op("compute", prev.nodes + op.nodes, prev.name, seconds=prev.seconds + op.seconds)
        else:
            steps.append(op)
    if not rt.iterations:
        rt.iterations.append([])
    return rt


def _cycle_error(nodes: dict[int, _Node], stuck: set[int]) -> TraceFileError:
    """The error naming one dependency cycle among the nodes ``stuck`` (each waits on another)."""
    start = min(stuck)
    path, seen = [start], {start: 0}
    while True:
        nxt = next(d for d in nodes[path[-1]].deps if d in stuck)
        if nxt in seen:
            cycle = path[seen[nxt] :] + [nxt]
            break
        seen[nxt] = len(path)
        path.append(nxt)
    first = nodes[cycle[0]]
    return first.error(
        "a dependency cycle: " + " -> ".join(nodes[i].label() for i in cycle) + " (each depends on the next)"
    )


def _op(n: _Node, rank: int, groups: dict[str, tuple[int, ...]], world: int) -> Op | None:
    if n.type == "METADATA_NODE":
        return None
    if n.type == "COMP_NODE":
        return Op("compute", (n.id,), n.name, seconds=n.duration_us / 1e6)
    size = int(n.attrs.get("comm_size") or 0)
    tag = n.attrs.get("comm_tag", 0)
    tag = tag if isinstance(tag, int) else 0
    if n.type in ("COMM_SEND_NODE", "COMM_RECV_NODE"):
        send = n.type == "COMM_SEND_NODE"
        peer = n.attrs["comm_dst" if send else "comm_src"]
        if not 0 <= peer < world or peer == rank:
            raise n.error(
                f"{'comm_dst' if send else 'comm_src'} {peer}: another rank of the trace's {world} "
                f"(0 to {world - 1}, not {rank} itself)"
            )
        return Op("send" if send else "recv", (n.id,), n.name, nbytes=size, peer=peer, tag=tag)
    coll = n.attrs["comm_type"]
    explicit = n.attrs.get("pg_ranks")
    if isinstance(explicit, list) and explicit:
        group = tuple(sorted(set(int(r) for r in explicit)))
    elif isinstance(n.attrs.get("pg_name"), str):
        group = groups[n.attrs["pg_name"]]
    else:
        group = tuple(range(world))
    if rank not in group or not all(0 <= r < world for r in group):
        raise n.error(f"group {list(group)}: ranks of the trace's {world} that include this one ({rank})")
    root = None
    if coll in ROOTED:
        root = n.attrs.get("root", group[0])
        if root not in group:
            raise n.error(f"root {root!r}: a rank of the collective's group {list(group)}")
    if coll in PARTS and size % len(group):
        raise n.error(
            f"comm_size {size} of {coll}: a multiple of the group's {len(group)} ranks (the whole "
            f"buffer, one equal part per rank)"
        )
    return Op("collective", (n.id,), n.name, collective=coll, nbytes=size, group=group, root=root, tag=tag)


# ---------------------------------------------------------------------------------- across ranks


def _check_collectives(ranks: list[RankTrace]) -> None:
    """Every member of a group issues the same collectives (kind, bytes, root) in the same order."""
    seqs: dict[tuple[int, ...], dict[int, list[Op]]] = defaultdict(lambda: defaultdict(list))
    for rt in ranks:
        for op in rt.ops():
            if op.kind == "collective":
                seqs[op.group][rt.rank].append(op)
    for group, by_rank in seqs.items():
        ref_rank = group[0]
        ref = by_rank.get(ref_rank, [])
        for r in group[1:]:
            mine = by_rank.get(r, [])
            for k in range(max(len(ref), len(mine))):
                a = ref[k] if k < len(ref) else None
                b = mine[k] if k < len(mine) else None
                if a is None or b is None or (a.collective, a.nbytes, a.root) != (b.collective, b.nbytes, b.root):

                    def say(rank, op):
                        if op is None:
                            return f"{ranks[rank].path} has no collective #{k + 1} on that group"
                        return (
                            f"{ranks[rank].path}: node {op.nodes[0]} ({op.name!r}) is {op.collective} of "
                            f"{op.nbytes} bytes"
                        )

                    raise TraceFileError(
                        f"collective #{k + 1} of group {list(group)} differs between ranks: "
                        f"{say(ref_rank, a)}; {say(r, b)} (every member must issue the same "
                        f"collectives in the same order)"
                    )


def _check_messages(ranks: list[RankTrace]) -> None:
    """Every send has its receive: the same bytes between the same ranks with the same tag."""
    sent: Counter = Counter()
    received: Counter = Counter()
    first: dict[tuple, tuple[RankTrace, Op]] = {}
    for rt in ranks:
        for op in rt.ops():
            if op.kind == "send":
                key = (rt.rank, op.peer, op.tag, op.nbytes)
                sent[key] += 1
            elif op.kind == "recv":
                key = (op.peer, rt.rank, op.tag, op.nbytes)
                received[key] += 1
            else:
                continue
            first.setdefault((op.kind, key), (rt, op))
    for key in sent.keys() | received.keys():
        if sent[key] != received[key]:
            src, dst, tag, nbytes = key
            kind = "send" if sent[key] > received[key] else "recv"
            rt, op = first[(kind, key)]
            other = dst if kind == "send" else src
            raise TraceFileError(
                f"{rt.path}: node {op.nodes[0]} ({op.name!r}): {sent[key]} sends of {nbytes} bytes from rank {src} "
                f"to rank {dst} (tag {tag}) but {received[key]} receives of them in {ranks[other].path}"
            )
