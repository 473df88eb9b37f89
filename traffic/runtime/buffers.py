"""Where a process's large tensors live: :class:`Buffers` (``ctx.buffers``).

``workload.compute.memory: full`` (the default): every process holds the model's real
tensors, as it always has: :class:`Buffers` hands out the model's own parameters and
gradients and fresh tensors.

``workload.compute.memory: light`` (emulated compute only): no value is ever used -- no
accuracy is measured and emulated compute sleeps instead of computing -- so what the network
must see is every message at its true size and time, not its numbers. A light process builds
its model on the meta device (shapes only) and its payload tensors come from two regions:

* **the source** (:meth:`Buffers.zeros`, :meth:`Buffers.grad`, :meth:`Buffers.values`):
  views of one read-only private anonymous mapping (``PROT_READ``). Every page of it reads as
  the kernel's zero page, so it takes no memory however large it is; what a light process
  sends (gradients, parameter values) is read from here. A write into it kills the process
  (SIGSEGV): nothing may write to a source view.
* **the scratch** (:meth:`Buffers.empty`, :meth:`Buffers.landing`, :meth:`Buffers.landing_range`,
  :meth:`Buffers.flat`):
  where receives land and in-place collectives run (gloo's ``all_reduce`` sums in place, so
  a read-only buffer cannot be reduced). One region serves every request: each view starts
  at its offset 0, so buffers in flight at the same time alias. That is harmless because no
  light payload value is ever read; a buffer whose values *are* read (a message carrying an
  id or a token) must not come from here: :meth:`Buffers.ordered_rows` gives receive rows
  whose first elements (ids) survive in light memory, in the process's own memory. The scratch is the region the
  zygote reserved
  before it forked (:func:`reserve_shared`: a shared anonymous mapping, so every process
  forked from that zygote uses the same pages, resident once per machine) when the request
  fits in it, else the process's own, grown to its largest request. Its size is the largest
  single buffer a process asks for (a bucket of ``allreduce``, a shard of ``ps``, a slice of
  ``p3``), not the model.

Values stay exactly zero everywhere: the sources are zeros, and a sum, a division or an SGD
step of zeros is zero (no NaN, no subnormal numbers that would slow the arithmetic down).

Work that full memory does on real tensors and that no host cost charges (a worker's own
optimizer step in ``allreduce`` and ``pipe_sgd``) is replayed on scratch
(:meth:`Buffers.replay_sgd`), so the CPU time the emulator spends on it stays about the
same; work that a host cost charges (a server's aggregation and optimizer step) is skipped,
and the host model still charges its stated cost (:mod:`traffic.hostmodel.costs`).

Example (a scheme)::

    b = self.ctx.buffers
    flat = b.flat([b.grad(p) for p in params])       # full: a new flat copy; light: scratch
    self.ctx.transport.all_reduce(flat)
    if not b.light:
        ...                                           # use the values
"""

from __future__ import annotations

import mmap
import threading
import warnings
from collections.abc import Sequence

import torch
from torch.optim.sgd import sgd

__all__ = [
    "Buffers",
    "reserve_shared",
    "shared_scratch_bytes",
    "SHARED_SCRATCH_BYTES",
    "REPLAY_CHUNK_ELEMENTS",
    "ELEMENT_BYTES",
]

#: bytes of one float32 element
ELEMENT_BYTES = 4

#: address space the zygote reserves for the shared scratch (bytes): pages take memory only
#: once a process touches them, so this bounds the largest shared buffer, not the memory used
SHARED_SCRATCH_BYTES = 8 * 1024**3

#: elements per chunk of :meth:`Buffers.replay_sgd` (three chunks of scratch: 12 MiB)
REPLAY_CHUNK_ELEMENTS = 1 << 20

_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)  # Linux's value

_shared: mmap.mmap | None = None


def reserve_shared(nbytes: int = SHARED_SCRATCH_BYTES) -> bool:
    """Reserve the shared scratch (a ``MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE`` mapping of
    ``nbytes``); every process forked afterwards inherits it, and a light process's scratch
    requests that fit in it use it. Call it once, before forking (the zygote does);
    idempotent. When the kernel refuses the mapping (strict overcommit,
    ``vm.overcommit_memory = 2``, counts it whole) there is none: light processes then use
    scratch of their own.

    Returns:
        Whether the shared scratch exists.
    """
    global _shared
    if _shared is None:
        try:
            _shared = mmap.mmap(-1, int(nbytes), flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS | _MAP_NORESERVE)
        except OSError:
            return False
    return True


def shared_scratch_bytes() -> int:
    """Bytes of the shared scratch this process inherited (0: none, e.g. started with exec)."""
    return 0 if _shared is None else len(_shared)


def _float_view(buf, numel: int) -> torch.Tensor:
    with warnings.catch_warnings():  # a read-only buffer: torch warns that writing is undefined
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(buf, dtype=torch.float32, count=numel)


