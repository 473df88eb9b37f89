"""Benchmark: what each host cost really costs per operation here, and the scale it needs.

A host cost (``traffic.hostmodel.costs``) runs the real work, then waits until ``scale x``
the emulated cost has passed; real work longer than that is an *overrun*. So an emulated
host is only as fast as ``real cost per op / scale``. For every kind of host cost this prints
the real cost per operation on this machine of what the schemes do per operation, at the op
sizes of each paper's experiment spec (``experiments/*.yaml``), and, for every shipped host
profile (``traffic/hostmodel/data/*.yaml``, paired with its paper's setting) or ``--profile FILE``
(against every setting):

- the profile's emulated cost per op (median over the setting's ops of one iteration);
- ``scale: no overrun``: the smallest scale at which every op of one iteration fits its
  budget (``max`` over the ops of real / emulated, each op at its median real time);
- ``scale: <=5 %``: the smallest scale at which the overrun time is at most
  ``OVERRUN_THRESHOLD`` (5 %) of the budgeted time, the fraction that flags a run
  (``fidelity.host_cost_overrun``);
- or ``not modelled`` when the resolved value is None (the op takes its real time); no
  resolved rate is: a value a profile leaves null is the reference profile's
  (``traffic/hostmodel/data/reference.yaml``), as in a run.

The last column gives, at the spec's own ``scale``, the fastest emulated rate (or the
smallest emulated per-op cost) that this machine can honour without overruns: what a
profile's value must be at least (cost) or at most (rate) for the experiment to run clean.

What one operation is (the schemes' own work inside the charge, or the real path for the
kinds charged around no work):

- ``message``: one point-to-point message of a scheme: ``Transport.isend``/``irecv`` +
  ``Pending.wait`` with an event log (as in a run), between two processes over gloo on
  127.0.0.1; half the round trip of a 4-byte message. Its real cost is paid outside the
  charge (the charge itself wraps no work), so at a smaller scale the machine's own message
  time exceeds the emulated overhead instead of being counted as an overrun. (``phub``
  packs its chunks into frames, ``frame_bytes``, and charges each chunk as a message: its
  real cost per chunk is a frame's shared by the frame's chunks.)
- ``request_startup``: one iBatch pull request as the worker sees it on this machine: the
  worker posts the reply's receive and sends the 4-int64 request, the server receives it,
  decodes it, looks up its shards of the requested layers (the work inside the charge) and
  answers one element; the whole round trip. (``ps`` with ``pull_request: true`` answers
  requests the same way; no experiment spec sets it, so only iBatch's setting shows it.)
- ``aggregate``: PS-family servers (``ps``, ``p3``, ``ibatch``): the ``W`` copies of a
  shard/slice summed in place and divided by ``W``, charged ``W x`` its bytes; ``phub``
  (tall aggregation): one worker's copy of a frame added into the frame's sum (one real
  addition for the frame's chunks, :mod:`traffic.schemes.phub.update`), charged the frame's
  bytes, ``W`` per frame (with ``frame_bytes`` 0: per chunk); Pipe-SGD's ring: one ``blk.add_(part)`` of a ring block
  (model / p); Stanza: one recursive-doubling sum of the CONV workers' flat gradient.
- ``optimizer``: one ``step()`` of ``make_optimizer``'s SGD (momentum 0.9) on one
  shard/slice/PHub frame (Stanza: the FC worker's FC parameters).
- ``codec``: one ``encode`` or ``decode`` of a ring block (model / p), each charged the
  block's uncompressed bytes.
- ``compute``: emulated compute sleeps its budget (``PreciseSleeper``); no work can overrun
  it, but the sleep is late by the "real cost" shown (median |achieved - requested| of a
  precise sleep). Its scale columns: the smallest scale at which that error is at most 5 %
  of the shortest layer op (``no overrun`` column) and of the median layer op.

Figures are single-process medians on this machine (two processes for messages); a run packs
many processes onto the same cores, where every real cost is larger. The load average is
printed. Benchmarks print, they do not assert.

    .venv/bin/python benchmarks/host_costs.py [--quick] [--profile FILE ...] [--repeats N]
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from common.validation import load_yaml  # noqa: E402
from testbed.spec import expand_sweep, from_dict  # noqa: E402
from traffic.compression import make_codec  # noqa: E402
from traffic.compute_profiles import load_profile  # noqa: E402
from traffic.hostmodel import HostSpec, available_host_profiles  # noqa: E402
from traffic.hostmodel.costs import OVERRUN_THRESHOLD, PreciseSleeper  # noqa: E402
from traffic.hostmodel.measure import machine, run_pair, time_calls  # noqa: E402
from traffic.models import build_model  # noqa: E402
from traffic.runtime.events import EventLog  # noqa: E402
from traffic.runtime.trainer import make_optimizer  # noqa: E402
from traffic.runtime.transport import Transport  # noqa: E402
from traffic.schemes.p3 import SLICE_PARAMS, assign_slices  # noqa: E402
from traffic.schemes.phub import FRAME_BYTES, PHubOptions, assign_chunks, pack_frames  # noqa: E402
from traffic.schemes.phub.chunks import CHUNK_BYTES  # noqa: E402
from traffic.schemes.ps import BIGARRAY_BOUND, assign_keys  # noqa: E402
from traffic.spec import OptimizerSpec  # noqa: E402

EXPERIMENTS = ROOT / "experiments"
FIELD = {
    "message": "message_overhead_us",
    "request_startup": "request_startup_ms",
    "aggregate": "aggregate_gb_per_s",
    "optimizer": "optimizer_gb_per_s",
    "codec": "codec_gb_per_s",
}
RATE_KINDS = ("aggregate", "optimizer", "codec")


# ---------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Paper:
    """A paper's setting: a variant of an experiment spec and the host profile of its system."""

    profile: str
    spec: str
    variant: str
    label: str
    kinds: tuple
    options: tuple = ()  # (name, value) pairs replacing the variant's scheme options


