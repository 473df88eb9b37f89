"""Measure this machine's host rates (``testbed profile --host``): a host profile of it.

A host profile (format in :mod:`traffic.hostmodel`) normally states the rates of a host a paper
describes. This module measures the same five quantities on the machine it runs on, so that
a user can emulate hosts like their own (``host: {profile: <file>}``). Every value is timed
in this process (and, for messages, one helper process), single-threaded by default
(``torch.set_num_threads(threads)``, 1 as in the runtime's processes), each the median of
``repeats`` timed repetitions after ``WARMUP`` untimed ones:

- ``aggregate_gb_per_s``: ``acc += grad`` on float32 tensors (what a server does per copy of a
  gradient); GB (1e9 bytes) of ``grad`` per second.
- ``optimizer_gb_per_s``: one ``step()`` of the optimizer the project builds
  (:func:`traffic.runtime.trainer.make_optimizer` with :class:`traffic.spec.OptimizerSpec`'s
  defaults: ``torch.optim.SGD``, momentum 0.9, weight decay 0) on one parameter with its
  gradient set, momentum buffer already allocated; GB of parameters per second.
- ``codec_gb_per_s``: :class:`traffic.compression.Truncation` (Pipe-SGD's "T", the codec its
  paper applies first, Pipe-SGD Sec. 4: "boosted by compression, i.e., truncation in this
  case"; the ``pipe_sgd`` spec's default, ``none``, charges no codec operation), ``encode``
  and ``decode`` timed separately; the rate is ``2 n / (t_encode + t_decode)`` for ``n``
  uncompressed bytes, because the accountant charges each encode and each decode its
  uncompressed bytes (:mod:`traffic.collectives.ring`).
- ``message_overhead_us``: half the round trip of a 4-byte message between two processes
  through ``torch.distributed`` (gloo, TCP on 127.0.0.1): process 0 ``send`` then ``recv``,
  process 1 ``recv`` then ``send``. Nothing is subtracted: it includes both ends' Python and
  gloo software and the kernel's loopback TCP path (no wire, no NIC).
- ``request_startup_ms``: null. A per-request start-up (iBatch's ``T_s``) is a property of a
  server software stack (iBatch, "Case Study": "searching the servers that store
  parameters and handling TCP connections"), not of the machine's arithmetic; measure it on
  the stack to be emulated (BigDL: getWeights minus fetchBlockSync, iBatch
  "Implementation"). A profile's null resolves to the reference profile's value
  (:data:`traffic.hostmodel.REFERENCE_PROFILE`: written by this module, it states 0 here).

The rate kinds are measured at sizes :data:`SIZES_BYTES` and reported at
:data:`REPORT_BYTES` (4 MiB, MXNet's key chunk: "PHub's default is 32KB, while MXNet's is
4MB", PHub Sec. 3.2.3); each source lists the rates at every size, since small operations
pay a fixed Python cost that a single rate does not model.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import statistics
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import yaml

from common.errors import SpecError, TestbedError
from common.provenance import cpu_model
from common.validation import validate
from traffic.compression import Quantization, Truncation
from traffic.hostmodel import RATE_FIELDS, HostProfile
from traffic.runtime.trainer import make_optimizer
from traffic.spec import OptimizerSpec

__all__ = [
    "SIZES_BYTES",
    "REPORT_BYTES",
    "WARMUP",
    "measure_host_profile",
    "write_host_profile",
    "time_calls",
    "run_pair",
    "machine",
]

KIB, MIB = 1024, 1024 * 1024
#: tensor sizes (bytes of float32) at which the rate kinds are timed
SIZES_BYTES = (32 * KIB, MIB, 4 * MIB, 16 * MIB)
#: the size whose rate a profile reports (MXNet's 4 MB key chunk, PHub Sec. 3.2.3)
REPORT_BYTES = 4 * MIB
#: untimed repetitions before the timed ones
WARMUP = 3
#: bytes of the message timed for ``message_overhead_us`` (one float32)
MESSAGE_BYTES = 4
GB = 1e9


def machine(threads: int) -> str:
    """``<hostname> (<cpu model>, torch <version>, <threads> threads)``."""
    return f"{socket.gethostname()} ({cpu_model()}, torch {torch.__version__}, {threads} threads)"


def time_calls(fn: Callable[[], Any], repeats: int, warmup: int = WARMUP) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn()`` (timed one by one with
    ``time.perf_counter``), after ``warmup`` untimed calls.

    Raises:
        ValueError: ``repeats`` < 1.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


# ---------------------------------------------------------------------------- two processes


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pair_child(rank: int, port: int, threads: int, timeout_s: float, target, args: tuple, conn) -> None:
    """One of the two processes of :func:`run_pair`: join the gloo group, run ``target``,
    send ``("ok", result)`` (rank 0's result; rank 1 sends ``None``) or ``("error", text)``."""
    try:
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        torch.set_num_threads(threads)
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=timedelta(seconds=timeout_s)
        )
        try:
            result = target(rank, *args)
        finally:
            dist.destroy_process_group()
        conn.send(("ok", result if rank == 0 else None))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises
        conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        conn.close()


