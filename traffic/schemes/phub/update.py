"""The optimizer step of a frame's chunks: charged per chunk, done as one real step.

PHub's thread "that aggregates a particular chunk also optimizes that chunk" (PHub
Sec. 3.2.2), so the emulated system makes one optimizer step per chunk, and each is charged
``optimizer`` on the chunk's bytes. Here a frame's chunk values are contiguous in the
server's store (:class:`~traffic.schemes.phub.frames.Frame`), and the update rule
(``torch.optim.SGD`` with momentum and weight decay, :func:`traffic.runtime.trainer.make_optimizer`)
is elementwise, so one real step over the frame gives exactly the values of one step per
chunk. One real step per 32 KB chunk costs this machine's Python more than the PBox's stated
rate allows (measured in ``experiments/phub_pbox.yaml``'s runs, ``docs/schemes.md``), which is
an overrun of the emulation, not a cost of the emulated system.
"""

from __future__ import annotations

import torch

from traffic.hostmodel.costs import HostCosts
from traffic.schemes.phub.charges import ChargeBatch
from traffic.schemes.phub.chunks import ELEMENT_BYTES
from traffic.schemes.phub.frames import Frame

__all__ = ["step_frame"]


def step_frame(
    frame: Frame,
    value: torch.nn.Parameter,
    optimizer: torch.optim.Optimizer,
    agg: torch.Tensor,
    counts: list[int],
    costs: HostCosts | None = None,
    fields: dict | None = None,
) -> None:
    """Average a frame's summed gradients and apply one optimizer step to its chunks.

    Chunk ``j`` gets the gradient ``agg[chunk j] / counts[j]`` (the average over the copies
    added, MXNet's ``rescale_grad``). A chunk with ``counts[j] == 0`` (no copy accepted) is
    not updated: its values and its optimizer state are kept as they were, as if it had not
    been stepped (``SGD``'s momentum buffer of a never-stepped chunk is left at 0, which its
    first real step turns into the gradient, as a fresh buffer would be).

    Args:
        frame: the frame (``frame.numel`` payload elements).
        value: the frame's values, a Parameter of ``frame.numel`` float32 elements (a view
            of the server's store), updated in place.
        optimizer: the frame's optimizer over ``[value]``; its state is elementwise.
        agg: the summed copies, ``frame.numel`` elements, divided in place.
        counts: per chunk, the number of copies summed (>= 0).
        costs: the accountant: one ``optimizer`` charge per updated chunk on its bytes, as
            one span (:class:`ChargeBatch`); None: nothing charged.
        fields: extra fields of the span (``iteration``, ``frame`` ...).

    Raises:
        ValueError: ``counts`` has not one entry per chunk.
    """
    k = len(frame.chunks)
    if len(counts) != k:
        raise ValueError(f"counts has {len(counts)} entries for a frame of {k} chunks")
    stepped = [j for j in range(k) if counts[j]]
    if not stepped:
        return
    with ChargeBatch(costs, "optimizer", **(fields or {})) as batch:
        with batch.charge(sum(frame.chunks[j].numel for j in stepped) * ELEMENT_BYTES, ops=len(stepped)):
            if len(set(counts)) == 1:
                agg /= counts[0]
            else:
                for j in stepped:
                    frame.payload(agg, j).div_(counts[j])
            skipped = [j for j in range(k) if not counts[j]]
            before = _chunk_state(frame, value, optimizer, skipped)
            value.grad = agg
            optimizer.step()
            value.grad = None
            _restore(frame, value, optimizer, skipped, before)


def _elementwise_state(value: torch.Tensor, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """The optimizer's state tensors of ``value`` shaped like it (``momentum_buffer`` ...)."""
    return {
        n: t
        for n, t in optimizer.state.get(value, {}).items()
        if isinstance(t, torch.Tensor) and t.shape == value.shape
    }


def _chunk_state(
    frame: Frame, value: torch.Tensor, optimizer: torch.optim.Optimizer, idx: list[int]
) -> dict[int, dict[str, torch.Tensor]]:
    """Copies of chunk ``j``'s values (``""``) and elementwise state, per ``j`` in ``idx``."""
    state = _elementwise_state(value, optimizer)
    return {
        j: {"": frame.payload(value.data, j).clone(), **{n: frame.payload(t, j).clone() for n, t in state.items()}}
        for j in idx
    }


def _restore(
    frame: Frame,
    value: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    idx: list[int],
    before: dict[int, dict[str, torch.Tensor]],
) -> None:
    """Put back chunk ``j``'s values and state as :func:`_chunk_state` copied them; a state
    tensor created by this step is zeroed on those chunks."""
    state = _elementwise_state(value, optimizer)
    for j in idx:
        frame.payload(value.data, j).copy_(before[j][""])
        for n, t in state.items():
            old = before[j].get(n)
            if old is None:
                frame.payload(t, j).zero_()
            else:
                frame.payload(t, j).copy_(old)