PAPERS = (
    Paper(
        "phub_pbox",
        "phub_pbox.yaml",
        "pbox",
        "phub PBox, 32 KiB chunks (PHub Sec. 3.2.3) in the spec's frames",
        ("message", "aggregate", "optimizer"),
        (("chunk_bytes", CHUNK_BYTES),),
    ),
    Paper(
        "phub_pbox",
        "phub_pbox.yaml",
        "pbox",
        "phub PBox, 32 KiB chunks, one real op per chunk (frame_bytes 0)",
        ("aggregate", "optimizer"),
        (("chunk_bytes", CHUNK_BYTES), ("frame_bytes", 0)),
    ),
    Paper(
        "mxnet_kvstore_phub",
        "phub_pbox.yaml",
        "mxnet-cs",
        "ps CS (MXNet KVStore), keys per layer",
        ("message", "aggregate", "optimizer"),
    ),
    Paper("mxnet_p3", "p3_vgg19.yaml", "p3", "p3, slices of 50,000 parameters", ("message", "aggregate", "optimizer")),
    Paper(
        "bigdl_ibatch",
        "ibatch_googlenet.yaml",
        "ibatch",
        "ibatch, keys per layer",
        ("message", "request_startup", "aggregate", "optimizer"),
    ),
    Paper(
        "pipe_sgd_node",
        "pipe_sgd_timing.yaml",
        "Pipe-SGD+T",
        "pipe_sgd ring, block = model/p, truncation",
        ("message", "aggregate", "codec"),
    ),
    Paper(
        "pipe_sgd_node",
        "pipe_sgd_timing.yaml",
        "Pipe-SGD+Q",
        "pipe_sgd ring, block = model/p, quantization",
        ("codec",),
    ),
    Paper(
        "stanza_v100",
        "stanza_speedup_alexnet.yaml",
        "stanza",
        "stanza, CONV allreduce and FC update",
        ("message", "aggregate", "optimizer"),
    ),
)