def run_pair(target: Callable[..., Any], args: Sequence = (), *, threads: int = 1, timeout_s: float = 120.0) -> Any:
    """Run ``target(rank, *args)`` in two new processes (``spawn``) that form a gloo group of
    two over TCP on 127.0.0.1 (``GLOO_SOCKET_IFNAME=lo``), each with ``threads`` torch
    threads; returns rank 0's return value.

    ``target`` must be a module-level function (it is pickled by name) and its result
    picklable. The processes are joined, or terminated after ``timeout_s``.

    Raises:
        TestbedError: a process failed (its error is named) or did not answer in ``timeout_s``.
    """
    ctx = mp.get_context("spawn")
    port = _free_port()
    pipes = [ctx.Pipe(duplex=False) for _ in range(2)]
    procs = [
        ctx.Process(
            target=_pair_child,
            args=(r, port, threads, timeout_s, target, tuple(args), pipes[r][1]),
            name=f"host-measure-{r}",
            daemon=True,
        )
        for r in range(2)
    ]
    for p in procs:
        p.start()
    for _, w in pipes:
        w.close()
    try:
        answers = []
        deadline = time.monotonic() + timeout_s
        for r, (rd, _) in enumerate(pipes):
            if not rd.poll(max(0.0, deadline - time.monotonic())):
                raise TestbedError(
                    f"host measurement: process {r} of the loopback pair did not finish in {timeout_s:.0f} s"
                )
            try:
                answers.append(rd.recv())
            except EOFError:
                raise TestbedError(
                    f"host measurement: process {r} of the loopback pair died (exit code {procs[r].exitcode})"
                ) from None
        for r, (status, value) in enumerate(answers):
            if status != "ok":
                raise TestbedError(f"host measurement: process {r} of the loopback pair failed: {value}")
        return answers[0][1]
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)


def _ping_pong(rank: int, n: int, nbytes: int) -> list[float] | None:
    """:func:`run_pair` target: ``n`` timed round trips (after ``WARMUP``) of an
    ``nbytes``-byte uint8 tensor with ``dist.send``/``dist.recv``; rank 0 returns the seconds
    of each round trip."""
    t = torch.zeros(nbytes, dtype=torch.uint8)
    out = []
    for i in range(WARMUP + n):
        if rank == 0:
            t0 = time.perf_counter()
            dist.send(t, 1)
            dist.recv(t, 1)
            if i >= WARMUP:
                out.append(time.perf_counter() - t0)
        else:
            dist.recv(t, 0)
            dist.send(t, 0)
    return out if rank == 0 else None


# ---------------------------------------------------------------------------- the rate kinds


def _aggregate_s(nbytes: int, repeats: int) -> float:
    n = nbytes // 4
    g = torch.Generator().manual_seed(0)
    acc, grad = torch.zeros(n), torch.randn(n, generator=g)

    def op():
        acc.add_(grad)  # acc += grad

    return statistics.median(time_calls(op, repeats))


