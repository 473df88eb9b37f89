"""Make a small Chakra execution trace here, without a network or a GPU (docs/chakra.md).

    .venv/bin/python scripts/make_chakra_trace.py --out DIR [--steps 2] [--ranks 2] [--clean]

1. Trains a tiny model with DistributedDataParallel for a few steps on ``--ranks`` CPU
   processes (gloo on localhost), each recorded by PyTorch's ``ExecutionTraceObserver`` (the
   host execution trace, ``host.<rank>.json``) and the Kineto profiler (``kineto.<rank>.json``):
   ``--steps`` profiled steps after one warm-up step.
2. Gives each host-trace node the times of its Kineto record (the same record function id):
   ``ts``, ``inclusive_dur`` and ``exclusive_dur`` (inclusive less its children's), as
   ``chakra_trace_link`` would. (mlc-chakra's ``chakra_trace_link`` needs PARAM's
   ``et_replay`` and HolisticTraceAnalysis, which are not on this machine's package index;
   on a CPU run it has no GPU kernels to link anyway.)
3. Converts each rank with mlc-chakra's ``chakra_converter PyTorch``.
4. ``chakra_converter`` makes communication nodes from GPU (NCCL) kernels only: on a CPU run
   gloo's collectives come out as compute nodes. Each ``c10d::<collective>_`` node is marked
   as the collective it is (``COMM_COLL_NODE``, ``comm_type``, ``comm_size``: the bytes of its
   input tensors, ``pg_name``: the default group's when the run has one group), and the
   ``gloo:<collective>`` nodes (gloo's work, waited for elsewhere) get no duration.

Writes ``DIR/ddp.<rank>.et``; the intermediate files stay in ``DIR/work`` unless ``--clean``.
``tests/data/chakra/ddp.*.et`` were made with ``--out tests/data/chakra --clean --strip-io``. Exit status 0,
or 1 when a step fails (its command and output are printed).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, schedule

NAME = "ddp"
#: ``c10d::<name>_`` of a collective -> Chakra's CollectiveCommType name
COLLECTIVES = {
    "allreduce": "ALL_REDUCE",
    "allgather": "ALL_GATHER",
    "_allgather_base": "ALL_GATHER",
    "allgather_into_tensor_coalesced": "ALL_GATHER",
    "reduce_scatter": "REDUCE_SCATTER",
    "_reduce_scatter_base": "REDUCE_SCATTER",
    "broadcast": "BROADCAST",
    "alltoall_base": "ALL_TO_ALL",
    "alltoall": "ALL_TO_ALL",
    "reduce": "REDUCE",
    "gather": "GATHER",
    "scatter": "SCATTER",
    "barrier": "BARRIER",
}
C10D = re.compile(r"c10d::(\w+?)_?$")


def train(rank: int, world: int, port: int, work: str, steps: int) -> None:
    """One DDP process: a warm-up step, then ``steps`` steps recorded."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model = DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    et = ExecutionTraceObserver().register_callback(f"{work}/host.{rank}.json")

    def ready(prof):
        prof.export_chrome_trace(f"{work}/kineto.{rank}.json")

    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=0, warmup=1, active=steps),
        on_trace_ready=ready,
        execution_trace_observer=et,
    ) as prof:
        for _ in range(steps + 1):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            prof.step()
    et.unregister_callback()
    dist.barrier()
    dist.destroy_process_group()


def link(host: Path, kineto: Path, out: Path) -> None:
    """``host`` with each node's Kineto times (module docstring, step 2), written to ``out``."""
    doc = json.loads(host.read_text())
    times = {}
    for e in json.loads(kineto.read_text()).get("traceEvents", []):
        rf = (e.get("args") or {}).get("Record function id")
        if rf is not None and e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation"):
            times[int(rf)] = (int(e["ts"]), int(round(e.get("dur", 0))))
    nodes = doc["nodes"]
    rf_of = {n["id"]: next((a["value"] for a in n.get("attrs", []) if a["name"] == "rf_id"), None) for n in nodes}
    children: dict[int, list[int]] = {}
    for n in nodes:
        children.setdefault(n["ctrl_deps"], []).append(n["id"])
    incl = {i: times[rf][1] for i, rf in rf_of.items() if rf in times}
    for n in nodes:
        if n["id"] in incl:
            n["ts"] = times[rf_of[n["id"]]][0]
            n["inclusive_dur"] = incl[n["id"]]
            n["exclusive_dur"] = max(incl[n["id"]] - sum(incl.get(c, 0) for c in children.get(n["id"], [])), 0)
    out.write_text(json.dumps(doc))


