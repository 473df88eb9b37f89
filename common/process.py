"""Tying a child process's life to its parent's: ``prctl(PR_SET_PDEATHSIG, SIGKILL)``.

Linux sends the signal when the *thread* that forked the child ends (prctl(2)), so the call
belongs in a child forked by a process's main thread (or by a single-threaded process such
as the runtime's zygote). It survives ``execve`` of a program that is not set-user-ID.
"""

from __future__ import annotations

import ctypes
import os
import signal

__all__ = ["die_with_parent"]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
try:
    _LIBC = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - every Linux C library has prctl
    _LIBC = None


def die_with_parent() -> None:
    """In a child between ``fork`` and ``exec`` (or at its start): ask the kernel for SIGKILL
    when the thread that forked it ends; if that parent is already gone (the child was
    re-parented to init or a subreaper), exit at once."""
    parent = os.getppid()
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent or parent == 1:  # the parent died before the request took effect
        os._exit(1)
