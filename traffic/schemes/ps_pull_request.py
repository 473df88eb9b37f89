"""Update notification, then pull request: MXNet KVStore's pull path, for ``ps`` (option ``pull_request``).

The P3 paper describes its baseline, MXNet's KVStore over ps-lite (P3 Sec. 4.1, "KVStore:
Baseline system"): once a server has aggregated and updated a key it sends an update
*notification*; "KVWorker receives a notification, it immediately issues a Pull request to
the KVServer(s) for the corresponding updated parameter values. KVServer then sends the
latest parameter values in response and KVWorker (reconstructs for large layers) updates
the local parameter values for the next iteration". P3 removes both messages (Sec. 4.2: "we
remove the explicit update notification and pull requests from the KVServer. P3Server
immediately broadcasts the updated parameters ... This modification was necessary because
MXNet only issues a pull request once it has received the update notification for all the
slices of a layer"). ``ps`` without ``pull_request`` behaves as P3Server does (unasked
sends); with it, as the baseline, through the two classes here.

Messages (all int64, 16 bytes of payload):

* notification, server -> worker, tag :data:`NOTIFY_TAG`: ``[shard id, iteration]``, one
  per updated shard and worker, sent right after the shard's update;
* pull request, worker -> server, tag :data:`PULL_REQUEST_TAG`: ``[layer, iteration]``,
  sent by a worker once it holds the notifications of *every* shard of ``layer`` (from all
  servers): one request to each server holding shards of the layer;
* the answer: each of that server's shards of the layer, tag = shard id, straight into the
  worker's model (as ``ps``'s unasked sends).

Per iteration and worker that is one notification per shard (``W x`` shards per iteration
over all workers) and, per layer with parameters, one request per server holding shards
of it.

Worker (:class:`NotifiedPuller`): one thread ``notify<s>`` per server ``s`` holding shards
receives that server's notifications in arrival order and queues them; one thread ``pull``
takes them from the queue and counts each layer's; when the last notification of a layer
arrives it posts the receives of the layer's shards into the model and sends the layer's
requests at once (as the quote: "immediately"), so layers are requested in the order their
updates complete (forward order in bulk mode, where servers update in key order; last layer
first with ``overlap``, where they update in the order the gradients were pushed). The
compute thread waits per layer (:meth:`NotifiedPuller.wait_layer`, from ``before_forward``),
or for a whole round (:meth:`NotifiedPuller.wait_round`).

Server (:class:`RequestResponder`): per round one thread ``respond<j>`` per worker ``j``
answers that worker's requests until it has asked once for every layer the server holds
shards of. Each request is charged the host cost ``request_startup`` (``host.request_startup_ms``;
the shard lookup is the real work inside the charge) before the answer is posted: the
per-request start-up of a parameter server (iBatch's ``T_s``, iBatch, Case Study: "a
startup time (e.g., searching the servers that store parameters and handling TCP
connections)"); it is 0 unless the host model states it. A request for a shard not yet
updated, of another iteration, or for a layer asked already or not held is a protocol error
(``RuntimeError``): the worker asks only after the notifications, which the server sends
after the updates.

Events: worker ``notify`` (rx, thread ``notify<s>``: ``iteration``, ``server``),
``pull_request`` (tx, thread ``pull``: ``iteration``, ``layer``, ``server``, ``shards``),
``pull`` (rx, per shard, as ``ps``); server ``notify`` (tx, per shard and worker, with
``ps``'s shard fields), ``pull_request`` (rx, thread ``respond<j>``: ``iteration``,
``worker``), ``host_request_startup`` (the charge: ``iteration``, ``layer``, ``worker``,
``request="pull"``), ``pull`` (tx, per shard).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future

import torch

from traffic.hostmodel.costs import HostCosts
from traffic.runtime.transport import Pending, Transport

__all__ = [
    "NOTIFY_TAG",
    "PULL_REQUEST_TAG",
    "NOTIFY_KIND",
    "REQUEST_KIND",
    "CONTROL_BYTES",
    "NotifiedPuller",
    "RequestResponder",
]

NOTIFY_TAG = (1 << 30) + 21  # server -> worker update notifications
PULL_REQUEST_TAG = (1 << 30) + 22  # worker -> server pull requests (ibatch uses + 11 .. + 14, p3 + 0)
NOTIFY_KIND = "notify"
REQUEST_KIND = "pull_request"
#: payload bytes of a notification and of a pull request (2 int64)
CONTROL_BYTES = 16


def _by_layer(shards: Sequence, key_layer: Sequence[int]) -> dict[int, list]:
    """Layer index -> its shards (shard order); layers without shards are absent."""
    out: dict[int, list] = {}
    for s in shards:
        out.setdefault(key_layer[s.key], []).append(s)
    return out


class NotifiedPuller:
    """Worker side: pulls each layer of each round once its notifications are all in.

    Args:
        transport: the worker's transport.
        shards: every shard of the model (:class:`traffic.schemes.ps.Shard`: ``id``,
            ``key``, ``server``).
        key_layer: layer index of each key (forward order).
        server_ranks: global rank of each server index.
        rounds: number of rounds (training iterations) the servers run.
        post_pull: ``post_pull(it, shard)`` posts the receive of a shard's values of round
            ``it`` into the model and returns its :class:`Pending`.

    Rounds are ``0 .. rounds - 1``; round ``it`` brings the parameters the forward pass of
    iteration ``it + 1`` (or, for the last round, the final model) reads. Call
    :meth:`start` once, then :meth:`wait_layer` / :meth:`wait_round` from one thread (the
    compute thread), and :meth:`close` at the end.
    """

    def __init__(
        self,
        transport: Transport,
        shards: Sequence,
        key_layer: Sequence[int],
        server_ranks: Sequence[int],
        rounds: int,
        post_pull: Callable[[int, object], Pending],
    ):
        self.tr, self.rounds, self.post_pull = transport, rounds, post_pull
        self.server_ranks = list(server_ranks)
        self.layer_of = {s.id: key_layer[s.key] for s in shards}
        self.layer_shards = _by_layer(shards, key_layer)
        self.layer_servers = {l: sorted({s.server for s in ss}) for l, ss in self.layer_shards.items()}
        self.per_server: dict[int, int] = {}
        for s in shards:
            self.per_server[s.server] = self.per_server.get(s.server, 0) + 1
        self._notes: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._ready: dict[tuple[int, int], Future] = {}  # (round, layer) -> Future of its pulls
        self._waited: dict[int, set[int]] = {}  # round -> layers waited for
        self._error: BaseException | None = None
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Start the ``notify<s>`` receiver threads and the ``pull`` thread."""
        self._threads = [
            threading.Thread(target=self._receive, args=(s,), name=f"notify{s}", daemon=True)
            for s in sorted(self.per_server)
        ]
        self._threads.append(threading.Thread(target=self._pull, name="pull", daemon=True))
        for t in self._threads:
            t.start()

    # ---------------------------------------------------------------- threads

    def _receive(self, server: int) -> None:
        """Thread ``notify<server>``: every notification of that server, in arrival order."""
        buf = torch.empty(2, dtype=torch.int64)
        try:
            for it in range(self.rounds):
                for _ in range(self.per_server[server]):
                    self.tr.recv(
                        buf, self.server_ranks[server], tag=NOTIFY_TAG, kind=NOTIFY_KIND, iteration=it, server=server
                    )
                    self._notes.put((int(buf[0]), int(buf[1]), server))
        except BaseException as e:  # noqa: BLE001 - handed to the pull thread
            self._notes.put(e)

    def _pull(self) -> None:
        """Thread ``pull``: count notifications per layer; request a layer once all are in."""
        try:
            for it in range(self.rounds):
                left = {l: len(ss) for l, ss in self.layer_shards.items()}
                while left:
                    note = self._notes.get()
                    if isinstance(note, BaseException):
                        raise note
                    sid, rit, server = note
                    l = self.layer_of.get(sid)
                    if rit != it or l not in left:
                        raise RuntimeError(
                            f"ps pull_request: unexpected notification of shard {sid}, iteration "
                            f"{rit} from server {server} in round {it}"
                        )
                    left[l] -= 1
                    if left[l] == 0:
                        del left[l]
                        self._future(it, l).set_result(self._request(it, l))
        except BaseException as e:  # noqa: BLE001 - raised on the compute thread by wait_layer
            with self._lock:
                self._error = e
                futures = [f for f in self._ready.values() if not f.done()]
            for f in futures:
                f.set_exception(e)

    def _request(self, it: int, layer: int) -> list[Pending]:
        """Post the receives of ``layer``'s shards, then send its requests; returns the receives."""
        tr, shards = self.tr, self.layer_shards[layer]
        pulls = [self.post_pull(it, s) for s in shards]
        msg = torch.tensor([layer, it], dtype=torch.int64)
        tr.wait_all(
            [
                tr.isend(
                    msg,
                    self.server_ranks[srv],
                    tag=PULL_REQUEST_TAG,
                    kind=REQUEST_KIND,
                    iteration=it,
                    layer=layer,
                    server=srv,
                    shards=sum(1 for s in shards if s.server == srv),
                )
                for srv in self.layer_servers[layer]
            ]
        )
        return pulls

    def _future(self, it: int, layer: int) -> Future:
        with self._lock:
            fut = self._ready.get((it, layer))
            if fut is None:
                fut = self._ready[(it, layer)] = Future()
                if self._error is not None:
                    fut.set_exception(self._error)
            return fut

    # ---------------------------------------------------------------- compute thread

    def wait_layer(self, it: int, layer: int) -> None:
        """Block until ``layer``'s values of round ``it`` are in the model (at once for a layer
        without parameters, or one waited for already).

        Raises:
            RuntimeError / DistBackendError: a protocol error or a failed transfer (of any
                thread of this puller).
        """
        if layer not in self.layer_shards or layer in self._waited.get(it, ()):
            return
        self.tr.wait_all(self._future(it, layer).result())
        with self._lock:
            del self._ready[(it, layer)]
        for old in [r for r in self._waited if r < it]:
            del self._waited[old]
        self._waited.setdefault(it, set()).add(layer)

    def wait_round(self, it: int) -> None:
        """Block until every layer's values of round ``it`` are in the model (raises as :meth:`wait_layer`)."""
        for layer in sorted(self.layer_shards):
            self.wait_layer(it, layer)

    def close(self) -> None:
        """Join the threads (after the last round: call :meth:`wait_round` of it first).

        Raises:
            the first error of the threads.
        """
        for t in self._threads:
            t.join()
        if self._error is not None:
            raise self._error


