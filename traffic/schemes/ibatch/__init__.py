"""iBatch (``ibatch``): parameter pulls in batches of layers, overlapped with the forward pass.

iBatch (Wang, Pi, Zhou, AAAI 2019) is a pull strategy of the
parameter server: a worker pulls the model's parameters in *batches* of consecutive layers
and runs the forward computation of batch ``i-1`` while it pulls batch ``i`` (two threads,
the paper's Implementation section). The batches come from a profile measured at the start
of the run and the paper's two greedy algorithms (:mod:`traffic.schemes.ibatch.batching`).

Servers, keys and shards are the ``ps`` scheme's (:class:`~traffic.schemes.ps.ParameterServer`:
``bigarray_bound``, one optimizer per shard, worker 0 initialises the servers). What
differs is how updated shards reach the workers: a server does not send them unasked, as
``ps`` does; it answers *pull requests*. A pull of layers ``[lo, hi)`` is one request (4
int64: kind, lo, hi, iteration; tag ``REQUEST_TAG``) to every server holding shards of those
layers, each answered with those shards (tag = shard id, as ``ps``) once they are updated; so
every pull pays a start-up (request, server lookup, first reply) besides the transfer.

Options (``workload.options``, :class:`IBatchOptions`):
    pull: ``default`` (one pull of every layer, then the forward pass), ``layer_by_layer``
        (one pull per layer, forward of layer ``l`` as soon as layer ``l`` is in) or
        ``ibatch`` (the chosen batches); default ``ibatch``.
    profile_iterations: ``P`` >= 1 (default 2), profiling iterations (below).
    overlap: as ``ps``: push each layer's gradient as soon as its backward ends (the P3
        paper's wait-free-backprop baseline); default false (push after the whole backward,
        as the paper's Fig. 5).
    bigarray_bound: as ``ps``.

Worker, iteration ``it`` (iteration 0 computes with the initial parameters, no pull):

* ``on_iteration_start(it)``: queue the iteration's pulls on the *pull thread* (a
  :class:`~traffic.runtime.comm.CommThread` named ``pull``, FIFO, so pulls run back to
  back): first a ``sync`` (a request every server answers with one element once all its
  shards of the round are updated: the synchronization barrier, kept out of the measured
  pulls), then one ``pull_batch`` per batch.
* ``before_forward(it, l)``: wait for the pull of the batch holding layer ``l`` -- the
  compute thread runs forward of batch ``i-1`` while the pull thread pulls batch ``i``.
* push: as ``ps`` (bulk in ``on_backward_end``, or per layer with ``overlap``).
* ``finish``: one final pull of every layer (the final parameters in the model).
* worker 0 in real compute, before an evaluation (``workload.eval_every``): the pulls of
  iteration ``it + 1`` run (and are waited for) in ``on_backward_end(it)``, so it
  evaluates the updated model.

Servers answer pull requests in rounds: round ``it`` (after the pushes of iteration ``it``)
has one thread per worker (``serve<j>``) answering that worker's requests of iteration
``it + 1`` until it has pulled every shard of the server once; a shard is sent once its
update of the round is done.

Host cost (``host.request_startup_ms``, :class:`~traffic.hostmodel.costs.HostCosts` kind
``request_startup``): a server pays it once per ``pull`` request and once per ``probe``,
after receiving the request and before answering it (the lookup of the requested shards is
the real work inside it). This is the paper's ``T_s``: "The time in each communication
consists of a startup time (e.g., searching the servers that store parameters and handling
TCP connections) and a transfer time. The startup time is independent of the size of
parameters in the communication" (iBatch, Case Study), measured as "The runtime
difference between getWeights and fetchBlockSync is regarded as T_s" (Implementation,
"Computation and communication profile"). So the probe, which stands for the part of a
pull that is not transfer, pays it as a pull does, and the workers' measured ``T_s``
(below) includes it while ``T_t^i`` (a layer's pull minus ``T_s``) does not. A ``sync``
does not pay it: it is this emulation's synchronization barrier, not a communication of the
paper's model (eqs. (1)-(3) count ``N`` startups for ``N`` batches, none for the barrier),
and it is kept out of the measured pulls.

Profiling (iterations ``1 .. P``), measured by the workers over the network as it is:
after the ``sync``, a ``probe`` (a request every server answers at once with one element)
gives ``T_s``, then every layer is pulled alone, one after another, and the forward pass
starts once all are in: ``T_t^i`` = pull time of layer ``i`` alone minus ``T_s``. ``C^i``
is the duration of the ``forward`` events the Trainer logs (iterations ``0 .. P``, as
executed: slept in emulated compute). Per worker the median over the profiling iterations;
at the start of iteration ``P + 1`` every worker sends its profile to worker 0, which
averages them, runs Algorithms 1 and 2, takes the smaller eq. (4), writes ``ibatch.json``
into the run directory (format in :mod:`traffic.rundir`) and sends the batch ends of the
configured strategy to every worker; from then on pulls follow them. All three strategies
profile the same way, so their runs differ only in the pulls after iteration ``P``.
Choose ``workload.warmup_iterations`` > ``P`` to leave profiling out of throughput.

Light memory (``workload.compute.memory: light``, :mod:`traffic.runtime.buffers`): the
tensors are ``ps``'s: pushes are sent from the shared zeros, every pull (the profiling
rounds' single layers, the batches, the final pull) lands on scratch of its shard's size,
and a server receives onto scratch, sends zeros and skips its summation and step (their
stated host costs are still charged). Requests, one-element answers, profiles and batch
ends are small tensors of their own, read as in full memory; the profile is timed over the
same messages, so the batches are chosen the same way.

Events (worker): ``sync`` and ``probe`` (spans on thread ``pull``, ``servers``),
``pull_request`` (tx, 32 bytes) and ``pull_reply`` (rx, 4 bytes) of those, ``pull_batch``
(span of one batch pull: ``batch``, ``first_layer``, ``last_layer`` (0-based, inclusive),
``servers``, ``payload_bytes``, ``profiling``), ``pull`` (rx, per shard, as ``ps``),
``batching`` (instant at the decision: ``ends``, ``strategy``). Server: ``pull_request``
(rx), ``pull_reply`` and ``pull`` (tx, per shard, on thread ``serve<j>`` for worker ``j``),
``host_request_startup`` (span of the charge: ``iteration``, ``request`` (``pull`` or
``probe``), ``worker``, and for a pull ``first_layer``, ``last_layer``).
Results: ``pull``, ``batch_ends``, ``ibatch_profile`` (this worker's measured profile).

Timing model and algorithms: :mod:`traffic.schemes.ibatch.batching` (eqs. (1)-(5), Algorithms 1-2),
which :mod:`analysis.paper_models.ibatch` re-exports for the analysis.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future

import torch
from pydantic import Field, field_validator

from traffic.rundir import write_json
from traffic.runtime.comm import CommThread
from traffic.runtime.events import read_events
from traffic.schemes import register
from traffic.schemes.base import ProcessPlan
from traffic.schemes.ibatch.batching import (
    STRATEGIES,
    PullProfile,
    Strategy,
    choose_batching,
    exe_time,
    optimal_batching,
    pipeline_time,
    satisfies_constraint,
    strategy_ends,
)
from traffic.schemes.ps import ELEMENT_BYTES, ParameterServer, PSOptions

__all__ = ["IBatch", "IBatchOptions", "STRATEGIES", "REQUEST_TAG", "REPLY_TAG"]

REQUEST_TAG = (1 << 30) + 11  # worker -> server pull requests
REPLY_TAG = (1 << 30) + 12  # server -> worker one-element answers to sync and probe
PROFILE_TAG = (1 << 30) + 13  # worker j -> worker 0: measured profile
BATCHING_TAG = (1 << 30) + 14  # worker 0 -> worker j: batch ends

PULL, PROBE, SYNC = 0, 1, 2
#: payload bytes of a request (4 int64) and of the one-element answer to a sync or probe
REQUEST_BYTES, REPLY_BYTES = 32, 4
_REQUEST_NAMES = {PULL: "pull", PROBE: "probe", SYNC: "sync"}
PROFILE_FILE = "ibatch.json"


class IBatchOptions(PSOptions):
    """Options of ``ibatch``: ``ps``'s (``bigarray_bound``, ``overlap``) and the pull strategy."""

    pull: Strategy = "ibatch"
    """How a worker pulls the parameters: ``default`` (one pull of every layer, then the
    forward pass), ``layer_by_layer`` (one pull per layer, forward of layer ``l`` as soon as
    layer ``l`` is in) or ``ibatch`` (the batches of Algorithms 1-2)."""
    profile_iterations: int = Field(2, ge=1)
    """``P``: iterations ``1 .. P`` measure the pull and forward times the batches are chosen from."""

    # check_fields=False: validates ps's ``pull_request`` when PSOptions has it (the MXNet-like
    # notify-then-pull of ``ps``); without that field, an unknown option is an error anyway
    @field_validator("pull_request", check_fields=False)
    @classmethod
    def _pull_request_is_ps_only(cls, v):
        if v:
            raise ValueError("false (ibatch always pulls by request; pull_request applies to ps)")
        return v


