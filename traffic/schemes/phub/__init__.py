"""PHub (``phub``): a rack-scale parameter server, PHub paper (Luo et al., SoCC 2018), Sec. 3.

A parameter server (:class:`~traffic.schemes.ps.ParameterServer`: workers push gradients,
servers average them, apply ``torch.optim.SGD`` and send the new parameters back) with PHub's
software design on top of any PS placement (``workload.servers``: CC, CS, NCC, NCS, PHub
Sec. 2.1 and Fig. 4). A *PBox* (Sec. 3.3) is a dedicated server host with ``k`` interfaces to
its ToR (``workload.servers.interfaces``); the PBox runs one server process per interface
(gloo binds one interface per process), each with ``server_threads`` aggregation threads.

* **Fine-grained key chunking** (Sec. 3.2.3): every key (parameter tensor) is cut into
  *chunks* of ``chunk_bytes`` (option, default 32 KB, PHub's default; MXNet uses 4 MB), the
  last chunk of a key holding the rest. Chunking is on even with a single central server.
* **Mapping a chunk to an interface and a core** (Sec. 3.2.4): at initialisation every chunk
  is given a server process (interface) and, within it, a server thread, by Graham's
  longest-processing-time-first rule on the chunks' bytes at each level (interfaces, then
  the threads of each interface), a 4/3-approximation of the balanced set partition the
  paper uses (:func:`assign_chunks`). A chunk is always pushed to, aggregated, optimized and
  sent back by that same (process, thread).
* **Tall aggregation** (Sec. 3.2.2, Fig. 7): each server thread owns its chunks; it adds a
  worker's copy of a chunk into the chunk's aggregation buffer as soon as the copy is in
  (copies already received are added first), and once every worker's copy is in, the same
  thread averages, applies the optimizer to the chunk and sends it back to every worker at
  once. Threads never synchronize with each other; chunks of different keys and threads
  are aggregated while other chunks are still arriving. A thread keeps the receives of its
  next frames posted ahead (``RECV_WINDOW_BYTES`` = 64 MB of copies), so a push rarely
  waits for its receive while the server's memory stays bounded.
* **Fused push_pull** (Sec. 3.1): a worker's push of a chunk is answered by the chunk's new
  values; there is no pull request. The worker posts the receive of the new values before it
  pushes. With ``overlap`` (default true: MXNet's eager scheduling, as the paper ran PHub
  inside MXNet) a layer's chunks are pushed as soon as its backward is done and the
  forward pass waits, layer by layer, only for that layer's chunks; ``overlap: false`` pushes
  and pulls everything after the backward pass.
* **Multi-tenancy and access control** (Sec. 3.1): option ``jobs`` splits the workers into
  equal groups (``worker0..``: job 0 first), each an independent training job with its own
  *key namespace* (its own chunks, tags, values and optimizer state on the servers) and a
  per-job *token*: the job's first worker (``CreateService``) draws a random 63-bit token,
  gives it to the job's workers and registers ``(job, token)`` with every server process.
  Every worker then connects (``ConnectService``) to each server process it uses, naming its
  namespace and presenting the token, and every push carries the token in 8 bytes of
  metadata after the chunk's payload (PHub carries its metadata with each message, Sec.
  3.2.1). A push whose token is wrong is *rejected*: counted, logged (event ``reject``), not
  aggregated, and answered with a rejection status instead of the parameters, so a pull with
  a wrong token gets nothing either. Option ``bad_token_worker: j`` (tests) makes worker
  ``j`` an intruder outside every job that connects to job 0's namespace with a token it
  made up and pushes its gradients there; the servers listen to it (a transport message must
  be received to be refused), reject each push, and job 0 trains exactly as without it.
  Each job trains the model from the same seed on global batches of its own ``m`` workers
  (``traffic.data.GlobalBatches`` with ``m`` workers), so job ``g`` equals the
  single-process reference of ``m`` workers. Jobs progress independently: every server
  thread runs one serving loop per job (thread ``srv<t>-job<g>``), so no job waits for
  another's round or for another's chunk ahead of its own.
* **Hierarchical reduction** (Sec. 3.4, Fig. 10): option ``hierarchical: true`` with one
  PBox per rack (``servers: {placement: dedicated, scope: per_rack, count: 1}``): each
  worker pushes to its own rack's PBox; each PBox sums its rack's copies of a chunk; the
  PBox processes of the same interface index in every rack then sum their partial sums with
  a ring allreduce over point-to-point transfers (:func:`traffic.collectives.ring
  .ring_allreduce`: reduce-scatter then all-gather, the "widely used ring reduction" of Sec.
  4.8), run by the chunk's thread; each PBox then averages, applies the optimizer (every
  PBox holds an identical replica of the model) and sends the chunk to its own rack's
  workers. Cross-rack traffic drops to ``1/N`` of the flat scheme's with ``N`` workers per
  rack, at the cost of ``2(R-1)`` extra ring steps. ``hierarchical: auto`` uses it when the
  inequality of Sec. 3.4 (:func:`~traffic.schemes.phub.hierarchy.hierarchical_pays`) holds
  for the spec's bandwidths; ``false`` (default) is the flat scheme: chunks spread over every server
  process of every PBox (an array of sharded PSs).

* **Frames** (this testbed's, not PHub's): the chunks a worker sends to one server process
  and thread, of one layer, travel in *frames* of at most ``frame_bytes`` of payload (option,
  default 256 KB; 0: one message per chunk), one transport message each
  (:mod:`~traffic.schemes.phub.frames`), because a message costs real Python and gloo time
  at both ends (measured in ``docs/schemes.md``, "phub"). Each chunk keeps its own metadata slots, is checked
  and charged its host costs one by one, so the parameters, the bytes on the wire and the
  host costs are those of one message per chunk. The real sums and optimizer steps are done
  per frame copy and per frame where that gives the same values
  (:mod:`~traffic.schemes.phub.update`), so that their real time stays within the chunks'
  budgets at 32 KB.

**Host costs** (:mod:`traffic.hostmodel.costs`, rates from the spec's ``host:``; spans one
per frame, :mod:`~traffic.schemes.phub.charges`): on a server, every chunk copy added as it
arrives is charged ``aggregate`` (the chunk's bytes; Sec. 3.2.2: "Aggregation is simply
vector addition"), every chunk's optimizer step ``optimizer`` (the chunk's bytes; Sec.
3.2.2: "the thread that aggregates a particular chunk also optimizes that chunk"), and with
hierarchical reduction the ring's local sums ``aggregate`` (Sec. 4.8: "each performing one
additional aggregation"). Every chunk message sent or received, on workers and servers, is
charged ``message`` (the per-message software overhead, when the host model states one):
frames are sent with ``message=False`` and their chunks charged one by one.

What frames cannot save is the per-chunk work (checks, sums, optimizer step, charges) and
the bytes' copy through loopback; the server's CPU per chunk at each ``frame_bytes`` was
measured with ``testbed.loopback`` (``docs/schemes.md``, "phub").

Server processes and tags: chunk ``c`` of job ``g`` has the global id ``c.id = g * n + i``
(``n`` chunks per namespace); frames are numbered by their first chunk's id (every job's
chunks, :func:`pack_frames`); frame ``f``'s id is the tag of its push, pull and init
messages; ring step ``s`` of frame ``f`` uses tag ``RING_TAG + f.id * 2(R-1) + s``.

Events (each with ``iteration``, ``layer``, ``frame``/``shard``/``slice`` (the frame id),
``chunks`` (the frame's chunk ids), ``job``, ``iface`` (the frame's interface index),
``server_thread``, ``priority``, ``bytes``): workers ``push`` (dir tx, on the ``comm``
thread) and ``pull`` (dir rx); servers ``push`` (dir rx) and ``pull`` (dir tx; or
``reject_reply`` to a sender all of whose chunks were refused) on thread ``srv<t>``
(``srv<t>-job<g>`` with several jobs), ``update`` (span of a frame's ring, averages and
optimizer steps), ``reject`` (instant: ``op`` push (with the ``chunk``) or connect,
``peer``), the host-cost spans ``host_aggregate``, ``host_optimizer``, ``host_message``
(one per frame copy or frame, ``ops`` charges each), and with hierarchical reduction the
ring's ``reduce_scatter``/``all_gather`` transfers. Set-up messages: ``token``,
``create_service``, ``connect``, ``init``.

Results (``results/<proc>.json``): workers ``job``, ``job_workers``, ``rejected_pulls``
(chunks; a job's throughput is the analysis's, from ``iterations.csv``); servers
``rejected_pushes`` (chunk copies), ``rejected_connects``, ``chunks``, ``frames``,
``chunk_bytes``, ``frame_bytes``, ``hierarchical``, ``serve_cpu_s`` (CPU seconds of the
server process, all threads, while serving).

Modules: :mod:`~traffic.schemes.phub.chunks` (chunks and their placement),
:mod:`~traffic.schemes.phub.frames` (chunks packed into messages),
:mod:`~traffic.schemes.phub.tenancy` (jobs, tokens, metadata),
:mod:`~traffic.schemes.phub.aggregation` (tall aggregation on a server thread),
:mod:`~traffic.schemes.phub.charges` (host costs per chunk, spans per frame),
:mod:`~traffic.schemes.phub.update` (a frame's optimizer step),
:mod:`~traffic.schemes.phub.hierarchy` (cross-rack ring, Sec. 3.4's inequality); this
module holds the scheme (:class:`PHub`, options :class:`PHubOptions`).
"""

