"""Priority-based parameter propagation (``p3``), P3 paper (Jayarajan et al., SysML 2019), Sec. 4.

A parameter server (the ``ps`` scheme's servers, initialisation and layer-wise overlap,
:class:`~traffic.schemes.ps.ParameterServer`) with two changes:

* **Slicing** (P3 Sec. 4.2, "parameter slicing"): every key (parameter tensor) is cut into
  contiguous *slices* of ``slice_params`` elements (option, default 50,000, the paper's
  value, Sec. 5.6; MXNet's later ``dist_p3`` uses 40,000), the last slice of a key holding
  the rest. Slices are numbered in key order (the slice id) and go to the servers round
  robin: slice ``j`` to server ``j mod S`` (:func:`assign_slices`). There is no big-array
  split: slicing replaces it.
* **Priority** (option ``priority``, default true): a slice inherits its layer's priority,
  the layer index in forward order (0 = first layer = most urgent).

Worker (per iteration ``it``):

* ``after_backward(it, l)`` on the compute thread (the *producer*): post the receives of
  every slice of layer ``l`` straight into the model's parameters (one batch per layer),
  then submit one job per slice -- copy the slice into the one send buffer behind its id
  and ``send`` it, blocking, to its server -- to the comm thread (the *consumer*), a
  :class:`~traffic.runtime.comm.PriorityCommThread` keyed
  by the slice's priority. The consumer always starts the queued slice of highest priority
  (lowest number; equal priorities in production order); a slice being sent is never
  interrupted, so a later-produced higher-priority slice preempts the queued lower-priority
  ones at slice granularity. With ``priority: false`` the consumer is FIFO (slicing only:
  the paper's middle curve in Fig. 7).
* ``before_forward(it + 1, l)``: wait until every slice of layer ``l`` has arrived.

**One message per slice.** A push is one float32 message ``[id | gradient]``
(:func:`pack_slice`): element 0 holds the slice id as int32 bits, elements ``1 .. numel``
the gradient slice, nothing else (P3 Sec. 4.2: the consumer "sends the slice to the
P3Server ... with its priority stamped on the packet header"; ps-lite messages carry their
key). Every push of every slice has the one tag :data:`PUSH_TAG`: a server cannot know in
which order a worker sends (the worker's priority queue decides at run time), so it cannot
post a receive per slice id. It posts, when a round starts, ``n`` receives per worker (``n``
= its own slices) with that tag, each into a row of ``max own numel + 1`` elements; gloo
matches receives of one tag from one peer in posting order, and accepts a message shorter
than the posted buffer (``pair.cc``, ``prepareRead``: the incoming length must be ``<=``
the receive's size), so the ``k``-th slice a worker sends lands whole in row ``k`` and its
first element says which slice it is. No size classes, no padding on the wire: the only
extra bytes are the 4-byte ids, one per slice and worker per iteration -- for the default
``slice_params`` 11,608 B per worker per iteration for VGG-19 (2,902 slices; 0.0020 % of its
574.7 MB of gradient) and 2,572 B for ResNet-50 (643 slices; 0.0025 % of 102.2 MB). (The
earlier design sent an 8-byte meta message after every slice: two messages per slice.
Padding every slice to one of a few size classes -- powers of two from 256 elements up to
``slice_params`` -- would need 8 classes, ``8 W`` receiver threads per server, and send
0.09 % (VGG-19) / 0.89 % (ResNet-50) extra bytes.) The price is receive memory on the
servers: every row is as long as the server's largest slice, about 1 % more than the
gradients it holds for VGG-19, 26-28 % for ResNet-50 (many small batch-norm slices; 1-4
servers).

Light memory (``workload.compute.memory: light``, :mod:`traffic.runtime.buffers`): the
messages, their sizes and their order are the same as in full memory, ids included. A
worker copies each gradient slice from the shared zeros into its send buffer (its own
memory, one slice long: it holds the id the server reads), as in full memory, and receives
the broadcasts onto scratch. A server receives the initial values onto scratch, sends zeros,
and skips the summation and the SGD step (their stated host costs are still charged), as
``ps``'s. Its push rows are :meth:`~traffic.runtime.buffers.Buffers.ordered_rows`: per
worker, one region of its own of ``n + max own numel`` elements in which row ``k`` starts at
element ``k``. The ``k``-th push a worker sends lands in row ``k`` after every earlier one
(one tag from one peer: gloo fills the rows in posting order, over one connection), and
writes only elements ``k ..``, so every row's first element keeps its message's slice id
until the receiver thread reads it, while the gradients overlap (never read). Servers are
light too, not full: a server's parameters are a ``1/S`` share of the model, but its rows
hold ``W`` copies of its share, ``W/S`` of a model (a whole model per server with a server
per worker, as in the P3 paper's setup: about 580 MB for VGG-19); light, its rows take
``4 W (n + max own numel)`` bytes: 3.2 MB for VGG-19 with 16 workers and 16 servers, 26 MB
with 128 and 128, at the default ``slice_params``.

Server, per round: the ``W x n`` receives are posted when the round starts, so a worker's
send never waits for the server to post its receive (gloo hands a send to the socket at
once when the matching receive is already posted; otherwise it first waits a round trip for
the receiver -- why receives from any source, which gloo only matches after such a round
trip, are not used). One receiver thread per worker (``recv<j>``: ``W`` per server, e.g. 4-8
for the 4-8 workers of the VGG-19 and ResNet-50 runs, whatever the model) takes that
worker's messages in the order it sent them and reads each one's slice id; a slice whose
``W`` copies are all in enters the ready queue, a priority queue keyed by ``(priority,
slice id)`` (with ``priority: false`` a FIFO). The server's main thread (the consumer)
repeatedly takes the head of the ready queue, averages and updates that slice (SGD, as
``ps``, summing the gradients in place in the receive rows) and at once sends it to every
worker (``broadcast``, tag = slice id; there is no pull request, P3 Sec. 4.2).

GIL switch interval: every P3 process sets ``sys.setswitchinterval`` to
:data:`SWITCH_INTERVAL_S` (0.5 ms; CPython's default is 5 ms). A server runs ``W + 1``
Python threads and a worker two (compute and comm); a thread whose gloo operation has
completed must take the GIL back to act on it (count the slice, send the next one), and
while another thread runs Python code it waits up to the switch interval for it -- with
the default, up to 5 ms per slice on the critical path of the next send or update. The
shorter interval costs no CPU visible beyond noise (measured: ``docs/schemes.md``, "p3").

Events (each with ``iteration``, ``layer``, ``key``, ``slice``, ``priority``, ``bytes``):
worker ``enqueue`` (instant, logged right *after* the slice entered the send queue) and
``push`` (dir tx, spans its blocking send, on the ``comm`` thread), both with ``bytes`` =
the payload sent (``4 (numel + 1)``, the id included) and ``grad_bytes`` = the gradient's
``4 numel``; ``broadcast`` (dir rx, posted in ``after_backward``, ends when
``before_forward`` has it); server ``push`` (dir rx, ``bytes`` and ``grad_bytes`` as the
worker's, posted at the round's start, ends when the receiver thread ``recv<j>`` of worker
``j`` finds it complete), ``update`` and ``broadcast`` (dir tx, starts when the send is
posted, after the update).
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Iterator, Sequence
from functools import partial
from typing import ClassVar

import torch
from pydantic import Field

from traffic.runtime.comm import PriorityCommThread
from traffic.runtime.transport import Pending, nbytes
from traffic.schemes import register
from traffic.schemes.base import ProcessPlan, SchemeOptions, count_roles, model_keys
from traffic.schemes.ps import ELEMENT_BYTES, ParameterServer, Shard

__all__ = [
    "SLICE_PARAMS",
    "PUSH_TAG",
    "ID_ELEMENTS",
    "MAX_SLICE_ID",
    "SWITCH_INTERVAL_S",
    "assign_slices",
    "pack_slice",
    "slice_id_of",
    "P3",
]

SLICE_PARAMS = 50_000
#: tag of every push message (slice ids, the init and broadcast tags, stay below it)
PUSH_TAG = 1 << 30
#: elements of a push message before the gradient (the slice id)
ID_ELEMENTS = 1
#: the largest slice id a push can carry (int32)
MAX_SLICE_ID = (1 << 31) - 1
#: CPython GIL switch interval (seconds) in P3's processes (CPython's default: 0.005)
SWITCH_INTERVAL_S = 0.0005


def assign_slices(
    numels: Sequence[int], num_servers: int, slice_params: int = SLICE_PARAMS, names: Sequence[str] | None = None
) -> list[Shard]:
    """Cut keys into slices of at most ``slice_params`` elements, servers round robin.

    Args:
        numels: elements of each key, in key order.
        num_servers: ``S`` >= 1.
        slice_params: maximum elements per slice; key ``k`` of ``n`` elements gives
            ``ceil(n / slice_params)`` slices ``[i*slice_params, min((i+1)*slice_params, n))``.
        names: the keys' names (default ``"key<i>"``).

    Returns:
        :class:`~traffic.schemes.ps.Shard` s ordered by key then offset, ``id`` = slice id
        = position, ``server = id mod S``; every element of every key is in exactly one.

    Raises:
        ValueError: ``num_servers`` < 1 or ``slice_params`` < 1.
    """
    if num_servers < 1:
        raise ValueError(f"need at least one server, got {num_servers}")
    if slice_params < 1:
        raise ValueError(f"slice_params must be >= 1, got {slice_params}")
    names = list(names) if names is not None else [f"key{k}" for k in range(len(numels))]
    out: list[Shard] = []
    for k, n in enumerate(numels):
        for lo in range(0, int(n), slice_params):
            j = len(out)
            out.append(Shard(j, k, names[k], j % num_servers, lo, min(lo + slice_params, int(n))))
    return out


def pack_slice(buf: torch.Tensor, slice_id: int, grad: torch.Tensor) -> torch.Tensor:
    """Write the push message of one slice, ``[id | grad]``, at the start of ``buf``.

    Args:
        buf: contiguous 1-D float32, at least ``grad.numel() + ID_ELEMENTS`` elements.
        slice_id: 0 .. :data:`MAX_SLICE_ID`; stored as the int32 bits of element 0 (exact:
            the element is only ever copied, never computed with).
        grad: the gradient slice (float32, any shape; flattened).

    Returns:
        The message: the view ``buf[:grad.numel() + 1]``.

    Raises:
        ValueError: ``slice_id`` out of range, ``buf`` too short or not contiguous
            float32, or ``grad`` not float32.
    """
    n = grad.numel()
    if not 0 <= slice_id <= MAX_SLICE_ID:
        raise ValueError(f"slice id {slice_id} outside 0..{MAX_SLICE_ID}")
    if buf.dtype != torch.float32 or grad.dtype != torch.float32 or buf.dim() != 1 or not buf.is_contiguous():
        raise ValueError(
            f"need a contiguous 1-D float32 buffer and a float32 gradient, got "
            f"{buf.dtype} {tuple(buf.shape)} and {grad.dtype}"
        )
    if buf.numel() < n + ID_ELEMENTS:
        raise ValueError(f"buffer of {buf.numel()} elements cannot hold a slice of {n} and its id")
    buf.view(torch.int32)[0] = slice_id
    buf[ID_ELEMENTS : ID_ELEMENTS + n].copy_(grad.reshape(-1))
    return buf[: ID_ELEMENTS + n]


def slice_id_of(message: torch.Tensor) -> int:
    """The slice id of a push message (or of a receive row holding one): :func:`pack_slice`'s
    element 0 read back as int32. ``message``: contiguous float32, at least 1 element."""
    return int(message[:ID_ELEMENTS].view(torch.int32)[0])


class P3Options(SchemeOptions):
    """Options of ``p3`` (P3 always overlaps, and slices replace ``ps``'s key split)."""

    slice_params: int = Field(SLICE_PARAMS, gt=0)
    """Maximum parameters per slice (P3 Sec. 4.1: 50,000)."""
    priority: bool = True
    """Send and process slices by priority (false: FIFO, slicing only)."""


@register("p3")
class P3(ParameterServer):
    """Priority-based parameter propagation (see the module docstring). Options: :class:`P3Options`."""

    light_refusal = None  # ids survive in Buffers.ordered_rows (module docstring, "Light memory")
    Options = P3Options
    push_kind = "push"
    pull_kind = "broadcast"
    switch_interval_s: ClassVar[float] = SWITCH_INTERVAL_S
    _rows: list[torch.Tensor] | None = None  # server: the push receive rows, one (n, cap) tensor per worker

    @classmethod
    def message_bytes(cls, workload, processes: Sequence[ProcessPlan]) -> float:
        """Mean bytes per message (:meth:`Scheme.message_bytes`): one push ``[id | gradient]``
        (``4 (numel + 1)`` bytes) and one broadcast (``4 numel``) per slice of
        :func:`assign_slices` (``slice_params``, option) and worker each iteration: the
        parameter bytes over the number of slices, plus 2 (half an id). VGG-19 at the default
        50,000: 2,902 slices, 198 KB.

        Raises:
            KeyError: unknown model.
        """
        servers = max(count_roles(processes).get("server", 0), 1)
        slices = assign_slices(
            [n for n, _ in model_keys(workload.model)], servers, cls.options_of(workload).slice_params
        )
        # per slice and worker: a push of numel + 1 elements and a broadcast of numel
        return ELEMENT_BYTES * sum(2 * s.numel + ID_ELEMENTS for s in slices) / (2 * len(slices))

    @classmethod
    def light_buffer_bytes(cls, workload, processes: Sequence[ProcessPlan]) -> float:
        """:meth:`Scheme.light_buffer_bytes`: the largest slice of :func:`assign_slices` (a
        worker's broadcast lands on scratch, and so does a server's initial value of a
        slice; the push rows and a worker's send buffer are the process's own, not scratch).

        Raises:
            KeyError: unknown model.
        """
        servers = max(count_roles(processes).get("server", 0), 1)
        slices = assign_slices(
            [n for n, _ in model_keys(workload.model)], servers, cls.options_of(workload).slice_params
        )
        return ELEMENT_BYTES * max(s.numel for s in slices)

    @property
    def overlapped(self) -> bool:
        """P3 always overlaps communication with backward and forward."""
        return True

    @property
    def prioritized(self) -> bool:
        return self.opts.priority

    def _make_shards(self) -> list[Shard]:
        named = list(self.ctx.model.named_parameters())
        return assign_slices(
            [p.numel() for _, p in named], len(self.server_ranks), self.opts.slice_params, [n for n, _ in named]
        )

    # ---------------------------------------------------------------- worker

    def setup(self) -> None:
        """The ``ps`` setup (slices, initial values to the servers); priority consumer
        thread; the send buffer of the push messages (one: the consumer sends one at a time;
        the process's own memory in light memory too, since it carries the id)."""
        super().setup()
        if self.prioritized:
            self.ctx.comm.close(wait=False)  # never started: nothing ran on it
            self.ctx.comm = PriorityCommThread("comm")
        self._send_buf = torch.empty(max(s.numel for s in self.shards) + ID_ELEMENTS)

    def _submit_push(self, it: int, layer: int, items: list[tuple[Shard, torch.Tensor]]) -> None:
        """Producer: one job per slice (one blocking send), queued with the slice's priority."""
        comm, ev = self.ctx.comm, self.ctx.events
        for s, g in items:
            f = self._fields(it, s)
            comm.submit(partial(self._send_slice, g, s, f), priority=f["priority"])
            ev.instant(
                "enqueue",
                bytes=(s.numel + ID_ELEMENTS) * ELEMENT_BYTES,  # after the put: queued by now
                grad_bytes=s.numel * ELEMENT_BYTES,
                **f,
            )

    def _send_slice(self, g: torch.Tensor, s: Shard, f: dict) -> None:
        """Consumer job: the slice's push message ``[id | gradient]`` (:func:`pack_slice`),
        tag :data:`PUSH_TAG`; the send buffer is free again when the blocking send returns."""
        msg = pack_slice(self._send_buf, s.id, g)
        self.ctx.transport.send(
            msg, self.server_ranks[s.server], tag=PUSH_TAG, kind=self.push_kind, grad_bytes=nbytes(g), **f
        )

    # ---------------------------------------------------------------- server

    def _aggregated(self, it: int) -> Iterator[int]:
        """Complete slices, highest priority first among those complete at each choice
        (completion order with ``priority: false``).

        Every receive of the round is posted first: ``n`` per worker (tag :data:`PUSH_TAG`),
        into the rows of one ``(n, max own numel + 1)`` float32 tensor per worker
        (:meth:`~traffic.runtime.buffers.Buffers.ordered_rows`: disjoint rows in full memory,
        overlapping ones that keep each row's id in light memory), allocated in the first
        round (the ``ps`` per-shard buffers are dropped then). One receiver
        thread per worker takes that worker's rows in the order it sent them, reads each
        one's slice id and points ``self._bufs[i][j]`` (slice ``i``, worker ``j``) at the
        gradient in the row; a slice whose ``W`` copies are in enters the ready queue (the
        P3Server's priority queue).

        Raises:
            RuntimeError: a worker sent a slice id this server does not own, or one slice
                twice in a round; and what a receive raised (a worker died, a timeout).
        """
        tr, W, n = self.ctx.transport, len(self.worker_ranks), len(self.mine)
        if n == 0:
            return
        if self._rows is None:
            cap = max(s.numel for s in self.mine) + ID_ELEMENTS
            self._rows = [self.ctx.buffers.ordered_rows(n, cap) for _ in range(W)]
            for per_worker in self._bufs:  # the gradients are views into the rows from now on
                per_worker[:] = [None] * W
        index = {s.id: i for i, s in enumerate(self.mine)}

        def slice_in(row: torch.Tensor) -> int:
            sid = slice_id_of(row)
            if sid not in index:
                raise RuntimeError(f"server {self.ctx.index} got a push of slice {sid}, not one of its own")
            return index[sid]

        def post(j: int, k: int) -> Pending:
            row = self._rows[j][k]

            def fill() -> dict:  # the slice's fields and real size, before the event is logged
                s = self.mine[slice_in(row)]
                return {
                    **self._fields(it, s),
                    "bytes": (s.numel + ID_ELEMENTS) * ELEMENT_BYTES,
                    "grad_bytes": s.numel * ELEMENT_BYTES,
                }

            return tr.irecv(row, self.worker_ranks[j], tag=PUSH_TAG, kind=self.push_kind, iteration=it, on_arrival=fill)

        pushes = [[post(j, k) for k in range(n)] for j in range(W)]
        left = [W] * n
        got = [[False] * W for _ in range(n)]
        lock = threading.Lock()
        ready: queue.Queue = queue.PriorityQueue() if self.prioritized else queue.Queue()
        seq = itertools.count()

        def receive(j: int) -> None:
            try:
                for k in range(n):
                    pushes[j][k].wait()
                    i = slice_in(self._rows[j][k])
                    s = self.mine[i]
                    if got[i][j]:
                        raise RuntimeError(f"worker {j} pushed slice {s.id} twice in round {it}")
                    got[i][j] = True
                    self._bufs[i][j] = self._rows[j][k, ID_ELEMENTS : ID_ELEMENTS + s.numel]
                    with lock:
                        left[i] -= 1
                        if left[i] == 0:
                            order = (self._priority(s), s.id) if self.prioritized else (next(seq),)
                            ready.put((order, i))
            except BaseException as e:  # noqa: BLE001 - handed to the server loop
                ready.put(((-1,), e))

        threads = [threading.Thread(target=receive, args=(j,), name=f"recv{j}", daemon=True) for j in range(W)]
        for t in threads:
            t.start()
        for _ in range(n):
            _, i = ready.get()
            if isinstance(i, BaseException):
                raise i
            yield i
        for t in threads:
            t.join()