@register("ibatch")
class IBatch(ParameterServer):
    """Parameter server with pulls on request: default, layer by layer or iBatch batches
    (see the module docstring). Options: :class:`IBatchOptions`."""

    Options = IBatchOptions
    light_refusal = None  # its payloads are ps's (module docstring, "Light memory")

    @classmethod
    def message_bytes(cls, workload, processes: Sequence[ProcessPlan]) -> float:
        """Mean bytes per message (:meth:`Scheme.message_bytes`): per iteration a worker
        pushes and pulls every shard of :func:`~traffic.schemes.ps.assign_keys` (as ``ps``),
        sends a ``sync`` request (:data:`REQUEST_BYTES`) to every server holding shards and
        gets a :data:`REPLY_BYTES` answer from each, and sends one pull request per batch and
        server holding shards of the batch: ``pull: default`` one batch of every layer;
        ``layer_by_layer``, and ``ibatch`` (whose batches are chosen at run time from a
        measured profile, at most one per layer), one batch per layer -- the most requests,
        the smallest mean.

        Raises:
            KeyError: unknown model.
        """
        opts = cls.options_of(workload)
        keys, shards = cls.planned_shards(workload, processes)
        active = len({s.server for s in shards})
        if opts.pull == "default":
            requests = active
        else:
            requests = len({(keys[s.key][1], s.server) for s in shards})
        data = ELEMENT_BYTES * sum(s.numel for s in shards)
        return (2 * data + active * (REQUEST_BYTES + REPLY_BYTES) + requests * REQUEST_BYTES) / (
            2 * len(shards) + 2 * active + requests
        )

    @property
    def strategy(self) -> str:
        return self.opts.pull

    @property
    def profile_iterations(self) -> int:
        return self.opts.profile_iterations

    # ---------------------------------------------------------------- worker

    def setup(self) -> None:
        """The ``ps`` setup (shards, initial values to the servers) and the pull thread."""
        super().setup()
        self.L = len(self.ctx.model.layers)
        self.active_servers = sorted({s.server for s in self.shards})
        self._puller = CommThread("pull")
        self._started: set[int] = set()
        self._ready: list[Future] = []  # per layer: the pull that brings it, current iteration
        self._ends: tuple[int, ...] | None = None
        self._probe_s: list[float] = []
        self._layer_pull_s: list[list[float]] = [[] for _ in range(self.L)]
        self._local_profile: PullProfile | None = None  # once measured

    def _request(self, server: int, kind: int, lo: int, hi: int, it: int):
        t = torch.tensor([kind, lo, hi, it], dtype=torch.int64)
        return self.ctx.transport.isend(
            t,
            self.server_ranks[server],
            tag=REQUEST_TAG,
            kind="pull_request",
            iteration=it,
            request=_REQUEST_NAMES[kind],
            first_layer=lo,
            last_layer=hi - 1,
        )

    def _ask_all(self, it: int, kind: int) -> float:
        """Pull-thread job: a ``sync`` or ``probe`` request to every server holding shards;
        returns the seconds until every one-element answer was in."""
        tr, name = self.ctx.transport, _REQUEST_NAMES[kind]
        t0 = time.perf_counter()
        with self.ctx.events.span(name, iteration=it, servers=len(self.active_servers)):
            bufs = [torch.empty(1) for _ in self.active_servers]
            replies = [
                tr.irecv(b, self.server_ranks[s], tag=REPLY_TAG, kind="pull_reply", iteration=it, request=name)
                for b, s in zip(bufs, self.active_servers)
            ]
            tr.wait_all([self._request(s, kind, 0, 0, it) for s in self.active_servers])
            tr.wait_all(replies)
        return time.perf_counter() - t0

    def _pull_batch(self, it: int, b: int, lo: int, hi: int, profiling: bool = False) -> float:
        """Pull-thread job: pull layers ``[lo, hi)`` (one request per server holding shards of
        them, the shards received straight into the model, light memory onto scratch); returns
        the seconds it took
        (0 and no message when the layers have no parameters)."""
        shards = [s for l in range(lo, hi) for s in self.layer_shards[l]]
        if not shards:
            return 0.0
        tr = self.ctx.transport
        servers = sorted({s.server for s in shards})
        t0 = time.perf_counter()
        with self.ctx.events.span(
            "pull_batch",
            iteration=it,
            batch=b,
            first_layer=lo,
            last_layer=hi - 1,
            servers=len(servers),
            payload_bytes=4 * sum(s.numel for s in shards),
            profiling=profiling,
        ):
            pulls = [self._post_pull(it, s) for s in shards]
            tr.wait_all([self._request(srv, PULL, lo, hi, it) for srv in servers])
            tr.wait_all(pulls)
        dt = time.perf_counter() - t0
        if profiling:
            self._layer_pull_s[lo].append(dt)
        return dt

    def _start_pulls(self, it: int) -> None:
        """Queue iteration ``it``'s pulls on the pull thread (once); decide the batches first
        at iteration ``P + 1``."""
        if it in self._started:
            return
        self._started.add(it)
        P = self.profile_iterations
        if it > P and self._ends is None:
            self._decide()
        sub = self._puller.submit
        sub(self._ask_all, it, SYNC)
        if it <= P:  # profiling: T_s, then every layer alone; the forward waits for all
            sub(lambda: self._probe_s.append(self._ask_all(it, PROBE)))
            last = None
            for l in range(self.L):
                last = sub(self._pull_batch, it, l, l, l + 1, True)
            self._ready = [last] * self.L
            return
        self._ready = [None] * self.L
        prev = 0
        for b, hi in enumerate(self._ends):
            lo, prev = prev, hi
            fut = sub(self._pull_batch, it, b, lo, hi)
            for l in range(lo, hi):
                self._ready[l] = fut

    def on_iteration_start(self, it: int) -> None:
        """Queue the pulls of iteration ``it`` (none in iteration 0: the initial parameters)."""
        if it > 0:
            self._start_pulls(it)

    def before_forward(self, it: int, layer: int) -> None:
        """Wait until the pull bringing layer ``layer`` is done (re-raises its error)."""
        if it > 0:
            self._ready[layer].result()

    def after_backward(self, it: int, layer: int) -> None:
        """With ``overlap``: queue layer ``layer``'s pushes on the comm thread (no pull here)."""
        if self.overlapped and self.layer_shards[layer]:
            self._submit_push(it, layer, [(s, self._grad_slice(s)) for s in self.layer_shards[layer]])

    def on_backward_end(self, it: int) -> None:
        """Bulk: push every shard. Worker 0, before an evaluation, also pulls iteration
        ``it + 1``'s parameters now, so that it evaluates the updated model."""
        tr = self.ctx.transport
        if not self.overlapped:
            tr.wait_all(
                [
                    tr.isend(
                        self._grad_slice(s),
                        self.server_ranks[s.server],
                        tag=s.id,
                        kind=self.push_kind,
                        **self._fields(it, s),
                    )
                    for s in self.shards
                ]
            )
        every, n = self.ctx.workload.eval_every, self.ctx.iterations
        evaluates = self.ctx.index == 0 and self.ctx.workload.compute.mode != "emulated"
        if evaluates and every > 0 and (it + 1) % every == 0 and it + 1 < n:
            self._start_pulls(it + 1)
            for f in self._ready:
                f.result()

    def finish(self) -> None:
        """Pull every layer once more (the final parameters), stop the pull thread, drain pushes."""
        n = self.ctx.iterations
        self._puller.submit(self._ask_all, n, SYNC)
        self._puller.submit(self._pull_batch, n, 0, 0, self.L).result()
        self._puller.close()
        self._puller.check()
        if self.overlapped:
            self.ctx.comm.drain()
        r = self.ctx.results
        r["pull"] = self.strategy
        r["batch_ends"] = list(self._ends) if self._ends else None
        r["ibatch_profile"] = self._local_profile.to_dict() if self._local_profile else None

    # ---------------------------------------------------------------- profile and decision

    def _measure(self) -> PullProfile:
        """This worker's profile from profiling iterations ``1 .. P`` (medians; see module doc).

        Raises:
            RuntimeError: a layer has no ``forward`` event or no pull time.
        """
        P = self.profile_iterations
        fwd: list[list[float]] = [[] for _ in range(self.L)]
        for e in read_events(self.ctx.events.path):
            if e["kind"] == "forward" and e.get("iteration") is not None and e["iteration"] <= P:
                fwd[e["layer"]].append(float(e["dur"]))
        if any(not f for f in fwd):
            raise RuntimeError("ibatch: a layer has no forward event in the profiling iterations")
        ts = statistics.median(self._probe_s)
        tt = [max(0.0, statistics.median(x) - ts) if x else 0.0 for x in self._layer_pull_s]
        return PullProfile([statistics.median(f) for f in fwd], tt, ts)

    def _decide(self) -> None:
        """Exchange profiles with worker 0 and receive the batch ends (worker 0 decides)."""
        tr, L = self.ctx.transport, self.L
        self._local_profile = mine = self._measure()
        vec = torch.tensor([mine.startup_s, *mine.forward_s, *mine.transfer_s], dtype=torch.float64)
        ends_t = torch.zeros(L + 1, dtype=torch.int64)
        w0 = self.worker_ranks[0]
        if self.ctx.index != 0:
            tr.send(vec, w0, tag=PROFILE_TAG, kind="profile")
            tr.recv(ends_t, w0, tag=BATCHING_TAG, kind="batching")
            ends = tuple(int(x) for x in ends_t[1 : 1 + int(ends_t[0])])
        else:
            vecs = [vec]
            for wr in self.worker_ranks[1:]:
                v = torch.empty_like(vec)
                tr.recv(v, wr, tag=PROFILE_TAG, kind="profile")
                vecs.append(v)
            ends = self._choose([PullProfile(v[1 : 1 + L].tolist(), v[1 + L :].tolist(), float(v[0])) for v in vecs])
            ends_t[0] = len(ends)
            ends_t[1 : 1 + len(ends)] = torch.tensor(ends, dtype=torch.int64)
            for wr in self.worker_ranks[1:]:
                tr.send(ends_t, wr, tag=BATCHING_TAG, kind="batching")
        self._ends = strategy_ends(self.strategy, L, ends)
        self.ctx.events.instant("batching", strategy=self.strategy, ends=list(self._ends))

    def _choose(self, profiles: list[PullProfile]) -> tuple[int, ...]:
        """Worker 0: mean profile over workers, the batches (Algorithms 1, 2, eq. (4)), and
        ``ibatch.json``; returns the batch ends of the configured strategy."""
        n = len(profiles)
        mean = PullProfile(
            [sum(p.forward_s[l] for p in profiles) / n for l in range(self.L)],
            [sum(p.transfer_s[l] for p in profiles) / n for l in range(self.L)],
            sum(p.startup_s for p in profiles) / n,
        )
        choice = choose_batching(mean)
        opt_ends, opt_s = optimal_batching(mean)
        used = strategy_ends(self.strategy, self.L, choice["ends"])

        def describe(ends):
            ends = tuple(ends)
            return {
                "ends": list(ends),
                "batches": [[lo, hi - 1] for lo, hi in zip((0,) + ends[:-1], ends)],
                "exe_s": exe_time(mean, ends),
                "pipeline_s": pipeline_time(mean, ends),
                "meets_constraint": satisfies_constraint(mean, ends),
            }

        model = self.ctx.model
        write_json(
            self.ctx.run_dir / PROFILE_FILE,
            {
                "strategy": self.strategy,
                "profile_iterations": self.profile_iterations,
                "scale": self.ctx.scale,
                "time_unit": "seconds of wall clock in this run (divide by scale for the emulated network)",
                "workers": len(self.worker_ranks),
                "servers": len(self.server_ranks),
                "layers": self.L,
                "layer_names": list(getattr(model, "layer_names", [])),
                "layer_params": model.layer_numels(),
                "profile": mean.to_dict(),
                "per_worker": [p.to_dict() for p in profiles],
                "candidates": {k: describe(choice[k]) for k in ("algorithm1", "algorithm2")},
                "chosen": choice["chosen"],
                "optimal": {**describe(opt_ends), "exe_s": opt_s},
                "strategies": {s: describe(strategy_ends(s, self.L, choice["ends"])) for s in STRATEGIES},
                "used": describe(used),
            },
        )
        return used

    # ---------------------------------------------------------------- server

    def _round_start(self, it: int) -> None:
        """Start one thread per worker that answers its pull requests of round ``it`` (the
        pulls of iteration ``it + 1``, or the final pull)."""
        self._updated = [threading.Event() for _ in self.mine]
        self._serve_errors: list[BaseException] = []
        self._serving = [
            threading.Thread(target=self._serve, args=(it, j, wr), name=f"serve{j}", daemon=True)
            for j, wr in enumerate(self.worker_ranks)
        ]
        for t in self._serving:
            t.start()

    def _publish(self, it: int, i: int) -> list:
        """Shard ``i`` is updated: requests waiting for it may be answered (nothing is sent unasked)."""
        self._updated[i].set()
        return []

    def _round_end(self, it: int) -> None:
        """Wait until every worker pulled every own shard of round ``it``.

        Raises:
            the first error of a serving thread.
        """
        for t in self._serving:
            t.join()
        if self._serve_errors:
            raise self._serve_errors[0]

    def _serve(self, it: int, j: int, wr: int) -> None:
        """Answer worker ``j``'s requests until it has pulled every own shard once; each
        ``pull`` and ``probe`` request is charged ``request_startup`` (module docstring)."""
        tr, costs = self.ctx.transport, self.ctx.costs
        try:
            left = list(range(len(self.mine)))
            sends, req = [], torch.empty(4, dtype=torch.int64)
            while left:
                tr.recv(req, wr, tag=REQUEST_TAG, kind="pull_request", iteration=it)
                kind, lo, hi, rit = (int(x) for x in req)
                if rit != it + 1:
                    raise RuntimeError(f"ibatch server: request of iteration {rit} from worker {j} in round {it}")
                if kind in (PROBE, SYNC):
                    if kind == SYNC:  # the barrier: no startup (not a communication of the paper's model)
                        for e in self._updated:
                            e.wait()
                    else:
                        with costs.charge("request_startup", iteration=rit, request="probe", worker=j):
                            pass
                    sends.append(
                        tr.isend(
                            torch.zeros(1),
                            wr,
                            tag=REPLY_TAG,
                            kind="pull_reply",
                            iteration=rit,
                            request=_REQUEST_NAMES[kind],
                        )
                    )
                    continue
                with costs.charge(
                    "request_startup", iteration=rit, request="pull", worker=j, first_layer=lo, last_layer=hi - 1
                ):
                    now = [i for i in left if lo <= self.key_layer[self.mine[i].key] < hi]  # the shard lookup
                for i in now:
                    self._updated[i].wait()
                    s = self.mine[i]
                    sends.append(
                        tr.isend(self.values[i].detach(), wr, tag=s.id, kind=self.pull_kind, **self._fields(rit, s))
                    )
                left = [i for i in left if i not in now]
            tr.wait_all(sends)
        except BaseException as e:  # noqa: BLE001 - raised by _round_end
            self._serve_errors.append(e)