from __future__ import annotations

import math
import threading
import time
from functools import partial
from typing import Literal

import torch
from pydantic import Field, field_validator

from common.errors import SpecError
from topologies.hosts import HostInfo
from traffic.data import GlobalBatches
from traffic.runtime.trainer import make_optimizer
from traffic.runtime.transport import Pending
from traffic.schemes import register
from traffic.schemes.base import ProcessPlan, SchemeOptions, count_roles, gradient_sync_bytes, model_keys
from traffic.schemes.phub.aggregation import RECV_WINDOW_BYTES, recv_window, tall_aggregate
from traffic.schemes.phub.charges import charge_messages
from traffic.schemes.phub.chunks import CHUNK_BYTES, ELEMENT_BYTES, Chunk, assign_chunks, lpt
from traffic.schemes.phub.frames import FRAME_BYTES, Frame, pack_frames, refused_reply
from traffic.schemes.phub.hierarchy import RING_TAG, hierarchical_pays, host_racks, ring_messages, ring_reduce
from traffic.schemes.phub.tenancy import (
    ACCEPTED,
    META,
    REJECTED,
    SETUP_TAG,
    JobShards,
    job_groups,
    new_token,
    token_meta,
)
from traffic.schemes.phub.update import step_frame
from traffic.schemes.ps import ParameterServer

