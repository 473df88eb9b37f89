"""``python -u -m traffic.runtime.zygote [--netns]``: pay for importing torch once per run.

Every training process of a run imports torch and the project, which with many processes
contending for few cores is most of the time from launch to the first iteration (figures:
``docs/scaling.md``, "Where the launch time goes"). The zygote imports them once, then forks
one child per process on request. A child, before it runs anything else: joins the run's cgroup
(``cgroup``: the path of its ``cgroup.procs``, so that everything it forks is in it too), asks
to be killed when the zygote dies (:func:`common.process.die_with_parent`), starts its own
session (its pid is its process group, so the harness's ``killpg`` reaches it), enters the
network namespace of its Mininet host (``setns`` on ``/proc/<host shell pid>/ns/net``, through
pyroute2), points stdout and stderr at its log, takes the environment the harness gives it,
waits until its batch is started (below), then runs
:func:`traffic.runtime.__main__.run_process` and leaves through ``os._exit`` like a process
started with ``python -m traffic.runtime``. The zygote itself starts no thread, so forking it
is safe (checked: one OS thread after the imports). Before serving it reserves the shared
scratch of ``workload.compute.memory: light`` (:func:`traffic.runtime.buffers.reserve_shared`:
address space only; pages take memory once a light child touches them, once per machine).

Protocol: one JSON object per line. On stdin, ``{"op": "spawn", "procs": [...]}`` asks for a
batch of children, one per item ``{"name", "run_dir", "netns_pid" (null: stay in this
namespace), "env": {...}, "log": path, "cgroup": path of a cgroup.procs file or null}``; the
zygote forks them all, then answers ``{"op": "spawned", "batch": n, "pids": [one per item,
in order]}``, or ``{"op": "error", "name", "error", "pids": [those forked before the
failure]}`` (those exit at once without running). The children of a batch set themselves
up and wait until ``{"op": "start", "batch": n}`` comes (answered ``{"op": "started",
"batch": n}``), which the harness sends once it has recorded their pids in the run's
ledger: no child runs anything of the run before its pid is recorded, and the zygote forks
the whole batch without competing for the CPU with children already at work. A child whose
batch is never started (the harness or the zygote died) exits 1 without running. On stdout
also ``{"op": "ready", "import_s"}`` once and ``{"op": "exit", "pid", "status"}`` when a
child ends (``status`` as ``subprocess`` gives it: the exit code, or minus the signal that
killed it). The zygote exits when its stdin closes (the harness ended), leaving its children
to the harness's teardown (they are in the run's cgroup and their pids in its ledger).
``--netns`` only marks a zygote that serves Mininet hosts, so that ``testbed clean`` knows
it for the harness's. One request forks a whole batch, so that a launch's time does not grow
by a request round trip per child (``benchmarks/launch.py`` measures it; figures in
``docs/scaling.md``).
"""

from __future__ import annotations

import os
import time

_T_IMPORT = time.time()
os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported: no thread pool to fork
os.environ.setdefault("MKL_NUM_THREADS", "1")

import ctypes  # noqa: E402
import gc  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import select  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402

import torch  # noqa: E402
from pyroute2.netns import setns  # noqa: E402

import traffic.runtime.__main__ as runtime  # noqa: E402  (torch and the whole runtime)
from common.process import die_with_parent  # noqa: E402
from traffic import schemes  # noqa: E402
from traffic.runtime import buffers  # noqa: E402

__all__ = ["main", "warm_up", "prepare_to_fork"]


