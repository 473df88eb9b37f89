"""Distributed launchers in a program's command, which the testbed refuses.

``torchrun``, ``python -m torch.distributed.run`` (and the older ``torch.distributed.launch``)
and ``accelerate launch`` start a program once per device and set up the processes'
rendezvous. The testbed does both itself for a ``workload.program``
(:mod:`traffic.schemes.program`): it starts the program ``processes_per_host`` times on every
worker host of the emulated network, each with the variables ``torchrun`` would set
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT`` ...). A launcher inside would start its own processes on one host and its
own rendezvous there, so :func:`launcher_refusal` turns such a command into a spec error that
gives the command the launcher would have run.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from collections.abc import Sequence
from pathlib import PurePath

__all__ = ["launcher_of", "unwrap", "launcher_refusal"]

_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")
_TORCH_MODULES = ("torch.distributed.run", "torch.distributed.launch")


def launcher_of(command: Sequence[str]) -> str | None:
    """The launcher ``command`` starts with (``torchrun``, ``python -m torch.distributed.run``,
    ``python -m torch.distributed.launch``, ``accelerate launch``), as the user would name
    it, or None."""
    if not command:
        return None
    prog = PurePath(command[0]).name
    if prog == "torchrun":
        return "torchrun"
    if prog == "accelerate" and command[1:2] == ["launch"]:
        return "accelerate launch"
    if _PYTHON.fullmatch(prog):
        module = _module_of(command[1:])
        if module in _TORCH_MODULES or module == "accelerate.commands.launch":
            return f"python -m {module}"
    return None


def _module_of(args: Sequence[str]) -> str | None:
    """The module of ``-m MODULE`` (or ``-mMODULE``) at the head of a Python command's arguments."""
    if args[:1] == ["-m"] and len(args) > 1:
        return args[1]
    if args and args[0].startswith("-m") and len(args[0]) > 2:
        return args[0][2:]
    return None


def _launcher_args(command: Sequence[str]) -> list[str]:
    """The launcher's own arguments: what follows ``torchrun``, ``accelerate launch`` or
    ``python -m MODULE``."""
    prog = PurePath(command[0]).name
    if prog == "torchrun":
        return list(command[1:])
    if prog == "accelerate":
        return list(command[2:])
    return list(command[3:] if command[1] == "-m" else command[2:])  # python -m MODULE, python -mMODULE


def unwrap(command: Sequence[str]) -> tuple[list[str] | None, int | None]:
    """What a launcher's command would run in each process, and its processes per host.

    Returns:
        ``(inner command, processes per host)``: for torch's launcher, its own argument
        parser's reading (``python SCRIPT ARGS``, ``python -m MODULE ARGS`` with ``-m``,
        ``SCRIPT ARGS`` with ``--no-python``; ``--nproc-per-node`` when it is a number);
        for ``accelerate launch``, ``python`` and its first ``.py`` argument onwards (its
        process count is over all machines: None). ``(None, None)`` when the command has
        no launcher or its arguments cannot be read.
    """
    launcher = launcher_of(command)
    if launcher is None:
        return None, None
    args = _launcher_args(command)
    if "accelerate" in launcher:
        script = next((i for i, a in enumerate(args) if a.endswith(".py")), None)
        return (None, None) if script is None else (["python", *args[script:]], None)
    from torch.distributed.run import get_args_parser  # lazy: torch's elastic launcher, only for its command

    try:
        with contextlib.redirect_stderr(io.StringIO()):  # its usage message: the refusal says what to do
            ns, _ = get_args_parser().parse_known_args(args)
    except SystemExit:
        return None, None
    inner = [ns.training_script, *ns.training_script_args]
    if not ns.no_python:
        inner = ["python", "-m", *inner] if ns.module else ["python", *inner]
    per_host = int(ns.nproc_per_node) if str(ns.nproc_per_node).isdigit() else None
    return inner, per_host


def launcher_refusal(command: Sequence[str]) -> str | None:
    """The ``allowed`` of the spec error of a command that starts with a launcher (it says
    why and gives the command to run instead); None for a command without one."""
    launcher = launcher_of(command)
    if launcher is None:
        return None
    inner, per_host = unwrap(command)
    instead = (
        f"give the command {launcher} would run in each process: {shlex.join(inner)}"
        if inner
        else f"give the command {launcher} would run in each process (e.g. python train.py)"
    )
    if per_host and per_host > 1:
        instead += (
            f", and {per_host} processes per host with workload.program.processes_per_host: {per_host} "
            f"(--set workload.program.processes_per_host={per_host})"
        )
    return (
        f"a command without a distributed launcher: {launcher} starts its own processes and rendezvous on one "
        "host, while the testbed already starts the program on every worker host (processes_per_host times) "
        "with the variables torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR on the "
        f"emulated network, MASTER_PORT); {instead}"
    )