def collectives(host: Path) -> tuple[dict[int, tuple[str, int]], set[int], str | None]:
    """From a host trace: ``{node id: (collective, bytes)}`` of its ``c10d::`` collectives, the
    ids of its ``gloo:`` work nodes, and the default group's name when the run has one group."""
    doc = json.loads(host.read_text())
    colls, gloo, pg = {}, set(), None
    for n in doc["nodes"]:
        m = C10D.match(n["name"])
        if m and m.group(1) in COLLECTIVES:
            tensors = n["inputs"]["values"][0] if n["inputs"]["values"] else []
            tensors = tensors if tensors and isinstance(tensors[0], list) else [tensors] if tensors else []
            nbytes = sum(int(t[3]) * int(t[4]) for t in tensors if isinstance(t, list) and len(t) >= 5)
            colls[n["id"]] = (COLLECTIVES[m.group(1)], nbytes)
        elif n["name"].startswith("gloo:"):
            gloo.add(n["id"])
        elif n["name"] == "## process_group:init ##" and pg is None:
            groups = json.loads(n["inputs"]["values"][0])
            pg = str(groups[0]["pg_name"]) if len(groups) == 1 else None
    return colls, gloo, pg


def mark(
    et_file: Path, colls: dict[int, tuple[str, int]], gloo: set[int], pg: str | None, strip_io: bool = False
) -> int:
    """Rewrite ``et_file`` with its collectives marked (module docstring, step 4), and without its
    nodes' inputs and outputs (tensor values, shapes, types) when ``strip_io``; returns how many
    collectives were marked."""
    from chakra.schema.protobuf import et_def_pb2 as pb
    from chakra.src.third_party.utils.protolib import decodeMessage, encodeMessage

    with open(et_file, "rb") as f:
        meta = pb.GlobalMetadata()
        decodeMessage(f, meta)
        nodes = []
        while True:
            n = pb.Node()
            if not decodeMessage(f, n):
                break
            nodes.append(n)
    marked = 0
    for n in nodes:
        if strip_io:
            n.ClearField("inputs")
            n.ClearField("outputs")
        if n.id in gloo:
            n.duration_micros = 0
        if n.id in colls and n.type == pb.COMP_NODE:
            coll, nbytes = colls[n.id]
            n.type = pb.COMM_COLL_NODE
            n.duration_micros = 0
            n.attr.extend(
                [
                    pb.AttributeProto(name="comm_type", int64_val=pb.CollectiveCommType.Value(coll)),
                    pb.AttributeProto(name="comm_size", int64_val=nbytes),
                ]
            )
            if pg is not None:
                n.attr.append(pb.AttributeProto(name="pg_name", string_val=pg))
            marked += 1
    tmp = et_file.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        encodeMessage(f, meta)
        for n in nodes:
            encodeMessage(f, n)
    tmp.replace(et_file)
    return marked


def tool(name: str) -> str:
    """The path of one of mlc-chakra's commands (beside this interpreter, or on PATH)."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else (shutil.which(name) or name)


def run(cmd: list[str], cwd: Path) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    if proc.returncode != 0:
        print(
            f"make_chakra_trace: failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout}{proc.stderr}",
            file=sys.stderr,
        )
        raise SystemExit(1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for ddp.<rank>.et (created)")
    ap.add_argument("--steps", type=int, default=2, help="profiled training steps (default 2)")
    ap.add_argument("--ranks", type=int, default=2, help="DDP processes (default 2)")
    ap.add_argument("--clean", action="store_true", help="remove the intermediate files (DIR/work) at the end")
    ap.add_argument(
        "--strip-io",
        action="store_true",
        help="leave out the nodes' inputs and outputs (tensor values, shapes, types; the replay reads none): "
        "smaller files",
    )
    args = ap.parse_args(argv)
    out = Path(args.out)
    work = out / "work"
    if any(out.glob(f"{NAME}.*.et")) or work.exists():
        print(f"make_chakra_trace: {out} already holds a trace or a work folder; give another --out", file=sys.stderr)
        return 1
    work.mkdir(parents=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(train, args=(args.ranks, port, str(work), args.steps), nprocs=args.ranks, join=True)
    for r in range(args.ranks):
        host, linked, et = work / f"host.{r}.json", work / f"linked.{r}.json", out / f"{NAME}.{r}.et"
        link(host, work / f"kineto.{r}.json", linked)
        run(
            [
                tool("chakra_converter"),
                "--log-filename",
                str((work / f"converter.{r}.log").resolve()),
                "PyTorch",
                "--input",
                str(linked.resolve()),
                "--output",
                str(et.resolve()),
            ],
            cwd=work,
        )
        n = mark(et, *collectives(host), strip_io=args.strip_io)
        print(f"wrote {et} ({et.stat().st_size} bytes, {n} collectives)")
    if args.clean:
        shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