__all__ = [
    "CHUNK_BYTES",
    "FRAME_BYTES",
    "ELEMENT_BYTES",
    "META",
    "ACCEPTED",
    "REJECTED",
    "RING_TAG",
    "SETUP_TAG",
    "RECV_WINDOW_BYTES",
    "Chunk",
    "Frame",
    "assign_chunks",
    "pack_frames",
    "lpt",
    "job_groups",
    "host_racks",
    "hierarchical_pays",
    "PHubOptions",
    "PHub",
]


class PHubOptions(SchemeOptions):
    """Options of ``phub`` (chunks replace ``ps``'s key split: no ``bigarray_bound``).

    Frames (``frame_bytes``) pack several chunks into one transport message, because each
    real message costs Python and gloo CPU time at both ends (measured in ``docs/schemes.md``);
    the chunks inside are still handled and charged one by one, as PHub's messages."""

    chunk_bytes: int = Field(CHUNK_BYTES, gt=0)
    """Bytes per chunk, a multiple of 4 (float32 elements); the last chunk of a key holds
    the rest (PHub Sec. 3.2.3: PHub's default 32 KB; MXNet uses 4 MB)."""
    server_threads: int = Field(2, gt=0)
    """Aggregation threads per server process; chunks are balanced over them (Sec. 3.2.4)."""
    hierarchical: bool | Literal["auto"] = False
    """``false`` (flat: chunks over every server process), ``true`` (one PBox per rack, ring
    across racks, Sec. 3.4) or ``auto`` (Sec. 3.4's inequality on the topology's bandwidths
    decides)."""
    jobs: int = Field(1, gt=0)
    """Training jobs sharing the servers: the workers split into this many equal groups,
    each with its own key namespace and token (Sec. 3.1)."""
    bad_token_worker: int | None = Field(None, ge=0)
    """Index of a worker that intrudes on job 0 with a made-up token (tests of access
    control), or null."""
    overlap: bool = True
    """Push each layer's chunks as soon as its backward is done and wait, before each
    layer's forward, only for that layer's chunks (false: push_pull everything after the
    whole backward pass)."""
    frame_bytes: int = Field(FRAME_BYTES, ge=0)
    """Payload bytes per *frame*, a multiple of 4; 0: one message per chunk, as PHub.

    Frames pack chunks: the chunks a worker sends to the same server process (interface)
    and server thread, of the same layer, travel as one transport message of at most this
    many payload bytes (:func:`~traffic.schemes.phub.frames.pack_frames`), and so do the
    server's replies and the initial values. Why: every real message costs Python and gloo
    time at both ends, which at PHub's 32 KB chunks would dwarf the emulated cost of a chunk
    and starve the machine (measured in ``docs/schemes.md``, "phub"). A frame is
    packaging only: every chunk keeps its own 8 bytes of metadata (the bytes on the wire are
    those of one message per chunk), and is checked, aggregated as its copies arrive,
    optimized and charged its host costs one by one, its per-message software overhead
    (``host.message_overhead_us``) included: the emulated system still sends one message
    per chunk. Parameters are exactly those without frames. Default 256 KB (8 chunks of
    32 KB): it removes most of the per-message cost (larger frames save little more), while
    a frame is short enough to stream (it is aggregated while the layer's next frames are in
    flight; a chunk waits for at most its frame, 8.4 ms at a host link of 10 Gbit/s dilated
    40x to 250 Mbit/s, against 34 ms for 1 MB)."""

    @field_validator("chunk_bytes", "frame_bytes")
    @classmethod
    def _whole_elements(cls, v):
        if v % ELEMENT_BYTES:
            raise ValueError("a multiple of 4 (float32 elements)")
        return v