@dataclass
class Point:
    """What a setting's ops depend on, read from its spec point."""

    paper: Paper
    spec_name: str
    scheme: str
    model: str
    workers: int
    servers: int
    scale: float
    options: dict
    compute: tuple  # (profile ref, batch size)


def load_point(paper: Paper) -> Point:
    """``paper.variant`` of its spec as the file states it (the sweep left out), with
    ``paper.options`` applied."""
    data = load_yaml((EXPERIMENTS / paper.spec).read_text())
    data.pop("sweep", None)
    point = next(exp for p, exp in expand_sweep(from_dict(data)) if p.get("variant") == paper.variant)
    w, topo = point.workload, point.topology
    hosts = topo.racks * topo.hosts_per_rack
    # stanza: CONV workers on every host but the FC workers' (traffic.schemes.stanza, Placement)
    fc = int((w.options or {}).get("fc_workers", 1)) if w.scheme == "stanza" else 0
    workers = w.workers or hosts - fc
    srv = w.servers
    servers = (srv.count or workers) * srv.interfaces
    return Point(
        paper,
        point.name,
        w.scheme,
        w.model,
        workers,
        servers,
        float(point.scale),
        {**dict(w.options or {}), **dict(paper.options)},
        (w.compute.profile, w.batch_size),
    )


# ---------------------------------------------------------------------------- ops of a setting


@dataclass(frozen=True)
class Op:
    """One kind of operation: ``count`` per iteration, charged ``nbytes``; ``shape`` keys its
    real-time measurement (``(work, numel, copies)``)."""

    shape: tuple
    nbytes: int
    count: int


@functools.cache
def _numels(model_name: str):
    """(elements of each key, the model's ``split_index``, the model on the meta device)."""
    model = build_model(model_name, 0, device="meta")
    return [p.numel() for p in model.parameters()], getattr(model, "split_index", None), model


def setting_ops(pt: Point, kind: str) -> list[Op]:
    """The ops of ``kind`` in one iteration of the setting (all processes)."""
    numels, split, model = _numels(pt.model)
    W, S, sch, o = pt.workers, pt.servers, pt.scheme, pt.options
    if kind in ("aggregate", "optimizer") and sch in ("ps", "p3", "ibatch", "phub"):
        if sch == "p3":
            sizes = [s.numel for s in assign_slices(numels, S, o.get("slice_params", SLICE_PARAMS))]
        elif sch == "phub":  # one real op per frame (one per chunk with frame_bytes 0), charged per chunk
            sizes = [f.numel for f in _phub_frames(pt.model, S, o)]
        else:
            sizes = [s.numel for s in assign_keys(numels, S, o.get("bigarray_bound", BIGARRAY_BOUND))]
        if sch == "phub" and kind == "aggregate":  # tall: each copy added as it arrives, charged the chunk's bytes
            return _count([("add", n, 1) for n in sizes for _ in range(W)], lambda sh: sh[1] * 4)
        return _count(
            [("sum_average", n, W) if kind == "aggregate" else ("sgd_step", n, 1) for n in sizes],
            lambda sh: sh[1] * 4 * sh[2],
        )
    if sch == "pipe_sgd" and kind in ("aggregate", "codec"):
        n, p = sum(numels), W
        blocks = [b.numel() for b in torch.tensor_split(torch.empty(n, device="meta"), p)]
        if kind == "aggregate":  # p-1 reduce-scatter sums per worker
            return _count([("add", b, 1) for b in blocks for _ in range(p - 1)], lambda sh: sh[1] * 4)
        codec = o.get("compression", "none")  # per worker: p encodes, 2p-1 decodes (traffic.collectives.ring)
        return _count(
            [(f"{codec}_encode", b, 1) for b in blocks for _ in range(p)]
            + [(f"{codec}_decode", b, 1) for b in blocks for _ in range(2 * p - 1)],
            lambda sh: sh[1] * 4,
        )
    if sch == "stanza" and kind in ("aggregate", "optimizer"):
        conv = sum(p.numel() for layer in model.layers[:split] for p in layer.parameters())
        fc = sum(numels) - conv
        if kind == "aggregate":  # recursive doubling: log2(n_c) sums of the flat CONV gradient per worker
            return _count([("add", conv, 1)] * (W * max(1, int(math.log2(W)))), lambda sh: sh[1] * 4)
        return _count([("sgd_step", fc, 1)], lambda sh: sh[1] * 4)  # one FC worker (fc_workers: 1)
    raise ValueError(f"no {kind} ops for scheme {sch}")


