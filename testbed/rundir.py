"""The run directory: the only interface between the harness and the analysis.

Layout of ``runs/<id>/`` (a sweep puts one such directory per point under
``runs/<sweep-id>/<point-id>/`` and writes ``runs/<sweep-id>/sweep.csv``)::

    spec.yaml            resolved experiment (every default filled in)
    topology.json        hosts (name, rack, kind, ip, interfaces), links (endpoints, class,
                         configured and read-back qdisc/rate), switches
    processes.json       the launch plan: world_size, master_addr, master_port and one entry
                         per process {name, role, index, rank, host, ip, iface}
    events/<proc>.jsonl  per-process events (see traffic.runtime.events)
    results/<proc>.json  per-process results (accuracy, final figures)
    params/<proc>.pt     final parameters when workload.save_params is true
    logs/<proc>.log      stdout+stderr of each process; logs/harness.log
    traces/bwm-ng.csv    bwm-ng CSV of every switch port, every capture.interval_ms
    traces/qdisc.csv     time, iface, backlog_bytes, backlog_packets, drops, sent_bytes ...
    traces/cpu.csv       time, cpu (per core or 'all'), busy_pct, and per-process rows
    iterations.csv       iteration, worker, start, end, duration_s, samples
    summary.json         status, throughput, iteration times, bytes per link class,
                         accuracy, fidelity flags, error (if failed)

A run directory is created exclusively: an existing directory is never overwritten.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from testbed.errors import TestbedError

SUBDIRS = ("events", "results", "params", "logs", "traces")


def new_run_id(name: str) -> str:
    """``<name>-YYYYmmdd-HHMMSS`` in local time; callers add a suffix on collision."""
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def create(parent: str | Path, run_id: str, exclusive_id: bool = True, subdirs=SUBDIRS) -> Path:
    """Create ``parent/run_id`` with its subdirectories, never reusing an existing one.

    If ``exclusive_id`` is false and the name is taken, ``-2``, ``-3`` ... is appended.

    Raises:
        TestbedError: the directory exists and ``exclusive_id`` is true.
    """
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    path = parent / run_id
    n = 1
    while True:
        try:
            path.mkdir()
            break
        except FileExistsError:
            if exclusive_id:
                raise TestbedError(f"run directory {path} already exists; earlier results are never "
                                   f"overwritten: choose another run.id or remove it yourself") from None
            n += 1
            path = parent / f"{run_id}-{n}"
    for d in subdirs:
        (path / d).mkdir()
    return path


def write_json(path: str | Path, data) -> None:
    """Write JSON atomically (temp file then rename)."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


def read_json(path: str | Path):
    return json.loads(Path(path).read_text())


def is_run(path: str | Path) -> bool:
    """True if ``path`` looks like a run directory (has spec.yaml and processes or summary)."""
    p = Path(path)
    return (p / "spec.yaml").is_file() and ((p / "summary.json").is_file() or (p / "processes.json").is_file())