def _optimizer_s(nbytes: int, repeats: int) -> float:
    n = nbytes // 4
    g = torch.Generator().manual_seed(0)
    p = torch.nn.Parameter(torch.randn(n, generator=g))
    p.grad = torch.randn(n, generator=g) * 1e-3
    opt = make_optimizer([p], OptimizerSpec())
    return statistics.median(time_calls(opt.step, repeats))  # warm-up steps allocate the momentum


def _codec_s(codec, nbytes: int, repeats: int) -> tuple[float, float]:
    """Median seconds of one ``encode`` and one ``decode`` of ``nbytes`` uncompressed bytes."""
    n = nbytes // 4
    x = torch.randn(n, generator=torch.Generator().manual_seed(0))
    payload = codec.encode(x)
    return (
        statistics.median(time_calls(lambda: codec.encode(x), repeats)),
        statistics.median(time_calls(lambda: codec.decode(payload, n), repeats)),
    )


def _gbps(nbytes: float, seconds: float) -> float:
    return nbytes / seconds / GB


def _sig(x: float) -> float:
    return float(f"{x:.4g}")


def _size(nbytes: int) -> str:
    return f"{nbytes // MIB} MiB" if nbytes >= MIB else f"{nbytes // KIB} KiB"


def _at_sizes(rates: dict[int, float]) -> str:
    return ", ".join(f"{_size(b)}: {r:.3g} GB/s" for b, r in rates.items())


def measure_host_profile(
    threads: int = 1,
    repeats: int = 50,
    round_trips: int = 2000,
    sizes: Sequence[int] = SIZES_BYTES,
    timeout_s: float = 120.0,
) -> dict:
    """Measure this machine's host rates (the module docstring says what is timed).

    Args:
        threads: torch threads of the measuring processes (>= 1; default 1, as the runtime's).
        repeats: timed repetitions of each rate-kind operation at each size (>= 1).
        round_trips: timed message round trips (>= 1).
        sizes: bytes (float32, multiples of 4) at which the rate kinds are timed; must contain
            :data:`REPORT_BYTES`.
        timeout_s: limit of the two-process message measurement.

    Returns:
        A dict in the host-profile file format (:class:`traffic.hostmodel.HostProfile`):
        ``description`` and the five fields, each ``{"value": float | None, "source": str}``
        (units of the field names: us, ms, GB/s).

    Raises:
        TestbedError: a bad argument, or the message measurement failed (gloo on loopback).
    """
    for name, v in (("threads", threads), ("repeats", repeats), ("round trips", round_trips)):
        if v < 1:
            raise TestbedError(f"{name} must be at least 1, got {v}")
    sizes = tuple(int(b) for b in sizes)
    if REPORT_BYTES not in sizes or any(b <= 0 or b % 4 for b in sizes):
        raise TestbedError(f"sizes must be positive multiples of 4 bytes and include {REPORT_BYTES}")
    load = os.getloadavg()[0]  # other processes on the cores make every figure larger
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        agg = {b: _gbps(b, _aggregate_s(b, repeats)) for b in sizes}
        opt = {b: _gbps(b, _optimizer_s(b, repeats)) for b in sizes}
        trunc, quant = {}, {}
        for b in sizes:
            enc, dec = _codec_s(Truncation(), b, repeats)
            trunc[b] = _gbps(2 * b, enc + dec)
        enc_q, dec_q = _codec_s(Quantization(), REPORT_BYTES, repeats)
        quant[REPORT_BYTES] = _gbps(2 * REPORT_BYTES, enc_q + dec_q)
    finally:
        torch.set_num_threads(before)
    rtt = run_pair(_ping_pong, (round_trips, MESSAGE_BYTES), threads=threads, timeout_s=timeout_s)
    msg_us = statistics.median(rtt) / 2 * 1e6

    by = f"measured on {machine(threads)} by `testbed profile --host`"
    at = _size(REPORT_BYTES)
    fixed = "; small operations pay a fixed Python cost a rate does not model"
    return {
        "description": f"this machine, {socket.gethostname()} ({cpu_model()}, {os.cpu_count()} CPUs), "
        f"single process with {threads} torch thread(s): host rates measured by "
        f"`testbed profile --host` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC "
        f"(1-minute load average {load:.2f} when it started)",
        "message_overhead_us": {
            "value": _sig(msg_us),
            "source": f"{by}: half the round trip of a {MESSAGE_BYTES}-byte tensor between two processes, "
            "torch.distributed gloo over TCP on 127.0.0.1 (process 0 send then recv, process 1 recv "
            "then send); nothing subtracted: it includes both ends' Python and gloo software and the "
            f"kernel's loopback TCP path (no wire); median of {round_trips} round trips",
        },
        "request_startup_ms": {
            "value": None,
            "source": "not measured: a per-request start-up (iBatch's T_s) is a property of a server software "
            "stack, not of this machine's arithmetic (iBatch, Case Study: \"searching the servers "
            'that store parameters and handling TCP connections"); measure it on the stack to be '
            "emulated, e.g. BigDL's getWeights minus fetchBlockSync (iBatch, Implementation), and "
            "write it with its command",
        },
        "aggregate_gb_per_s": {
            "value": _sig(agg[REPORT_BYTES]),
            "source": f"{by}: `acc += grad` (Tensor.add_) on float32 tensors of {at}, GB of grad per second, "
            f"median of {repeats}; at every size measured: {_at_sizes(agg)}{fixed}",
        },
        "optimizer_gb_per_s": {
            "value": _sig(opt[REPORT_BYTES]),
            "source": f"{by}: one step() of make_optimizer's torch.optim.SGD (lr 0.05, momentum 0.9, weight "
            f"decay 0: OptimizerSpec's defaults) on one float32 parameter of {at} with its gradient "
            f"set, momentum buffer allocated, GB of parameters per second, median of {repeats}; at "
            f"every size measured: {_at_sizes(opt)}{fixed}",
        },
        "codec_gb_per_s": {
            "value": _sig(trunc[REPORT_BYTES]),
            "source": f'{by}: traffic.compression.Truncation (16-bit truncation, Pipe-SGD\'s "T"; the '
            f"pipe_sgd spec's default codec, none, charges no codec operation) on {at} of float32, "
            f"encode and decode timed separately, 2 x the uncompressed bytes / (encode + decode "
            f"seconds), as each encode and each decode is charged its uncompressed bytes; median of "
            f"{repeats}; at every size measured: {_at_sizes(trunc)}; for comparison "
            f'Quantization (8-bit, "Q") at {at}: {quant[REPORT_BYTES]:.3g} GB/s',
        },
    }