def _phub_frames(model_name: str, interfaces: int, o: dict):
    """The frames a PHub server set of ``interfaces`` processes works on (the scheme's own
    :func:`assign_chunks` and :func:`pack_frames` on the model's keys)."""
    numels, _, model = _numels(model_name)
    layer_of_key = [li for li, layer in enumerate(model.layers) for _ in layer.parameters()]
    chunks = assign_chunks(
        numels,
        o.get("chunk_bytes", CHUNK_BYTES) // 4,
        interfaces,
        o.get("server_threads", PHubOptions().server_threads),
    )
    return pack_frames(chunks, o.get("frame_bytes", FRAME_BYTES) // 4, lambda c: layer_of_key[c.key])


def _count(shapes: list[tuple], nbytes) -> list[Op]:
    counts: dict[tuple, int] = {}
    for sh in shapes:
        counts[sh] = counts.get(sh, 0) + 1
    return [Op(sh, nbytes(sh), c) for sh, c in counts.items()]


# ---------------------------------------------------------------------------- real costs


def _work(shape: tuple):
    """A callable doing one op of ``shape`` (buffers allocated once)."""
    work, n, copies = shape
    g = torch.Generator().manual_seed(0)
    if work == "sum_average":  # ps.run_server / phub: sum the W copies in place, then / W
        bufs = [torch.randn(n, generator=g) for _ in range(copies)]

        def op():
            acc = bufs[0]
            for b in bufs[1:]:
                acc += b
            acc /= copies

        return op
    if work == "add":
        acc, part = torch.randn(n, generator=g), torch.randn(n, generator=g)
        return lambda: acc.add_(part)
    if work == "sgd_step":
        p = torch.nn.Parameter(torch.randn(n, generator=g))
        p.grad = torch.randn(n, generator=g) * 1e-3
        return make_optimizer([p], OptimizerSpec()).step
    codec_name, _, what = work.rpartition("_")
    codec = make_codec(codec_name)
    x = torch.randn(n, generator=g)
    payload = codec.encode(x)
    return (lambda: codec.encode(x)) if what == "encode" else (lambda: codec.decode(payload, n))


class RealCosts:
    """Median real seconds per op shape, measured once each."""

    def __init__(self, repeats: int):
        self.repeats = repeats
        self.s: dict[tuple, float] = {}

    def of(self, shape: tuple) -> float:
        if shape not in self.s:
            fn = _work(shape)
            t1 = time_calls(fn, 1, warmup=1)[0]
            reps = self.repeats if t1 < 0.02 else max(3, min(self.repeats, int(0.5 / t1)))
            self.s[shape] = statistics.median(time_calls(fn, reps, warmup=2))
            del fn
        return self.s[shape]


def _transport_ping_pong(rank: int, n: int, log_dir: str) -> list[float] | None:
    """run_pair target: ``n`` round trips of a 4-byte message through :class:`Transport`
    (post the receive, ``isend``, wait both, as the schemes do), event log on."""
    tr = Transport(EventLog(Path(log_dir) / f"p{rank}.jsonl", f"p{rank}", "worker", rank), rank, 2)
    buf, out = torch.zeros(1), []
    for i in range(3 + n):
        if rank == 0:
            t0 = time.perf_counter()
            rx = tr.irecv(buf, 1, tag=1, kind="pull")
            tr.isend(buf, 1, tag=0, kind="push").wait()
            rx.wait()
            if i >= 3:
                out.append(time.perf_counter() - t0)
        else:
            tr.irecv(buf, 0, tag=0, kind="push").wait()
            tr.isend(buf, 0, tag=1, kind="pull").wait()
    return out if rank == 0 else None


def _request_round_trips(rank: int, n: int, shard_layers: list[int], log_dir: str) -> list[float] | None:
    """run_pair target: ``n`` iBatch pull requests (traffic.schemes.ibatch ``_request`` /
    ``_serve``): worker posts the reply receive and sends ``[kind, lo, hi, it]`` (int64);
    server receives, decodes, looks up its shards of layers ``[lo, hi)``, answers one element."""
    tr = Transport(EventLog(Path(log_dir) / f"p{rank}.jsonl", f"p{rank}", "worker", rank), rank, 2)
    L = max(shard_layers) + 1
    out = []
    req = torch.empty(4, dtype=torch.int64)
    for i in range(3 + n):
        lo = i % L
        if rank == 0:
            t0 = time.perf_counter()
            buf = torch.empty(1)
            rx = tr.irecv(buf, 1, tag=12, kind="pull_reply")
            tr.isend(torch.tensor([0, lo, lo + 1, i], dtype=torch.int64), 1, tag=11, kind="pull_request").wait()
            rx.wait()
            if i >= 3:
                out.append(time.perf_counter() - t0)
        else:
            tr.recv(req, 0, tag=11, kind="pull_request")
            kind, lo, hi, it = (int(x) for x in req)
            now = [j for j, layer in enumerate(shard_layers) if lo <= layer < hi]  # the shard lookup
            tr.isend(torch.zeros(1) + len(now), 0, tag=12, kind="pull_reply").wait()
    return out if rank == 0 else None


def _ibatch_shard_layers(pt: Point) -> list[int]:
    """Layer of every shard one server of the setting holds (server 0)."""
    _, _, model = _numels(pt.model)
    key_layer = [l for l, layer in enumerate(model.layers) for _ in layer.parameters()]
    numels = [p.numel() for p in model.parameters()]
    return [key_layer[s.key] for s in assign_keys(numels, pt.servers) if s.server == 0]


def sleep_errors(n: int) -> list[float]:
    """|achieved - requested| seconds of ``n`` PreciseSleeper sleeps cycling 0.1, 0.5, 1, 5 ms."""
    sl, out = PreciseSleeper(), []
    ds = (1e-4, 5e-4, 1e-3, 5e-3)
    for i in range(n):
        d = ds[i % len(ds)]
        t0 = time.perf_counter()
        sl.sleep(d)
        out.append(abs(time.perf_counter() - t0 - d))
    return out


# ---------------------------------------------------------------------------- scales


def scale_no_overrun(ops: list[Op], real: dict, emul: dict) -> float:
    """max over ops of real / emulated."""
    return max(real[o.shape] / emul[o] for o in ops)


def worst_op(ops: list[Op], real: dict, emul: dict) -> Op:
    """The op of the largest real / emulated."""
    return max(ops, key=lambda o: real[o.shape] / emul[o])


def scale_threshold(ops: list[Op], real: dict, emul: dict, frac: float = OVERRUN_THRESHOLD) -> float:
    """Smallest s with sum c*max(0, r - s e) <= frac * sum c*s*e (bisection)."""

    def excess(s):
        over = sum(o.count * max(0.0, real[o.shape] - s * emul[o]) for o in ops)
        return over - frac * s * sum(o.count * emul[o] for o in ops)

    lo, hi = 0.0, scale_no_overrun(ops, real, emul)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if excess(mid) > 0 else (lo, mid)
    return hi


def _median_w(values: list[float], weights: list[int]) -> float:
    pairs = sorted(zip(values, weights))
    half, acc = sum(weights) / 2, 0
    for v, w in pairs:
        acc += w
        if acc >= half:
            return v
    return pairs[-1][0]


def fmt_s(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    if s >= 1e-6:
        return f"{s * 1e6:.1f} us"
    return f"{s * 1e9:.1f} ns"


def fmt_b(b: float) -> str:
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if b >= f:
            return f"{b / f:.3g} {unit}"
    return f"{b:.0f} B"


def fmt_scale(x: float) -> str:
    return f"{x:.3g}" if x < 1e4 else f"{x:.2e}"


def table(rows: list[list[str]], header: list[str]) -> str:
    w = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w[i]) for i, c in enumerate(r)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (x + 2) for x in w) + "|"] + [line(r) for r in rows])


