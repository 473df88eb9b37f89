"""PHub's multi-tenancy and access control (PHub Sec. 3.1): jobs, namespaces and tokens.

The workers split into equal jobs (:func:`job_groups`), each with its own key namespace and
a random 63-bit token (:func:`new_token`). Every chunk of a push carries the token in
``META`` float32 slots (8 bytes, :func:`token_meta`; where they sit in a frame:
:class:`~traffic.schemes.phub.frames.Frame`); a server's reply carries a status
(``ACCEPTED`` / ``REJECTED``) in the same slots (:func:`meta_value` reads the slots at the end
of a buffer).
Each job trains on global batches of its own workers (:class:`JobShards`).
"""

from __future__ import annotations

import os

import torch

__all__ = [
    "META",
    "ACCEPTED",
    "REJECTED",
    "SETUP_TAG",
    "job_groups",
    "token_meta",
    "meta_value",
    "new_token",
    "JobShards",
]

META = 2  # float32 slots after a chunk's payload: the token (int64 bits) or a status
ACCEPTED, REJECTED = 1, 0  # reply status
SETUP_TAG = 1 << 30  # token / create_service / connect messages


def job_groups(workers: int, jobs: int, intruder: int | None = None) -> list[list[int]]:
    """Worker indices of each job: the workers other than ``intruder``, in index order, cut
    into ``jobs`` contiguous groups of equal size.

    Raises:
        ValueError: the workers do not split into ``jobs`` equal non-empty groups, or
            ``intruder`` is not a worker index.
    """
    if intruder is not None and not 0 <= intruder < workers:
        raise ValueError(f"bad_token_worker {intruder} is not a worker index in [0, {workers})")
    members = [w for w in range(workers) if w != intruder]
    if jobs < 1 or not members or len(members) % jobs:
        raise ValueError(f"{len(members)} workers do not split into {jobs} equal jobs")
    m = len(members) // jobs
    return [members[g * m : (g + 1) * m] for g in range(jobs)]


def token_meta(token: int) -> torch.Tensor:
    """The 8 metadata bytes of a token (int64) as ``META`` float32 slots (bit pattern)."""
    return torch.tensor([token], dtype=torch.int64).view(torch.float32)


def meta_value(buf: torch.Tensor) -> int:
    """The int64 stored in the metadata slots at the end of ``buf``."""
    return int(buf[-META:].view(torch.int64)[0])


def new_token() -> int:
    """A random non-zero 63-bit token."""
    while True:
        t = int.from_bytes(os.urandom(8), "little") >> 1
        if t:
            return t


class JobShards:
    """A job's global batches seen through the worker's index: ``shard(it, _)`` is shard
    ``local`` of the job's own :class:`traffic.data.GlobalBatches` (the Trainer asks for its
    global worker index)."""

    def __init__(self, batches, local: int):
        self.batches, self.local = batches, local

    def shard(self, it: int, worker: int):
        return self.batches.shard(it, self.local)

    def __getattr__(self, name):
        return getattr(self.batches, name)