class Buffers:
    """The large tensors of one process (module docstring).

    Args:
        light: ``workload.compute.memory == "light"``.

    Attributes:
        light: whether this process runs in light memory.
        scratch_numel: elements of the largest scratch request so far (0 in full memory).
    """

    def __init__(self, light: bool = False):
        self.light = light
        self.scratch_numel = 0
        self._lock = threading.Lock()
        self._source: torch.Tensor | None = None
        self._source_map: mmap.mmap | None = None
        self._private: torch.Tensor | None = None
        self._shared_view: torch.Tensor | None = None

    # ------------------------------------------------------------------ light regions

    def _zeros_region(self, numel: int) -> torch.Tensor:
        with self._lock:
            if self._source is None or self._source.numel() < numel:
                self._source_map = mmap.mmap(
                    -1, max(numel, 1) * ELEMENT_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=mmap.PROT_READ
                )
                self._source = _float_view(self._source_map, max(numel, 1))
            return self._source[:numel]

    def _scratch(self, numel: int) -> torch.Tensor:
        with self._lock:
            self.scratch_numel = max(self.scratch_numel, numel)
            if _shared is not None and numel * ELEMENT_BYTES <= len(_shared):
                if self._shared_view is None:
                    self._shared_view = _float_view(_shared, len(_shared) // ELEMENT_BYTES)
                return self._shared_view[:numel]
            if self._private is None or self._private.numel() < numel:
                self._private = torch.zeros(numel)
            return self._private[:numel]

    # ------------------------------------------------------------------ what schemes ask for

    def empty(self, *shape: int) -> torch.Tensor:
        """A float32 tensor of ``shape`` to receive into or reduce in place: full memory
        ``torch.empty(shape)``; light, a view of the scratch (values undefined, aliasing
        every other scratch view)."""
        if not self.light:
            return torch.empty(shape)
        return self._scratch(_numel(shape)).view(shape)

    def zeros(self, *shape: int) -> torch.Tensor:
        """A float32 tensor of ``shape`` to send from: full memory ``torch.zeros(shape)``;
        light, a read-only view of the source (zeros, no memory). Never write to it."""
        if not self.light:
            return torch.zeros(shape)
        return self._zeros_region(_numel(shape)).view(shape)

    def grad(self, p: torch.nn.Parameter) -> torch.Tensor:
        """The gradient of parameter ``p`` to send (``p``'s shape): full memory ``p.grad``
        (set to zeros first when the backward left none); light, a source view."""
        if not self.light:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            return p.grad
        return self.zeros(*p.shape)

    def values(self, p: torch.nn.Parameter) -> torch.Tensor:
        """The values of parameter ``p`` to send: full memory ``p.detach()``; light, a source view."""
        return p.detach() if not self.light else self.zeros(*p.shape)

    def landing(self, p: torch.nn.Parameter) -> torch.Tensor:
        """Where received values of parameter ``p`` go: full memory ``p.data`` (the model);
        light, a scratch view of ``p``'s shape."""
        return p.data if not self.light else self.empty(*p.shape)

    def landing_range(self, p: torch.nn.Parameter, lo: int, hi: int) -> torch.Tensor:
        """Where received values of the flattened elements ``[lo, hi)`` of parameter ``p`` go
        (a shard or slice of it), 1-D of ``hi - lo`` elements: full memory
        ``p.data.view(-1)[lo:hi]``; light, a scratch view of ``hi - lo`` elements (so the
        scratch grows to the largest range, not the whole parameter)."""
        return p.data.view(-1)[lo:hi] if not self.light else self.empty(hi - lo)

    def ordered_rows(self, n: int, width: int) -> torch.Tensor:
        """Receive rows for ``n`` messages of at most ``width`` float32 elements whose *first*
        element is read once the message is in (an id), and which arrive into rows ``0, 1,
        ..., n - 1`` in that order, each whole before the next: receives of one tag from one
        peer, posted in row order (gloo matches them in posting order, and one peer's
        messages come over one connection, one after another). Shape ``(n, width)``, each
        row contiguous; a message may be shorter than its row.

        Full memory: ``torch.empty((n, width))``, disjoint rows, each keeping its message.
        Light: ``n + width - 1`` elements of the process's own memory, row ``k`` starting at
        element ``k`` (the rows overlap; ``as_strided``). Message ``k`` writes elements
        ``k ..`` only, after every earlier message is in, so the first element of every row
        stays that of its own message, while the rest of a row holds whatever later
        messages wrote over it (values light memory never reads). Not the scratch: other
        receives of this process, and other processes, write there at any time.
        """
        if not self.light:
            return torch.empty((n, width))
        return torch.empty(n + width - 1).as_strided((n, width), (1, 1))

    def flat(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        """One flat float32 tensor of every element of ``tensors``, to reduce in place: full
        memory a new tensor holding their values (in order); light, a scratch view of their
        total size (no copy)."""
        if self.light:
            return self.empty(sum(t.numel() for t in tensors))
        if len(tensors) == 1:
            return tensors[0].reshape(-1).clone()
        return torch.cat([t.reshape(-1) for t in tensors])

    def replay_sgd(self, numel: int, spec) -> None:
        """Light memory: the work of one SGD step (``spec``: a
        :class:`traffic.spec.OptimizerSpec`) over ``numel`` elements, done chunk by chunk
        (:data:`REPLAY_CHUNK_ELEMENTS`) on scratch -- parameters, gradient and momentum each a
        chunk of it -- so a light process spends about the CPU a full one spends on its own
        step without holding the model. Nothing in full memory (the scheme steps its real
        optimizer)."""
        if not self.light or numel <= 0:
            return
        c = min(numel, REPLAY_CHUNK_ELEMENTS)
        region = self._scratch(3 * c)
        p, g, m = region[:c], region[c : 2 * c], region[2 * c :]
        momentum = [m] if spec.momentum else [None]
        with torch.no_grad():
            for lo in range(0, numel, c):
                n = min(c, numel - lo)
                sgd(
                    [p[:n]],
                    [g[:n]],
                    [b[:n] if b is not None else None for b in momentum],
                    foreach=False,
                    weight_decay=spec.weight_decay,
                    momentum=spec.momentum,
                    lr=spec.lr,
                    dampening=0.0,
                    nesterov=False,
                    maximize=False,
                )


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