# ---------------------------------------------------------------------------- main


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke test: few repetitions, two settings")
    ap.add_argument("--repeats", type=int, default=30, help="timed repetitions of each op shape (median)")
    ap.add_argument("--round-trips", type=int, default=1000, help="timed message and request round trips")
    ap.add_argument(
        "--profile",
        action="append",
        default=[],
        metavar="FILE",
        help="a host profile file to evaluate against every setting (repeatable)",
    )
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as the runtime's)")
    a = ap.parse_args(argv)
    if a.quick:
        a.repeats, a.round_trips = 3, 30
    torch.set_num_threads(a.threads)
    papers = PAPERS if not a.quick else (PAPERS[0], PAPERS[4], PAPERS[5])  # phub 32 KiB, ibatch, pipe_sgd +T
    print(f"host costs on {machine(a.threads)}; load average {os.getloadavg()[0]:.2f} (1 min) at start")
    points = {p: load_point(p) for p in papers}

    # profiles and the settings each is evaluated at
    evals: list[tuple[str, str, Paper]] = []  # (profile ref, shown name, setting)
    for name in available_host_profiles():
        mine = [p for p in papers if p.profile == name]
        if a.quick and not mine:
            continue
        evals += [(name, name, p) for p in (mine or papers)]
    evals += [(f, Path(f).name, p) for f in a.profile for p in papers]
    models = {ref: HostSpec(profile=ref).resolve() for ref, _, _ in evals}
    values = {ref: HostSpec(profile=ref).pinned() for ref, _, _ in evals}  # as a run resolves them

    t_start = time.perf_counter()
    real = RealCosts(a.repeats)
    with tempfile.TemporaryDirectory() as tmp:
        rtt = run_pair(_transport_ping_pong, (a.round_trips, tmp), threads=a.threads)
        msg_s = statistics.median(rtt) / 2
        ib = next((p for p in papers if "request_startup" in p.kinds), None)
        req_s = None
        if ib is not None:
            req = run_pair(
                _request_round_trips, (a.round_trips, _ibatch_shard_layers(points[ib]), tmp), threads=a.threads
            )
            req_s = statistics.median(req)
    print(
        f"message: 4-byte message through Transport (gloo, 127.0.0.1), half round trip: median {fmt_s(msg_s)} "
        f"({len(rtt)} round trips)"
    )
    if req_s is not None:
        print(
            f"request_startup: iBatch pull request round trip (request, lookup, one-element answer): median "
            f"{fmt_s(req_s)} ({a.round_trips} requests)"
        )
    errs = sleep_errors(40 if a.quick else 400)
    err_s = statistics.median(errs)
    p99 = sorted(errs)[min(len(errs) - 1, int(0.99 * len(errs)))]
    print(
        f"compute: PreciseSleeper |achieved - requested| over sleeps of 0.1-5 ms: median {fmt_s(err_s)}, "
        f"p99 {fmt_s(p99)}"
    )

    header = [
        "kind",
        "setting (spec, variant, model)",
        "ops/iter",
        "bytes/op",
        "real/op",
        "profile",
        "emulated/op",
        "scale: no overrun",
        f"scale: <={OVERRUN_THRESHOLD:.0%} overrun",
        "at the spec's scale",
    ]
    for kind in ("message", "request_startup", "aggregate", "optimizer", "codec"):
        rows = []
        for ref, shown, paper in evals:
            if kind not in paper.kinds:
                continue
            pt = points[paper]
            where = f"{paper.label} ({pt.paper.spec}, {paper.variant}, {pt.model}, W={pt.workers})"
            value = values[ref][FIELD[kind]]
            if kind in ("message", "request_startup"):
                r = msg_s if kind == "message" else req_s
                bound = f"needs >= {fmt_s(r / pt.scale)} at scale {pt.scale:g}"
                if value is None:
                    rows.append([kind, where, "", "", fmt_s(r), shown, "not modelled", "", "", bound])
                    continue
                e = models[ref].cost_s(kind)
                rows.append(
                    [
                        kind,
                        where,
                        "",
                        "",
                        fmt_s(r),
                        shown,
                        fmt_s(e),
                        fmt_scale(r / e) if e else "inf",
                        fmt_scale(r / e / (1 + OVERRUN_THRESHOLD)) if e else "inf",
                        bound,
                    ]
                )
                continue
            ops = setting_ops(pt, kind)
            r = {o.shape: real.of(o.shape) for o in ops}
            n_ops = sum(o.count for o in ops)
            med_bytes = _median_w([o.nbytes for o in ops], [o.count for o in ops])
            med_real = _median_w([r[o.shape] for o in ops], [o.count for o in ops])
            fastest = min(o.nbytes * pt.scale / r[o.shape] for o in ops) / 1e9
            bound = f"rate <= {fastest:.3g} GB/s at scale {pt.scale:g}"
            if value is None:
                rows.append(
                    [kind, where, n_ops, fmt_b(med_bytes), fmt_s(med_real), shown, "not modelled", "", "", bound]
                )
                continue
            emul = {o: models[ref].cost_s(kind, o.nbytes) for o in ops}
            med_emul = _median_w([emul[o] for o in ops], [o.count for o in ops])
            rows.append(
                [
                    kind,
                    where,
                    n_ops,
                    fmt_b(med_bytes),
                    fmt_s(med_real),
                    shown,
                    fmt_s(med_emul),
                    f"{fmt_scale(scale_no_overrun(ops, r, emul))} (op of {fmt_b(worst_op(ops, r, emul).nbytes)})",
                    fmt_scale(scale_threshold(ops, r, emul)),
                    bound,
                ]
            )
        if rows:
            print(f"\n## {kind}\n")
            print(table(rows, header))

    # compute: the specs' layer times against the sleep error
    rows, seen = [], set()
    for pt in points.values():
        ref, batch = pt.compute
        if pt.spec_name in seen:
            continue
        seen.add(pt.spec_name)
        path_ref = ref.endswith(".json") and not Path(ref).is_absolute()  # spec paths are relative to the repo
        prof = load_profile(str(ROOT / ref) if path_ref else ref, pt.model, batch)
        t = [x for x in prof.forward_s() + prof.backward_s() if x > 0]
        if not t:
            continue
        rows.append(
            [
                "compute",
                f"{pt.spec_name} ({pt.model}, {ref}, b{batch})",
                len(t),
                fmt_s(err_s),
                fmt_s(min(t)),
                fmt_s(statistics.median(t)),
                fmt_scale(err_s / (OVERRUN_THRESHOLD * min(t))),
                fmt_scale(err_s / (OVERRUN_THRESHOLD * statistics.median(t))),
                f"{pt.scale:g}",
            ]
        )
    print("\n## compute (sleep precision)\n")
    print(
        table(
            rows,
            [
                "kind",
                "spec (model, profile, batch)",
                "layer ops",
                "real/op: sleep error",
                "shortest op",
                "median op",
                f"scale: shortest within {OVERRUN_THRESHOLD:.0%}",
                f"scale: median within {OVERRUN_THRESHOLD:.0%}",
                "spec's scale",
            ],
        )
    )
    print(f"\n{time.perf_counter() - t_start:.0f} s; load average {os.getloadavg()[0]:.2f} (1 min) at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