def write_host_profile(profile: dict, path: str | Path) -> Path:
    """Write ``profile`` (:func:`measure_host_profile`'s dict) as a host-profile YAML file with
    a header comment; never overwrites.

    Returns:
        The path written.

    Raises:
        TestbedError: ``path`` exists, cannot be written, or ``profile`` is not a valid host
            profile.
    """
    try:
        validate(HostProfile, profile, "")
    except SpecError as e:
        raise TestbedError(f"not a valid host profile: {e}") from None
    path = Path(path)
    header = [
        "# Host profile of this machine, measured by `testbed profile --host` (traffic/hostmodel/measure.py).",
        "# The rates of THIS machine (one process, the torch threads named in each source), not of a",
        "# host a paper describes: use it to emulate hosts like this one, e.g.",
        f"#   host: {{profile: {path}}}",
        "# Each source says what exactly was timed. request_startup_ms is null (resolves to the reference",
        "# profile's, traffic/hostmodel/data/reference.yaml): a start-up per request belongs to a server",
        "# software stack, not to the machine.",
    ]
    body = yaml.safe_dump(
        {k: profile[k] for k in ("description", *RATE_FIELDS)}, sort_keys=False, allow_unicode=True, width=100
    )
    try:
        with open(path, "x", encoding="utf-8") as f:
            f.write("\n".join(header) + "\n" + body)
    except FileExistsError:
        raise TestbedError(
            f"{path} exists; host profiles are never overwritten: remove it or name another file"
        ) from None
    except OSError as e:
        raise TestbedError(f"cannot write {path}: {e}") from None
    return path