@register("phub")
class PHub(ParameterServer):
    """PHub: chunked, tall-aggregating, multi-tenant parameter server with optional
    hierarchical cross-rack reduction (see the module docstring).

    Options: :class:`PHubOptions`. Dedicated server hosts (PBoxes of
    ``workload.servers.interfaces`` links) come from :meth:`ParameterServer.hosts`.
    """

    Options = PHubOptions
    push_kind = "push"
    pull_kind = "pull"
    light_refusal = (
        "its frames carry a job token in their payload, read on arrival, so frames in flight cannot "
        "share light memory's scratch; not supported yet"
    )

    # ---------------------------------------------------------------- harness side

    @classmethod
    def plan(cls, workload, hosts: list[HostInfo]) -> list[ProcessPlan]:
        """The PS plan (:meth:`ParameterServer.plan`: a PBox of k interfaces runs k server
        processes, one bound to each interface), checked for PHub's options.

        Raises:
            SpecError: workers that do not split into ``jobs`` equal jobs; a bad
                ``bad_token_worker``; ``hierarchical: true`` without exactly one server host
                per rack holding workers, or with ``bad_token_worker``.
        """
        procs = super().plan(workload, hosts)
        servers = [p for p in procs if p.role == "server"]
        workers = [p for p in procs if p.role == "worker"]
        o = cls.options_of(workload)
        try:
            job_groups(len(workers), o.jobs, o.bad_token_worker)
        except ValueError as e:
            if o.bad_token_worker is not None:
                raise SpecError("workload.options.bad_token_worker", o.bad_token_worker, str(e)) from None
            raise SpecError("workload.options.jobs", o.jobs, str(e)) from None
        if o.hierarchical is True:
            rack = {h.name: h.rack for h in hosts}
            server_hosts = list(dict.fromkeys(p.host for p in servers))
            worker_racks = sorted({rack[p.host] for p in workers})
            if sorted(rack[h] for h in server_hosts) != worker_racks:
                raise SpecError(
                    "workload.servers",
                    f"server hosts {server_hosts}",
                    "exactly one server host (PBox) in every rack with workers for "
                    "hierarchical reduction: {placement: dedicated, scope: per_rack, count: 1}",
                )
            if o.bad_token_worker is not None:
                raise SpecError(
                    "workload.options.bad_token_worker", o.bad_token_worker, "null with hierarchical reduction"
                )
        return workers + servers

    @classmethod
    def min_sent_bytes(cls, workload, processes: list[ProcessPlan]) -> float | None:
        """:meth:`Scheme.min_sent_bytes`: the workers of each of the ``jobs`` push their
        whole float32 gradient every iteration, each job its own model:
        :func:`~traffic.schemes.base.gradient_sync_bytes` per job (a ``bad_token_worker``'s
        refused pushes left out; chunks' metadata only adds)."""
        o = cls.options_of(workload)
        workers = count_roles(processes).get("worker", 0)
        return gradient_sync_bytes(workload, processes, groups=job_groups(workers, o.jobs, o.bad_token_worker))

    @classmethod
    def message_bytes(cls, workload, processes: list[ProcessPlan]) -> float:
        """Mean bytes per transport message (:meth:`Scheme.message_bytes`). The messages on
        the wire are *frames* (:func:`pack_frames`, ``frame_bytes``, option; 0: one per chunk),
        not PHub's chunks: each worker pushes every frame of its job and receives its reply,
        both ``4 x`` the frame's :attr:`Frame.size` (payloads plus ``META`` slots per chunk)
        bytes; the chunks are :func:`assign_chunks`'s (``chunk_bytes``, ``server_threads``,
        ``jobs``) over the plan's server processes. With ``hierarchical: true`` each frame's
        interface index is one of a PBox's ``k`` and every frame also goes round the ring of
        the ``R`` PBoxes (``2(R-1)`` blocks of ``1/R`` of its payload sent by each,
        :func:`~traffic.schemes.phub.hierarchy.ring_messages`); ``hierarchical: auto``
        is counted as flat (the topology's bandwidths decide it at run time; flat has the
        smaller frames). 32 KB chunks in 256 KB frames give frames of about 256 KB; with
        ``frame_bytes: 0`` the mean is a chunk's, 32 KB and 8 bytes.

        Raises:
            KeyError: unknown model.
        """
        o = cls.options_of(workload)
        workers = count_roles(processes).get("worker", 0)
        servers = [p for p in processes if p.role == "server"]
        pboxes = max(len({p.host for p in servers}), 1)
        hier = o.hierarchical is True and pboxes > 1
        interfaces = max(len(servers) // pboxes if hier else len(servers), 1)
        keys = model_keys(workload.model)
        chunks = assign_chunks([n for n, _ in keys], o.chunk_bytes // ELEMENT_BYTES, interfaces, o.server_threads)
        frames = pack_frames(chunks, o.frame_bytes // ELEMENT_BYTES, lambda c: keys[c.key][1])
        # one job's frames (every job's are laid out alike); per worker a push and a reply each
        msgs = 2 * workers * len(frames)
        sent = 2 * workers * ELEMENT_BYTES * sum(f.size for f in frames)
        if hier:  # every job's frames go round the ring
            for f in frames:
                msgs += o.jobs * sum(ring_messages(f.numel, pboxes, i)[0] for i in range(pboxes))
                sent += o.jobs * 2 * (pboxes - 1) * ELEMENT_BYTES * f.numel
        return sent / msgs if msgs else math.inf

    # ---------------------------------------------------------------- layout (every process)

    def _decide_hierarchical(self, racks_with_workers: int, per_rack: int, k: int) -> bool:
        """``hierarchical``: true/false as given; ``auto``: PHub Sec. 3.4's inequality
        on the topology's bandwidths (B_Wkr = host link, B_PBox = k host links, B_Core = the
        rack's uplink), with C for a ring across racks."""
        h = self.opts.hierarchical
        if h != "auto":
            return bool(h)
        if racks_with_workers < 2 or len(self.pboxes) != racks_with_workers:
            return False
        t = self.ctx.topology
        return hierarchical_pays(
            b_pbox=k * t.host_bw_mbps,
            b_core=t.uplink_mbps(),
            b_wkr=t.host_bw_mbps,
            racks=racks_with_workers,
            n=per_rack,
        )

    def _make_shards(self) -> list[Chunk]:
        """The cut of the keys into chunks (called by :meth:`ParameterServer._layout` once the
        roles are known), with what it depends on: racks, PBoxes, jobs, hierarchical or not;
        also packs them into ``self.frames`` (:func:`pack_frames`, the same on every process).

        Raises:
            RuntimeError: hierarchical reduction without one PBox per rack with workers.
        """
        ctx = self.ctx
        racks = host_racks(ctx.processes)
        self.rack_of = {p["rank"]: racks[p["host"]] for p in ctx.processes}
        # PBoxes: server processes grouped by host, in server index order
        by_host: dict[str, list[int]] = {}
        for r in self.server_ranks:
            by_host.setdefault(ctx.proc_of(r)["host"], []).append(r)
        self.pboxes = list(by_host.values())
        W = len(self.worker_ranks)
        self.intruder = self.opts.bad_token_worker
        self.jobs = job_groups(W, self.opts.jobs, self.intruder)
        worker_racks = [self.rack_of[r] for r in self.worker_ranks]
        per_rack = max(worker_racks.count(r) for r in set(worker_racks))
        k = len(self.pboxes[0])
        self.hier = self._decide_hierarchical(len(set(worker_racks)), per_rack, k)
        if self.hier:
            if len({len(p) for p in self.pboxes}) != 1 or sorted(self.rack_of[p[0]] for p in self.pboxes) != sorted(
                set(worker_racks)
            ):
                raise RuntimeError(
                    "hierarchical reduction needs one PBox (server host) per rack with workers, "
                    "all with the same number of interfaces"
                )
            self.pbox_of_rack = {self.rack_of[p[0]]: p for p in self.pboxes}
        interfaces = k if self.hier else len(self.server_ranks)
        named = list(ctx.model.named_parameters())
        self.chunks = assign_chunks(
            [p.numel() for _, p in named],
            self.opts.chunk_bytes // ELEMENT_BYTES,
            interfaces,
            self.opts.server_threads,
            [n for n, _ in named],
            jobs=len(self.jobs),
        )
        self.frames = pack_frames(self.chunks, self.opts.frame_bytes // ELEMENT_BYTES, lambda c: self.key_layer[c.key])
        return self.chunks

    def _namespace(self, widx: int) -> int:
        """Job (namespace) worker ``widx`` addresses: its own, or job 0 for the intruder."""
        for g, members in enumerate(self.jobs):
            if widx in members:
                return g
        return 0

    def _job_frames(self, g: int) -> list[Frame]:
        return [f for f in self.frames if f.job == g]

    def _server_of(self, f: Frame, worker_rank: int) -> int:
        """Global rank of the server process that serves frame ``f`` to ``worker_rank``."""
        if self.hier:
            return self.pbox_of_rack[self.rack_of[worker_rank]][f.server]
        return self.server_ranks[f.server]

    def _servers_used(self, worker_rank: int) -> list[int]:
        return list(self.pbox_of_rack[self.rack_of[worker_rank]]) if self.hier else list(self.server_ranks)

    def _fields(self, it: int, f: Frame) -> dict:
        return {
            "iteration": it,
            "layer": f.layer,
            "frame": f.id,
            "shard": f.id,
            "slice": f.id,
            "chunks": [c.id for c in f.chunks],
            "job": f.job,
            "iface": f.server,
            "server_thread": f.thread,
            "priority": f.layer,
        }

    @staticmethod
    def _message_sizes(f: Frame) -> list[int]:
        """Bytes of each chunk's message in frame ``f`` (payload and metadata)."""
        return [(c.numel + META) * ELEMENT_BYTES for c in f.chunks]

    def _send_frame(
        self, buf: torch.Tensor, f: Frame, dst: int, kind: str, fields: dict, sizes: list[int] | None = None
    ) -> Pending:
        """Send frame ``f`` (``buf``) to ``dst`` as one transfer that is not a message of the
        emulated system; its chunks are charged one ``message`` each first (the sender pays
        before posting, as the transport does)."""
        tr = self.ctx.transport
        charge_messages(self.ctx.costs, sizes or self._message_sizes(f), **fields)
        return tr.isend(buf, dst, tag=f.id, kind=kind, message=False, **fields)

    def _recv_frame(self, buf: torch.Tensor, f: Frame, src: int, kind: str, fields: dict) -> Pending:
        """Post the receive of frame ``f`` into ``buf`` (not a message of the emulated system:
        the receiver charges its chunks' messages once the frame is in)."""
        return self.ctx.transport.irecv(buf, src, tag=f.id, kind=kind, message=False, **fields)

    # ---------------------------------------------------------------- worker

    def setup(self) -> None:
        """Lay out the chunks; CreateService (token) and ConnectService; initial values to
        the servers; job-local batches."""
        self._layout()
        ctx, tr = self.ctx, self.ctx.transport
        me = ctx.index
        self.job = self._namespace(me)
        self.is_intruder = me == self.intruder
        members = self.jobs[self.job]
        self.mine = self._job_frames(self.job)
        self.layer_frames: list[list[Frame]] = [[] for _ in ctx.model.layers]
        for f in self.mine:
            self.layer_frames[f.layer].append(f)
        self._pulls: dict[int, list[tuple[Frame, torch.Tensor, Pending, dict]]] = {}
        self.rejected_pulls = 0
        # CreateService: the job's first worker draws the token, gives it to the job and the servers
        tok = torch.zeros(2, dtype=torch.int64)
        if self.is_intruder:
            self.token = 0  # made up: real tokens are never 0
        elif me == members[0]:
            self.token = new_token()
            tok[:] = torch.tensor([self.job, self.token])
            tr.wait_all(
                [tr.isend(tok, self.worker_ranks[w], tag=SETUP_TAG, kind="token", job=self.job) for w in members[1:]]
                + [tr.isend(tok, s, tag=SETUP_TAG + 1, kind="create_service", job=self.job) for s in self.server_ranks]
            )
        else:
            tr.recv(tok, self.worker_ranks[members[0]], tag=SETUP_TAG, kind="token", job=self.job)
            self.token = int(tok[1])
        self._meta = token_meta(self.token)
        # ConnectService: name the namespace and present the token to every server process used
        hello = torch.tensor([self.job, self.token], dtype=torch.int64)
        tr.wait_all(
            [tr.isend(hello, s, tag=SETUP_TAG + 2, kind="connect", job=self.job) for s in self._servers_used(ctx.rank)]
        )
        # initial values: the job's first worker (per rack with hierarchical reduction) sends them
        if not self.is_intruder:
            my_rank = ctx.rank
            same_rack = [
                w for w in members if not self.hier or self.rack_of[self.worker_ranks[w]] == self.rack_of[my_rank]
            ]
            if me == same_rack[0]:
                flat = [p.data.view(-1) for p in self.params]
                tr.wait_all(
                    [
                        self._send_frame(
                            torch.cat([flat[c.key][c.lo : c.hi] for c in f.chunks]),
                            f,
                            self._server_of(f, my_rank),
                            "init",
                            self._fields(-1, f),
                            [c.numel * ELEMENT_BYTES for c in f.chunks],
                        )
                        for f in self.mine
                    ]
                )
        # data: the job's own global batches (a job of m workers trains as the reference of m)
        if ctx.batches is not None and (len(self.jobs) > 1 or self.intruder is not None):
            m = len(members)
            local = members.index(me) if me in members else 0
            ctx.batches = JobShards(GlobalBatches(ctx.data, ctx.workload.batch_size, m, ctx.workload.seed), local)

    def _push_pull(self, it: int, frames: list[Frame]) -> list[tuple[Frame, torch.Tensor, Pending, dict]]:
        """Fused push_pull of ``frames``: post the receives of their new values, then queue one
        comm job that pushes every frame (each chunk's payload and token) and waits for the
        sends."""
        me = self.ctx.rank
        pulls = []
        for f in frames:
            buf, fields = torch.empty(f.size), self._fields(it, f)
            pulls.append((f, buf, self._recv_frame(buf, f, self._server_of(f, me), self.pull_kind, fields), fields))
        grads = [(f, [self._grad_slice(c) for c in f.chunks]) for f in frames]

        def push() -> None:
            sends = []
            for f, gs in grads:
                msg = torch.empty(f.size)
                torch.cat(gs, out=msg[: f.numel])
                msg[f.numel :].copy_(self._meta.repeat(len(f.chunks)))
                sends.append(self._send_frame(msg, f, self._server_of(f, me), self.push_kind, self._fields(it, f)))
            self.ctx.transport.wait_all(sends)

        self.ctx.comm.submit(push)
        return pulls

    def _apply(self, pulls: list[tuple[Frame, torch.Tensor, Pending, dict]]) -> None:
        """Wait for replies (each chunk charged one received message) and copy accepted chunks
        into the model (a rejected chunk carries no parameters: the worker keeps its own)."""
        for f, buf, p, fields in pulls:
            p.wait()
            charge_messages(self.ctx.costs, self._message_sizes(f), **fields)
            for j, c in enumerate(f.chunks):
                if f.meta(buf, j) == ACCEPTED:
                    self.params[c.key].data.view(-1)[c.lo : c.hi].copy_(f.payload(buf, j))
                else:
                    self.rejected_pulls += 1

    def after_backward(self, it: int, layer: int) -> None:
        """Overlap: push_pull layer ``layer``'s frames as soon as its gradients are ready."""
        if self.overlapped and self.layer_frames[layer]:
            self._pulls[layer] = self._push_pull(it, self.layer_frames[layer])

    def before_forward(self, it: int, layer: int) -> None:
        """Overlap: wait for layer ``layer``'s new values before its forward."""
        if self.overlapped:
            self._apply(self._pulls.pop(layer, []))

    def _wait_pulls(self) -> None:
        for layer in list(self._pulls):
            self._apply(self._pulls.pop(layer))

    def on_backward_end(self, it: int) -> None:
        """Bulk: push_pull every chunk and wait. Overlap: as ``ps`` (wait before an evaluation)."""
        if self.overlapped:
            return super().on_backward_end(it)
        self._apply(self._push_pull(it, self.mine))
        self.ctx.comm.drain()

    def finish(self) -> None:
        """Wait for the last pulls; report the worker's job and rejected pulls (a job's
        throughput is the analysis's, from ``iterations.csv``: ``analysis.phub_report``)."""
        self._wait_pulls()
        self.ctx.comm.drain()
        self.ctx.results.update(
            job=None if self.is_intruder else self.job,
            job_workers=len(self.jobs[self.job]),
            rejected_pulls=self.rejected_pulls,
            intruder=self.is_intruder,
        )

    # ---------------------------------------------------------------- server

    def run_server(self) -> None:
        """Serve ``workload.iterations`` rounds of every own chunk (see the module docstring).

        Raises:
            RuntimeError / DistBackendError: a peer died or communication timed out; what a
                server thread raised.
        """
        ctx = self.ctx
        self._layout()
        tr, ev = ctx.transport, ctx.events
        me = ctx.rank
        if self.hier:
            box = next(p for p in self.pboxes if me in p)
            my_iface = box.index(me)
            my_rack = self.rack_of[me]
        else:
            my_iface, my_rack = ctx.index, None
        # CreateService from each job's first worker; ConnectService from every worker served
        tokens: dict[int, int] = {}
        for g, members in enumerate(self.jobs):
            t = torch.zeros(2, dtype=torch.int64)
            tr.recv(t, self.worker_ranks[members[0]], tag=SETUP_TAG + 1, kind="create_service", job=g)
            tokens[int(t[0])] = int(t[1])
        served = [(w, r) for w, r in enumerate(self.worker_ranks) if not self.hier or self.rack_of[r] == my_rack]
        self.senders: dict[int, list[int]] = {g: [] for g in range(len(self.jobs))}
        self.rejected_connects = self.rejected_pushes = 0
        hello = torch.zeros(2, dtype=torch.int64)
        for _w, r in served:
            tr.recv(hello, r, tag=SETUP_TAG + 2, kind="connect")
            g, token = int(hello[0]), int(hello[1])
            if tokens.get(g) != token:
                self.rejected_connects += 1
                ev.instant("reject", op="connect", peer=r, job=g)
            self.senders[g].append(r)  # listened to, so that each of its pushes is received and refused
        self.tokens = tokens
        # own frames: my interface's, of the jobs with workers here; a frame's store holds its
        # chunks' values, then their reply statuses (the frame's layout), and is the reply itself
        self.mine = [f for f in self.frames if f.server == my_iface and self._legit(f.job, my_rack)]
        self.stores = [torch.empty(f.size) for f in self.mine]
        for f, st in zip(self.mine, self.stores):
            st[f.numel :].copy_(token_meta(ACCEPTED).repeat(len(f.chunks)))
        # one Parameter per frame (its chunks' values, contiguous): one real optimizer step per
        # frame, charged per chunk (:func:`step_frame`)
        self.values = [torch.nn.Parameter(st[: f.numel]) for f, st in zip(self.mine, self.stores)]
        inits = []
        for f, st in zip(self.mine, self.stores):
            fields = self._fields(-1, f)
            inits.append(
                (f, fields, self._recv_frame(st[: f.numel], f, self._legit(f.job, my_rack)[0], "init", fields))
            )
        for f, fields, p in inits:
            p.wait()
            charge_messages(ctx.costs, [c.numel * ELEMENT_BYTES for c in f.chunks], **fields)
        self.optimizers = [make_optimizer([v], ctx.workload.optimizer) for v in self.values]
        chunks = [c for f in self.mine for c in f.chunks]
        ev.instant(
            "server_keys",
            chunks=[c.id for c in chunks],
            frames=[f.id for f in self.mine],
            numel=sum(c.numel for c in chunks),
            iface=my_iface,
            hierarchical=self.hier,
        )
        T = self.opts.server_threads
        jobs_here = sorted({f.job for f in self.mine})
        self._count_lock = threading.Lock()
        errors: list[BaseException] = []

        def serve(t: int, g: int) -> None:
            try:
                self._serve_thread(t, g, len(jobs_here), my_iface, my_rack)
            except BaseException as e:  # noqa: BLE001 - re-raised by the main thread
                errors.append(e)

        threads = [
            threading.Thread(
                target=serve, args=(t, g), daemon=True, name=f"srv{t}" if len(self.jobs) == 1 else f"srv{t}-job{g}"
            )
            for t in range(T)
            for g in jobs_here
        ]
        cpu0 = time.process_time()
        for th in threads:
            th.start()
        while any(th.is_alive() for th in threads) and not errors:  # a failed thread fails the server now
            for th in threads:
                th.join(timeout=0.2)
        if errors:
            raise errors[0]
        ctx.results.update(
            rejected_pushes=self.rejected_pushes,
            rejected_connects=self.rejected_connects,
            chunks=len(chunks),
            frames=len(self.mine),
            chunk_bytes=self.opts.chunk_bytes,
            frame_bytes=self.opts.frame_bytes,
            hierarchical=self.hier,
            iface=my_iface,
            serve_cpu_s=time.process_time() - cpu0,
        )

    def _legit(self, g: int, rack: int | None) -> list[int]:
        """Global ranks of job ``g``'s workers (in ``rack`` only, if given)."""
        ranks = [self.worker_ranks[w] for w in self.jobs[g]]
        return [r for r in ranks if rack is None or self.rack_of[r] == rack]

    def _order(self, idx: list[int]) -> list[int]:
        """Processing order of a thread's frames (indices into ``self.mine``): the order
        workers push them (last layer first with overlap, key order in bulk), then id."""
        if self.overlapped:
            return sorted(idx, key=lambda i: (-self.mine[i].layer, self.mine[i].id))
        return sorted(idx, key=lambda i: self.mine[i].id)

    def _serve_thread(self, t: int, job: int, jobs_here: int, my_iface: int, my_rack: int | None) -> None:
        """Tall aggregation and optimization of thread ``t``'s chunks of job ``job``, every
        round (``jobs_here`` jobs share the thread's receive window), frame by frame.

        Host costs (PHub Sec. 3.2.2): every chunk copy added as it arrives is charged
        ``aggregate`` (the chunk's bytes; :func:`tall_aggregate`), and every chunk's optimizer
        step, done by this thread right after the chunk's last copy ("the thread that
        aggregates a particular chunk also optimizes that chunk"), ``optimizer`` (the chunk's
        bytes; the average, MXNet's ``rescale_grad``, is part of the step); with hierarchical
        reduction the ring's local sums are charged ``aggregate`` too (:func:`ring_reduce`).
        Each chunk message received or sent is charged ``message``.
        """
        ctx, tr, ev = self.ctx, self.ctx.transport, self.ctx.events
        order = self._order([i for i, f in enumerate(self.mine) if f.thread == t and f.job == job])
        if not order:
            return
        W = len(self.senders[job]) or 1
        window = recv_window(max(self.mine[i].size for i in order), W, jobs_here)
        R = len(self.pboxes) if self.hier else 1

        def post(it: int, i: int):
            f = self.mine[i]
            fields = self._fields(it, f)
            out = []
            for r in self.senders[f.job]:
                buf = torch.empty(f.size)
                out.append((r, buf, self._recv_frame(buf, f, r, self.push_kind, fields)))
            return out

        for it in range(ctx.iterations):
            if t == 0 and job == self.mine[0].job:
                ctx.maybe_crash(it)
            posted = {i: post(it, i) for i in order[:window]}
            sends: list[Pending] = []
            for n, i in enumerate(order):
                if n + window < len(order):
                    j = order[n + window]
                    posted[j] = post(it, j)
                f = self.mine[i]
                fields = self._fields(it, f)
                agg, accepted, refused = tall_aggregate(
                    posted.pop(i),
                    f,
                    self.tokens.get(f.job),
                    partial(self._reject_push, fields=fields),
                    ctx.costs,
                    fields,
                )
                with ev.span("update", copies=max(len(a) for a in accepted), **fields):
                    if self.hier:
                        ring = [box[f.server] for box in self.pboxes if self._legit(f.job, self.rack_of[box[0]])]
                        ring_reduce(
                            tr, agg, ring, f.id, R, chunk_numels=[c.numel for c in f.chunks], costs=ctx.costs, **fields
                        )
                        counts = [len(self._legit(f.job, None))] * len(f.chunks)
                    else:
                        counts = [len(a) for a in accepted]
                    step_frame(f, self.values[i], self.optimizers[i], agg, counts, ctx.costs, fields)
                store, k = self.stores[i], len(f.chunks)
                for r in self.senders[f.job]:  # each sender pushed a copy of every chunk of the frame
                    no = [j for j in range(k) if r in refused[j]]  # no parameters for a wrong token
                    sends.append(
                        self._send_frame(
                            refused_reply(store, f, no) if no else store,
                            f,
                            r,
                            "reject_reply" if len(no) == k else self.pull_kind,
                            fields,
                        )
                    )
                done = [s for s in sends if s.is_completed()]
                for s in done:
                    s.wait()
                sends = [s for s in sends if s not in done]
            tr.wait_all(sends)  # before the next round changes the values in place

    def _reject_push(self, peer: int, j: int, fields: dict) -> None:
        """Count and log (event ``reject``, ``op`` push, ``chunk``) chunk ``j`` of a frame
        pushed by ``peer`` with a wrong token."""
        with self._count_lock:
            self.rejected_pushes += 1
        self.ctx.events.instant("reject", op="push", peer=peer, chunk=fields["chunks"][j], **fields)

    def final_state(self) -> dict | None:
        """Workers: the model's state dict. Servers: ``{"<param>[lo:hi]": chunk values}``
        (prefixed ``job<g>/`` with several jobs)."""
        if self.ctx.role == "server":
            pre = (lambda c: f"job{c.job}/") if len(self.jobs) > 1 else (lambda c: "")
            return {
                f"{pre(c)}{c.name}[{c.lo}:{c.hi}]": f.payload(v.detach(), j)
                for f, v in zip(self.mine, self.values)
                for j, c in enumerate(f.chunks)
            }
        return super().final_state()