def warm_up() -> None:
    """Do once what every process would do first: a forward, a backward and an SGD step of a
    tiny model. The first optimizer built in a process imports ``torch._dynamo``, a large part
    of a process's set-up; after this the children inherit it. Also imports every built-in
    scheme. Starts no thread (checked: one OS thread after it)."""
    torch.set_num_threads(1)
    m = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    m(torch.zeros(3, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
    # the built-in schemes' modules, imported on a process's first scheme lookup: imported
    # here, a child does not pay for them (figures in docs/scaling.md)
    schemes.available()


#: ``madvise`` advice: collapse a range's pages into transparent huge pages now (<linux/mman.h>, Linux >= 6.1)
MADV_COLLAPSE = 25
HUGE_PAGE = 2 << 20


def prepare_to_fork() -> int:
    """Make forking this process, and the forked children, cheap; returns the bytes of
    anonymous memory now held in huge pages.

    A fork copies one page-table entry per page of anonymous memory, so the zygote's memory
    is collapsed into 2 MiB transparent huge pages (``MADV_COLLAPSE``) so that a fork copies
    fewer entries (the fork times before and after: ``docs/scaling.md``). A child's first
    write to a page still copies only 4 KiB. Regions the kernel cannot collapse (unaligned, too
    small, a kernel before 6.1) stay as they are. Also moves every object into the
    collector's permanent generation (``gc.freeze``), so that a child's garbage collections
    never write to, and so copy, the pages of the objects it inherited.
    """
    gc.collect()
    gc.freeze()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    collapsed = 0
    with open("/proc/self/maps") as f:
        maps = f.read().splitlines()
    for line in maps:  # private writable anonymous memory: the heap, Python's arenas, torch's allocations
        fields = line.split()
        if fields[1][:2] != "rw" or fields[1][3] != "p" or (len(fields) > 5 and fields[5] != "[heap]"):
            continue
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        lo, hi = -(-lo // HUGE_PAGE) * HUGE_PAGE, hi // HUGE_PAGE * HUGE_PAGE
        if hi > lo and libc.madvise(lo, hi - lo, MADV_COLLAPSE) == 0:
            collapsed += hi - lo
    return collapsed


def _send(out, msg: dict) -> None:
    out.write(json.dumps(msg) + "\n")
    out.flush()


def _child(req: dict, gate: int, close_fds: tuple[int, ...]) -> None:
    """In the forked child: become the requested process, wait for its batch's start (a byte
    on ``gate``), run it, exit. ``close_fds``: the zygote's descriptors the child must not
    hold (its reply pipe, the write ends of the batches' gates). Never returns."""
    code = 1
    try:
        if req.get("cgroup"):
            with open(req["cgroup"], "w") as f:
                f.write("0")
        die_with_parent()
        os.setsid()
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
            signal.signal(s, signal.SIG_DFL)
        log = os.open(req["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # (replaces the zygote's request pipe)
        os.dup2(log, 1)
        os.dup2(log, 2)
        for fd in {log, null, *close_fds} - {0, 1, 2, gate}:
            try:
                os.close(fd)
            except OSError:
                pass
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        if req.get("netns_pid"):  # flags=0: enter it, never create one (pyroute2's default) if the host is gone
            setns(f"/proc/{int(req['netns_pid'])}/ns/net", flags=0)
        os.environ.clear()
        os.environ.update(req["env"])
        # a PYTHONPATH given for this process (a researcher's scheme module) takes effect as
        # it would at an interpreter's start
        for entry in reversed([e for e in req["env"].get("PYTHONPATH", "").split(os.pathsep) if e]):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        importlib.invalidate_caches()
        if os.read(gate, 1) != b"1":  # the gate closed unopened: the batch was never started
            print("traffic.runtime.zygote: not started (the harness did not record this process)", flush=True)
            os._exit(1)
        os.close(gate)
        runtime._T_START = time.time()  # this process's start-up begins when its batch starts
        code = runtime.run_process(req["run_dir"], req["name"])
    except BaseException:  # noqa: BLE001 - reported in the process's log, then exit 1
        try:
            traceback.print_exc(file=sys.stdout)
        except BaseException:  # noqa: BLE001
            pass
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001
            pass
        os._exit(code)


def _reap(out) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(out, {"op": "exit", "pid": pid, "status": os.waitstatus_to_exitcode(status)})


class _Batches:
    """The batches forked and not started yet: each one's gate (the write end of a pipe its
    children read one byte from) and how many children wait on it."""

    def __init__(self, out):
        self.out = out
        self.waiting: dict[int, tuple[int, int]] = {}
        self._next = 0

    def spawn(self, reqs: list[dict]) -> None:
        """Fork one child per request, all waiting on a new gate; answer ``spawned`` or ``error``."""
        gate, opener = os.pipe()
        pids: list[int] = []
        try:
            for req in reqs:
                self.out.flush()
                pid = os.fork()
                if pid == 0:
                    _child(req, gate, (self.out.fileno(), opener, *(w for w, _ in self.waiting.values())))
                pids.append(pid)
        except Exception as e:  # noqa: BLE001 - a failed fork is reported; the forked ones never start
            os.close(opener)
            os.close(gate)
            _send(
                self.out,
                {"op": "error", "name": reqs[len(pids)].get("name"), "error": f"{type(e).__name__}: {e}", "pids": pids},
            )
            return
        os.close(gate)
        self._next += 1
        self.waiting[self._next] = (opener, len(pids))
        _send(self.out, {"op": "spawned", "batch": self._next, "pids": pids})

    def start(self, batch: int) -> None:
        """Let the children of ``batch`` run (one byte each, then the gate closes); answer ``started``.

        Raises:
            KeyError: no such batch waits.
        """
        opener, n = self.waiting.pop(batch)
        try:
            os.write(opener, b"1" * n)  # (a pipe holds 64 KiB: batches are far smaller)
        except BrokenPipeError:
            pass  # every child of the batch already died setting itself up (reported by its exit)
        finally:
            os.close(opener)
        _send(self.out, {"op": "started", "batch": batch})

    def abandon(self) -> None:
        """Close every gate unopened: their children exit without running."""
        for opener, _ in self.waiting.values():
            os.close(opener)
        self.waiting.clear()


def _serve(line: bytes, batches: _Batches) -> None:
    try:
        req = json.loads(line)
        if req.get("op") == "spawn":
            procs = req.get("procs")
            if not isinstance(procs, list) or not all(isinstance(p, dict) for p in procs):
                raise ValueError(f"procs {procs!r:.80}: a list of objects, one per process")
            batches.spawn(procs)
        elif req.get("op") == "start":
            batches.start(int(req["batch"]))
        else:
            raise ValueError(f"unknown op {req.get('op')!r}: spawn or start")
    except Exception as e:  # noqa: BLE001 - a bad request is reported
        _send(batches.out, {"op": "error", "name": None, "error": f"{type(e).__name__}: {e}", "pids": []})


def main() -> None:
    """Serve spawn and start requests on stdin until it closes."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # stray prints of imported code never reach the protocol
    inp = sys.stdin.buffer
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the harness stops the run, not a Ctrl-C to the group
    warm_up()
    buffers.reserve_shared()  # light memory's scratch: one region for every child (traffic.runtime.buffers)
    prepare_to_fork()
    _send(out, {"op": "ready", "import_s": round(time.time() - _T_IMPORT, 3)})
    batches = _Batches(out)
    buf = b""
    while True:
        r, _, _ = select.select([inp], [], [], 0.05)
        _reap(out)
        if not r:
            continue
        chunk = os.read(inp.fileno(), 1 << 20)
        if not chunk:  # the harness closed the pipe: nothing more to start
            break
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            _serve(line, batches)
    batches.abandon()
    # keep reporting exits until the children are gone (at once at a normal teardown), for 1 s at most
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        try:
            _reap(out)
            os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)  # raises when no child is left
        except ChildProcessError:
            break
        except OSError:  # the reader is gone
            break
        time.sleep(0.05)
    os._exit(0)


if __name__ == "__main__":
    main()
