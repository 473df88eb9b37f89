"""Frames: several of PHub's logical chunks carried by one transport message.

PHub sends every chunk as its own message (PHub Sec. 3.2.3: 32 KB chunks, "the smallest
message size that can saturate network bandwidth"; Sec. 3.2.4: "All message transmission,
reception, and processing for that chunk is done on that core."). Here a message costs real
Python and gloo CPU time at both ends (measured in ``docs/schemes.md``, "phub"), which at
32 KB chunks would swamp the per-chunk
work and starve the machine. So the chunks that one worker sends to the same server
process (interface) and server thread, of the same layer, travel together in a *frame*
(:func:`pack_frames`) of at most ``frame_bytes`` of payload. The frame is transport
packaging only: every logical chunk keeps its own metadata slots (the token on a push, the
status on a reply, so the bytes on the wire are those of one message per chunk), is
checked, aggregated, optimized and charged its host costs one by one, as the emulated
system's chunks are.

Layout of a frame's buffer (1-D float32, :attr:`Frame.size` elements): the chunks' payloads
back to back (chunk ``j`` at ``offsets[j]``, :meth:`Frame.payload`), then ``META`` slots per
chunk in chunk order (:meth:`Frame.meta_slots`, :meth:`Frame.meta`). The payloads being
contiguous, the sum of a frame's copies is one tensor, which the hierarchical ring reduces
at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

import torch

from traffic.schemes.phub.chunks import Chunk
from traffic.schemes.phub.tenancy import META, REJECTED, meta_value, token_meta

__all__ = ["FRAME_BYTES", "Frame", "pack_frames", "refused_reply"]

FRAME_BYTES = 256 * 1024  # default payload bytes per frame (PHubOptions.frame_bytes)


@dataclass(frozen=True)
class Frame:
    """Logical chunks of one job, server process (interface), server thread and layer sent as
    one message; ``id`` (position in :func:`pack_frames`'s list) is the message's tag.

    Attributes:
        id: frame id (tag of its push, pull and init messages).
        chunks: the chunks, in increasing chunk id.
        layer: the layer of every chunk's key.
    """

    id: int
    chunks: tuple[Chunk, ...]
    layer: int

    @cached_property
    def numel(self) -> int:
        """Payload elements (sum of the chunks')."""
        return sum(c.numel for c in self.chunks)

    @property
    def size(self) -> int:
        """Elements of the frame's buffer: payloads, then ``META`` slots per chunk."""
        return self.numel + META * len(self.chunks)

    @cached_property
    def offsets(self) -> list[int]:
        """Start of each chunk's payload in the buffer."""
        out, o = [], 0
        for c in self.chunks:
            out.append(o)
            o += c.numel
        return out

    @property
    def server(self) -> int:
        return self.chunks[0].server

    @property
    def thread(self) -> int:
        return self.chunks[0].thread

    @property
    def job(self) -> int:
        return self.chunks[0].job

    def payload(self, buf: torch.Tensor, j: int) -> torch.Tensor:
        """View of chunk ``j``'s payload (``chunks[j].numel`` elements) in ``buf``."""
        o = self.offsets[j]
        return buf[o : o + self.chunks[j].numel]

    def meta_slots(self, buf: torch.Tensor, j: int) -> torch.Tensor:
        """View of chunk ``j``'s ``META`` metadata slots in ``buf``."""
        o = self.numel + META * j
        return buf[o : o + META]

    def meta(self, buf: torch.Tensor, j: int) -> int:
        """The int64 in chunk ``j``'s metadata slots (a token or a status)."""
        return meta_value(self.meta_slots(buf, j))


def pack_frames(chunks: Sequence[Chunk], frame_elems: int, layer_of: Callable[[Chunk], int]) -> list[Frame]:
    """Pack chunks into frames.

    Chunks of the same (job, server, thread, layer) are taken in id order and cut greedily:
    a chunk joins the current frame if the frame's payload stays within ``frame_elems``
    elements, else it starts a new frame (a chunk larger than ``frame_elems`` travels alone).
    ``frame_elems`` 0 puts every chunk in a frame of its own (one message per chunk, as PHub).

    Args:
        chunks: every chunk of every job (:func:`~traffic.schemes.phub.chunks.assign_chunks`).
        frame_elems: payload elements per frame (``frame_bytes / 4``), >= 0.
        layer_of: the layer of a chunk (frames never span layers: a worker pushes a layer's
            chunks as soon as that layer's backward is done).

    Returns:
        Frames ordered by their first chunk's id; ``id`` = position. Every chunk is in
        exactly one frame. The same for every process given the same arguments.

    Raises:
        ValueError: ``frame_elems`` < 0.
    """
    if frame_elems < 0:
        raise ValueError(f"frame_elems must be >= 0, got {frame_elems}")
    groups: dict[tuple, list[list[Chunk]]] = {}
    for c in sorted(chunks, key=lambda c: c.id):
        frames = groups.setdefault((c.job, c.server, c.thread, layer_of(c)), [])
        if frames and frame_elems and sum(x.numel for x in frames[-1]) + c.numel <= frame_elems:
            frames[-1].append(c)
        else:
            frames.append([c])
    packed = sorted((f for fs in groups.values() for f in fs), key=lambda f: f[0].id)
    return [Frame(i, tuple(f), layer_of(f[0])) for i, f in enumerate(packed)]


def refused_reply(store: torch.Tensor, frame: Frame, refused: Sequence[int]) -> torch.Tensor:
    """The reply to a sender some of whose chunk copies were refused (wrong token, PHub
    Sec. 3.1): a copy of the frame's ``store`` (updated values and ``ACCEPTED`` statuses)
    where each chunk index in ``refused`` carries no parameters (zeros) and the status
    ``REJECTED``."""
    out = store.clone()
    for j in refused:
        frame.payload(out, j).zero_()
        frame.meta_slots(out, j).copy_(token_meta(REJECTED))
    return out