class RequestResponder:
    """Server side: notifies the workers of each updated shard and answers their pull requests.

    Args:
        transport: the server's transport.
        costs: the server's host costs (``request_startup`` per request).
        mine: this server's shards (:class:`traffic.schemes.ps.Shard`).
        values: their current values (1-D tensors, same order), updated in place each round.
        key_layer: layer index of each key.
        worker_ranks: global rank of each worker index.
        pull_kind: event kind of a sent shard (``ps``: ``pull``).
        fields: ``fields(it, shard)``: the event fields of a shard's messages.

    Per round ``it``: :meth:`start_round` before any update, :meth:`notify` after each
    shard's update, :meth:`end_round` after waiting for the notifications' sends and before
    the next round changes ``values``.
    """

    def __init__(
        self,
        transport: Transport,
        costs: HostCosts,
        mine: Sequence,
        values: Sequence[torch.Tensor],
        key_layer: Sequence[int],
        worker_ranks: Sequence[int],
        pull_kind: str,
        fields: Callable[[int, object], dict],
    ):
        self.tr, self.costs, self.mine, self.values = transport, costs, list(mine), list(values)
        self.worker_ranks, self.pull_kind, self.fields = list(worker_ranks), pull_kind, fields
        self.own_layers: dict[int, list[int]] = {}  # layer -> indices into mine
        for i, s in enumerate(self.mine):
            self.own_layers.setdefault(key_layer[s.key], []).append(i)
        self._updated: list[threading.Event] = []
        self._errors: list[BaseException] = []
        self._threads: list[threading.Thread] = []

    def start_round(self, it: int) -> None:
        """Start one ``respond<j>`` thread per worker for round ``it``."""
        self._updated = [threading.Event() for _ in self.mine]
        self._errors = []
        self._threads = [
            threading.Thread(target=self._serve, args=(it, j, wr), name=f"respond{j}", daemon=True)
            for j, wr in enumerate(self.worker_ranks)
        ]
        for t in self._threads:
            t.start()

    def notify(self, it: int, i: int) -> list[Pending]:
        """Shard ``mine[i]`` was updated in round ``it``: its notification to every worker
        (returns the sends, to wait for before :meth:`end_round`)."""
        self._updated[i].set()
        s = self.mine[i]
        msg = torch.tensor([s.id, it], dtype=torch.int64)
        return [
            self.tr.isend(msg, wr, tag=NOTIFY_TAG, kind=NOTIFY_KIND, **self.fields(it, s)) for wr in self.worker_ranks
        ]

    def end_round(self, it: int) -> None:
        """Wait until every worker has pulled every own shard of round ``it``.

        Raises:
            the first error of a ``respond<j>`` thread (protocol error or failed transfer).
        """
        for t in self._threads:
            t.join()
        if self._errors:
            raise self._errors[0]

    def _serve(self, it: int, j: int, wr: int) -> None:
        """Thread ``respond<j>``: answer worker ``j``'s requests of round ``it``, one per own layer."""
        tr = self.tr
        try:
            left = dict(self.own_layers)
            req, sends = torch.empty(2, dtype=torch.int64), []
            while left:
                tr.recv(req, wr, tag=PULL_REQUEST_TAG, kind=REQUEST_KIND, iteration=it, worker=j)
                layer, rit = int(req[0]), int(req[1])
                with self.costs.charge("request_startup", iteration=it, layer=layer, worker=j, request="pull"):
                    idx = left.pop(layer, None)  # the lookup of the requested shards
                if rit != it or idx is None:
                    raise RuntimeError(
                        f"ps pull_request server: request of layer {layer}, iteration {rit} from "
                        f"worker {j} in round {it} (layers still to answer: {sorted(left)})"
                    )
                late = [self.mine[i].id for i in idx if not self._updated[i].is_set()]
                if late:
                    raise RuntimeError(
                        f"ps pull_request server: worker {j} asked for shards {late} of round {it} "
                        "before their update notification"
                    )
                sends += [
                    tr.isend(
                        self.values[i].detach(),
                        wr,
                        tag=self.mine[i].id,
                        kind=self.pull_kind,
                        **self.fields(it, self.mine[i]),
                    )
                    for i in idx
                ]
            tr.wait_all(sends)
        except BaseException as e:  # noqa: BLE001 - raised by end_round
            self._errors.append(e)
