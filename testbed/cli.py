# PYTHON_ARGCOMPLETE_OK
"""``testbed``: the command line.

    testbed --version                     the package's version (and git commit in a checkout)
    testbed check                         what this machine can emulate
    testbed check --cluster SPEC          each machine of SPEC's cluster: section, over SSH
    testbed run SPEC.yaml [--set a.b=v]   run an experiment (or every point of its sweep)
                   [--dry-run]            only validate and plan every point (nothing built or written)
                   [-v]                   also stream the harness's log lines to stderr
    testbed run --trace PREFIX [--topology SPEC]   replay a Chakra execution trace (PREFIX.<rank>.et)
    testbed ls [RUNS_DIR]                 list runs
    testbed export chakra RUN --out DIR   a run as a Chakra execution trace (DIR/trace.<rank>.et)
    testbed show RUN_OR_SWEEP [--json]    a run's (or a sweep's runs') status and figures; --json: one document
    testbed plot RUN [RUN ...]            draw plots (PNG files in the run directories)
                   [--window START:END] [--smooth-ms MS]   zoom the rate plots; their rolling mean
    testbed plot SWEEP --x PARAM [--y METRIC]   a metric against a swept parameter, per variant
    testbed timeline RUN                  Chrome trace-event JSON of a run's events
    testbed flows RUN [--port P] [--plot] TCP flows of a run's packet capture (capture.pcap)
    testbed report PAPER RUN_OR_SWEEP...  a paper's tables (p3, phub, ibatch, stanza, pipe_sgd)
                   [--plots DIR]          and figures; the paper's own options pass through
    testbed reproduce --list              every figure and table of the five papers: spec, minutes, status
    testbed reproduce ID [--quick]        run one of them, then its report beside the paper's values
    testbed reproduce ID --headline --repeat 3   its headline ratios, median and range over 3 runs
    testbed reproduce ID --headline --repeat 3 --dilation-check   and each repeat again at twice its dilation
    testbed reproduce ID --headline --repeat 3 --from-repeat 2 ...   go on with repeats 2-3 another day
    testbed reproduce ID --headline --repeat 3 --stop-when-unsteady   stop once a run had not settled
    testbed reproduce --archive DEST      keep the marked runs' small files (reproduction/runs)
    testbed reproduce --scoreboard DIR    REPRODUCTION.md from the marked runs under DIR
    testbed clean                         remove what a killed run left on the machine
    testbed profile MODEL --batch B       measure per-layer forward/backward times here
    testbed profile --machine [OUT.yaml]  measure this machine's cost model (capacity, scale: auto)
    testbed schema                        the experiment spec's JSON Schema (testbed/data/spec.schema.json)
    testbed completion [--shell SHELL]    shell code that completes testbed's arguments (argcomplete)

``python -m testbed`` is the same command.

Exit status, the same for every command: 0 done; 1 a run failed (``run``, ``reproduce``: a
run's status is not ``ok``; ``check``: the machine is not ready); 2 a usage or spec error;
130 interrupted (Ctrl-C). Errors a user can cause (a bad spec, file, ``--set`` value or run
path, a run with nothing to show, a missing tool) are :class:`~common.errors.TestbedError` s,
raised wherever they are found and caught in one place, :func:`main`: one message, no
traceback, exit status 2 (:class:`~common.errors.RunFailed`: 1). Bad command-line syntax is
argparse's (usage message, status 2).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import sys
from pathlib import Path

import argcomplete
from argcomplete.completers import ChoicesCompleter, DirectoriesCompleter, FilesCompleter
from pydantic import ValidationError
from tabulate import tabulate

from analysis.report import REPORTS, get_report
from analysis.reproduction import format_list, get_entry, load_catalogue
from common.errors import RunFailed, SpecError, TestbedError
from testbed.check import format_checks, run_checks
from testbed.clean import clean
from testbed.ledger import live_ledgers
from testbed.machine_costs import COSTS_ENV, check_target, costs_path, user_costs_path
from testbed.progress import echo_log
from testbed.schema import field_paths, schema_text
from testbed.version import describe
from traffic.chakra.export import TRACE_NAME, export_run
from traffic.rundir import NotARunError, find_runs, is_run, is_sweep, read_json
from traffic.summary import SUMMARY_FILE, Bytes, Fidelity, IterationTime, Memory, RunSummary, Throughput, UssPeaks

# Modules that load torch, Mininet or matplotlib (seconds) are imported lazily in the
# commands that need them, so that `testbed clean`, `ls`, `show` and `check` start at once.


def _cmd_check(args) -> int:
    if args.cluster is not None:
        from testbed.cluster import check_cluster, format_placement, load_cluster  # lazy: Mininet's Topo

        cluster, where = load_cluster(args.cluster)
        print("placement (whole racks per machine; the first holds the core):\n" + format_placement(where) + "\n")
        items = check_cluster(cluster)
        print(format_checks(items))
        bad = [i.name for i in items if not i.ok]
        print(f"\n{len(cluster.machines)} machines: " + ("ready" if not bad else f"not ready: {', '.join(bad)}"))
        return 1 if bad else 0
    items = run_checks()
    print(format_checks(items))
    essential = {"root", "mnexec", "brctl", "bwm-ng", "tc", "mininet (python)", "torch", "cost model", "qdisc htb"}
    missing = [i.name for i in items if not i.ok and i.name in essential]
    if missing:
        print(f"\ncannot run experiments: missing {', '.join(missing)}")
        return 1
    print(
        "\nready to run experiments"
        + ("" if all(i.ok for i in items) else " (features marked MISSING are refused if a spec asks for them)")
    )
    return 0


def _cmd_run(args) -> int:
    from testbed.runner import headline, one_line, run_experiment  # lazy: Mininet, torch
    from testbed.spec import load_spec  # lazy: torch (the model registry)

    if args.program is not None or args.trace is not None or args.topology is not None:
        exp = _workload_spec(args)
    elif args.spec is None:
        raise SpecError(
            "<file>", None, "an experiment spec file, or --program COMMAND or --trace PREFIX [--topology SPEC]"
        )
    else:
        exp = load_spec(args.spec, overrides=args.set)
    if args.runs_dir:
        exp.run.runs_dir = args.runs_dir
    if args.dry_run:
        from testbed.runner import check_capacity, describe_plan, plan_experiment  # lazy: Mininet, torch

        planned = plan_experiment(exp)
        lines = check_capacity(planned)
        print(describe_plan(planned))
        print("\n".join(lines))
        return 0
    with echo_log() if args.verbose else contextlib.nullcontext():
        results = run_experiment(
            exp, progress=not args.quiet, say=lambda line: print(f"testbed: {line}", file=sys.stderr)
        )
    if len(results) == 1:
        print(one_line(results[0]))
    else:
        import pandas as pd

        table = pd.DataFrame([headline(r) for r in results])
        print(format_table(table))
        print(f"\nsweep directory: {results[0].run_dir.parent}")
    if args.plot:
        _, empty = _plot([r.run_dir for r in results], quiet=args.quiet)
        for d in empty:  # the runs' outcome is the exit status; a run with nothing to draw is said
            print(f"testbed: {_nothing_to_plot([d])}", file=sys.stderr)
    return 0 if all(r.ok for r in results) else 1


def _workload_spec(args):
    """The experiment of ``testbed run --program COMMAND [--topology SPEC] [--set ...]`` (the
    command as ``workload.program``, working directory: the current one) or of ``testbed run
    --trace PREFIX [--topology SPEC] [--set ...]`` (the Chakra trace as ``workload.trace``,
    relative to the current directory), on the topology section of SPEC (its ``name`` too,
    with ``-program`` or ``-trace``).

    Raises:
        SpecError: a spec file given too, neither or both of --program and --trace, a command
            shlex cannot split, or what :func:`testbed.spec.load_spec` /
            :func:`testbed.spec.from_dict` raise (a trace that cannot be read or checked:
            ``workload.trace.path``, naming the file and the node).
    """
    import shlex

    from testbed.spec import from_dict, load_spec  # lazy: torch (the model registry)

    what = "--trace" if args.trace is not None else "--program"
    if args.spec is not None:
        raise SpecError(
            "<file>",
            args.spec,
            f"no spec file with {what} (give the network with --topology SPEC, or put workload.{what[2:]} in the spec)",
        )
    if args.program is not None and args.trace is not None:
        raise SpecError("--trace", args.trace, "left out with --program (a run replays a trace or runs a program)")
    if args.program is None and args.trace is None:
        raise SpecError(
            "--program",
            None,
            "a command with --topology, e.g. --program 'python train.py', or a Chakra trace, --trace PREFIX",
        )
    if args.trace is not None:
        data = {"name": "trace", "workload": {"trace": {"path": str(Path(args.trace).absolute())}}}
    else:
        try:
            command = shlex.split(args.program)
        except ValueError as e:
            raise SpecError("--program", args.program, f"a command line shlex can split ({e})") from None
        data = {"name": "program", "workload": {"program": {"command": command, "cwd": os.getcwd()}}}
    if args.topology is not None:
        base = load_spec(args.topology)
        data["topology"] = base.topology.model_dump(mode="python")
        data["name"] = f"{base.name}-{data['name']}"
    return from_dict(data, args.set)


def _cmd_export(args) -> int:
    runs = _resolve_runs([args.run])
    if len(runs) != 1 or not is_run(args.run):
        raise NotARunError(
            f"{args.run} is a sweep: export one run of it (one of {', '.join(d.name for d in runs[:4])}"
            f"{' ...' if len(runs) > 4 else ''})"
        )
    files = export_run(runs[0], args.out)
    prefix = Path(args.out) / TRACE_NAME
    print(
        f"wrote {len(files)} files: {prefix}.0.et to {prefix}.{len(files) - 1}.et\n"
        f"replay: testbed run --trace {prefix} --topology {runs[0] / 'spec.yaml'}"
    )
    return 0


def format_table(df) -> str:
    """The comparison table: the sweep point, scheme, samples/s (the mean, the 95 %
    confidence interval of the mean, 1.96 sd of the iterations), iteration mean/p95 (ms), core
    MB, accuracy, whether the emulation was CPU-starved, status."""
    out = df.copy()
    cols = {
        "scheme": "scheme",
        "samples_per_s": "samples/s",
        "samples_per_s_mean_ci95_low": "mean CI95 lo",
        "samples_per_s_mean_ci95_high": "mean CI95 hi",
        "samples_per_s_spread95": "1.96sd",
        "iter_mean_s": "iter mean ms",
        "iter_p95_s": "iter p95 ms",
        "core_bytes": "core MB",
        "accuracy": "test acc",
        "cpu_starved": "cpu starved",
        "host_cost_overrun": "host overrun",
        "status": "status",
    }
    extra = [c for c in out.columns if c not in cols and c not in ("run_dir", "workload.scheme")]
    for c in ("iter_mean_s", "iter_p95_s"):
        out[c] = out[c].astype(float) * 1e3
    out["core_bytes"] = out["core_bytes"].astype(float) / 1e6
    out = out[[c for c in extra if c != "scheme"] + list(cols)].rename(columns=cols)
    return out.to_string(index=False, float_format=lambda v: f"{v:.2f}")


#: where ``testbed ls`` looks when given no directory (``run.runs_dir``'s default)
DEFAULT_RUNS_DIR = "runs"


def _cmd_ls(args) -> int:
    root = Path(args.runs_dir or DEFAULT_RUNS_DIR)
    try:
        if not root.is_dir():
            if args.runs_dir is None and not root.exists():  # the default: nothing has run here yet
                print(f"no runs under {root}")
                return 0
            raise NotARunError(
                f"{root} is {'not a directory' if root.exists() else 'missing'}: give a directory "
                f"that holds runs (default: {DEFAULT_RUNS_DIR}, run.runs_dir of the specs)"
            )
        specs = sorted(root.rglob("spec.yaml"))
    except OSError as e:  # e.g. a name too long for the file system
        raise TestbedError(f"cannot list {root}: {e.strerror or e}") from None
    live = {Path(led.run_dir).resolve() for led in live_ledgers() if led.run_dir}
    rows = []
    for p in specs:
        d = p.parent
        if not is_run(d):
            continue
        s = _summary(d) if (d / SUMMARY_FILE).is_file() else RunSummary(status=_unfinished_status(d, live))
        tp = (s.throughput or Throughput()).mean
        flags = _flags(s)
        why = _error_line(s)
        rows.append(
            f"{str(d.relative_to(root)):60s} {str(s.status):11s} "
            f"{s.scheme or '':10s} {'' if tp is None else f'{tp:10.1f} samples/s'}"
            + (f"  [{', '.join(flags)}]" if flags else "")
            + (f"  {why}" if why else "")
        )
    print("\n".join(rows) if rows else f"no runs under {root}")
    return 0


def _flags(s: RunSummary) -> list[str]:
    """The fidelity flags a run's line shows: ``CPU-starved``, ``host-cost overrun``."""
    f = s.fidelity or Fidelity()
    return [name for name, flag in (("CPU-starved", f.cpu_starved), ("host-cost overrun", f.host_cost_overrun)) if flag]


def _error_line(s: RunSummary) -> str:
    """The first line of the error of a run that is not ``ok`` (what failed), else ''."""
    lines = (s.error or "").splitlines() if s.status != "ok" else []
    return lines[0] if lines else ""


def _unfinished_status(run_dir: Path, live: set[Path]) -> str:
    """Status of a run without ``summary.json``: ``running`` (a live harness's ledger names
    it), ``killed`` (the harness made it, see logs/harness.log, and died: 'testbed clean'
    writes its summary) or ``no summary`` (a loopback run of testbed.loopback, which writes none)."""
    if run_dir.resolve() in live:
        return "running"
    return "killed" if (run_dir / "logs" / "harness.log").is_file() else "no summary"


def _summary(run_dir: Path) -> RunSummary:
    """A run's summary.json; status ``unreadable`` when it is not JSON or not a summary."""
    try:
        return RunSummary.load(run_dir / SUMMARY_FILE)
    except (OSError, ValueError):
        return RunSummary(status="unreadable")


def _resolve_runs(paths: list[str]) -> list[Path]:
    """The run directories among ``paths`` (a sweep directory stands for its runs).

    Raises:
        NotARunError: a path is missing, is a file, or is neither a run nor a sweep directory.
    """
    out = find_runs(paths)
    if not out:
        raise NotARunError(
            f"no run directories in {', '.join(paths)} (a sweep whose first point has not "
            f"started has none); see 'testbed ls'"
        )
    return out


def _plot(
    paths, out: str | None = None, host: str | None = None, quiet=False, span=None, smooth_ms: float | None = None
) -> tuple[list[Path], list[Path]]:
    """Draw each run's plots (and, for several runs or with ``out``, their throughput side by
    side); returns the files written and the runs that had nothing to draw (no traces, no
    iterations and, side by side, no throughput in their summary: a run kept with only its
    small files still has its bar). ``span`` and ``smooth_ms``: the rate plots' ``--window`` and
    ``--smooth-ms``."""
    import analysis  # lazy: matplotlib
    from analysis import plots  # lazy: matplotlib

    runs = [analysis.load(p) for p in paths]
    smooth_s = plots.SMOOTH_S if smooth_ms is None else smooth_ms / 1e3
    side_by_side = len(runs) > 1 or bool(out)
    written, empty = [], []
    for run in runs:
        if not run.traces.empty:
            written.append(plots.plot_interface_rates(run, host=host, smooth_s=smooth_s, span=span))
        if not run.iterations.empty:
            written.append(plots.plot_iteration_times(run))
        summarized = run.summary is not None and (run.summary.throughput or Throughput()).mean is not None
        if run.traces.empty and run.iterations.empty and not (side_by_side and summarized):
            empty.append(run.path)
    if len(runs) > len(empty) and side_by_side:
        target = Path(out) if out else Path(paths[0]).parent / "throughput.png"
        written.append(plots.plot_throughput(runs, target))
    if not quiet:
        for w in written:
            print(f"wrote {w}")
    return written, empty


def _nothing_to_plot(runs: list[Path]) -> str:
    return (
        f"nothing to plot in {', '.join(map(str, runs))}: no interface traces (traces/bwm-ng.csv) and no "
        f"iterations (the run ended before training; see 'testbed show')"
    )


def _plot_sweeps(args) -> int:
    """``testbed plot SWEEP... --x PARAM [--y METRIC]``: the metric against the parameter, one
    PNG per sweep (``--out`` with one sweep only)."""
    from analysis import plots  # lazy: matplotlib

    if args.window is not None or args.smooth_ms is not None or args.host is not None:
        raise TestbedError(
            "--window, --smooth-ms and --host are for the rate plots of runs; a sweep plot (--x) takes --y and --out"
        )
    not_sweeps = [p for p in args.runs if is_run(p) or not is_sweep(p)]
    if not_sweeps:
        raise TestbedError(
            f"--x plots a sweep: {', '.join(not_sweeps)} is not a sweep directory (one with "
            f"sweep.csv, e.g. runs/<name>-<timestamp>)"
        )
    if args.out and len(args.runs) > 1:
        raise TestbedError("--out names one PNG: with --x give one sweep directory, or leave --out out")
    for d in args.runs:
        print(f"wrote {plots.plot_sweep(d, args.x, args.out, y=args.y or 'samples_per_s')}")
    return 0


def _cmd_plot(args) -> int:
    if args.x is not None:
        return _plot_sweeps(args)
    if args.y is not None:
        raise TestbedError("--y names the metric of a sweep plot: give the swept parameter too, --x PARAM")
    _, empty = _plot(_resolve_runs(args.runs), out=args.out, host=args.host, span=args.window, smooth_ms=args.smooth_ms)
    if empty:  # the others' plots are written; the run(s) with none are an error
        raise NotARunError(_nothing_to_plot(empty))
    return 0


def _time_window(text: str) -> tuple[float | None, float | None]:
    """``--window START:END``: seconds since the run start, either side may be empty."""
    start, sep, end = text.partition(":")
    try:
        lo, hi = (float(v) if v.strip() else None for v in (start, end))
    except ValueError:
        lo = hi = None
        sep = ""
    if not sep or (lo, hi) == (None, None) or (lo is not None and hi is not None and lo >= hi):
        raise argparse.ArgumentTypeError(
            f"{text!r}: START:END in seconds since the run start, START < END, "
            f"either may be left out (e.g. 10:20, 30:, :5)"
        )
    return lo, hi


def _smooth_ms(text: str) -> float:
    """``--smooth-ms MS``: a window of 0 ms or more."""
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a window in ms, 0 or more (0: the samples alone)")
    return v


def _cmd_show(args) -> int:
    one = is_run(args.run)
    runs = _resolve_runs([args.run])
    if one:  # its summary, or why it has none
        summaries = [(runs[0], _run_summary(runs[0]))]
    else:  # a sweep: every run, those without a summary with their state (as 'testbed ls')
        live = {Path(led.run_dir).resolve() for led in live_ledgers() if led.run_dir}
        summaries = [
            (d, _summary(d) if (d / SUMMARY_FILE).is_file() else RunSummary(status=_unfinished_status(d, live)))
            for d in runs
        ]
    if args.json:
        doc = summaries[0][1].dump() if one else {d.name: s.dump() for d, s in summaries}
        print(json.dumps(doc, indent=2))
    else:
        print(format_summaries(summaries))
    return 0


def _run_summary(d: Path) -> RunSummary:
    """The summary of the run ``d``.

    Raises:
        NotARunError: it has no summary.json yet, or one that is not a readable summary.
    """
    path = d / SUMMARY_FILE
    if not path.is_file():
        raise NotARunError(
            f"{d} has no summary.json yet: it is still running, or its runner was killed (see 'testbed ls')"
        )
    try:
        return RunSummary.load(path)
    except (OSError, ValueError) as e:
        what = "a run summary" if isinstance(e, ValidationError) else "readable JSON"
        raise NotARunError(f"{path} is not {what} ({e})") from None


def format_summaries(summaries: list[tuple[Path, RunSummary]]) -> str:
    """What ``testbed show`` prints: one row per run (its directory's name, status, scheme,
    scale, samples/s, mean iteration time in ms, core bytes in MB; when some run has a
    ``memory`` section, the growth of the machine's used memory in GiB and the median and
    largest peak USS of a process in MiB; fidelity flags), then the first line of each error."""
    rows, errors = [], []
    memory = any(s.memory is not None for _, s in summaries)
    for d, s in summaries:
        it, core = (s.iteration_time_s or IterationTime()).mean, (s.bytes or Bytes()).core
        row = {
            "run": d.name,
            "status": s.status,
            "scheme": s.scheme,
            "scale": s.scale,
            "samples/s": (s.throughput or Throughput()).mean,
            "iteration ms": None if it is None else it * 1e3,
            "core MB": None if core is None else core / 1e6,
        }
        if memory:
            row.update(_memory_columns(s.memory))
        rows.append({**row, "flags": ", ".join(_flags(s))})
        if _error_line(s):
            errors.append(f"{d.name}: {_error_line(s)}")
    if not any(r["flags"] for r in rows):
        for r in rows:
            del r["flags"]
    floats = ("", "", "", "g", ".1f", ".1f", ".2f") + ((".2f", ".0f", ".0f") if memory else ())
    table = tabulate(rows, headers="keys", floatfmt=floats, missingval="-")
    return table + ("\n\n" + "\n".join(errors) if errors else "")


def _memory_columns(m: Memory | None) -> dict:
    """``testbed show``'s memory columns of a run: the growth of the machine's used memory,
    GiB (in a cluster run the machine that grew most), and the median and largest peak USS
    of its processes, MiB (None for what the run did not record)."""
    m = m or Memory()
    uss = m.process_uss_peak_bytes or UssPeaks()

    def scaled(v, unit):
        return None if v is None else v / unit

    return {
        "mem +GiB": scaled(m.machine_growth_bytes, 2**30),
        "USS med MiB": scaled(uss.median, 2**20),
        "USS max MiB": scaled(uss.max, 2**20),
    }


def _cmd_timeline(args) -> int:
    from analysis.timeline import NoEvents, write_timeline  # lazy: pandas

    empty = []
    for d in _resolve_runs(args.runs):
        try:
            print(f"wrote {write_timeline(d)}  (open in https://ui.perfetto.dev or chrome://tracing)")
        except NoEvents as e:  # the others are written; the run(s) without events are an error
            empty.append(str(e))
    if empty:
        raise NotARunError("\n".join(empty))
    return 0


def _cmd_flows(args) -> int:
    import warnings

    import analysis  # lazy: pandas, scapy
    from analysis import plots  # lazy: matplotlib
    from analysis.flows import check_against_counters  # lazy: pandas, scapy

    for d in _resolve_runs([args.run]):
        if not (d / "traces" / "pcap" / "ports.json").is_file():
            raise NotARunError(
                f"{d} has no packet capture: run with capture.pcap, e.g. --set 'capture.pcap={{ports: [uplinks]}}'"
            )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            df = analysis.flows(d, port=args.port)
            check = check_against_counters(d)
        print(format_flows(df, d, top=args.top))
        for _, c in check.iterrows():
            if args.port in (None, c["port"]):
                print(
                    f"port {c['port']}: captured frames {c['flow_frame_bytes'] / 1e6:.2f} MB vs interface counters "
                    f"{c['counter_bytes'] / 1e6:.2f} MB over the same interval: ratio {c['ratio']:.3f}"
                )
        for w in caught:
            print(f"warning: {w.message}")
        if args.plot:
            ports = [args.port] if args.port else sorted(df["port"].unique()) if not df.empty else []
            for port in ports:
                print(f"wrote {plots.plot_flow_rates(d, port)}")
    return 0


def format_flows(df, run_dir: Path, top: int = 10) -> str:
    """What ``testbed flows`` prints for a run: per port, its ``top`` flows by bytes (both
    ways), the processes at each end, retransmitted segments and the RTT estimate; then the
    flows that crossed the core (their ends in different racks) and every flow that
    retransmitted."""
    if df.empty:
        return f"{run_dir}: no TCP flows in the capture"
    topo = read_json(run_dir / "topology.json") if (run_dir / "topology.json").is_file() else {"hosts": []}
    rack = {h["name"]: h.get("rack") for h in topo.get("hosts", [])}
    out = df.copy()
    out["flow"] = [f"{a or '?'}->{b or '?'}" for a, b in zip(out["src_proc"], out["dst_proc"])]
    out["ends"] = [
        f"{si}:{sp}->{di}:{dp}"
        for si, sp, di, dp in zip(out["src_ip"], out["src_port"], out["dst_ip"], out["dst_port"])
    ]
    out["MB"] = (out["bytes_fwd"] + out["bytes_rev"]) / 1e6
    out["retx"] = out["retransmits_fwd"] + out["retransmits_rev"]
    out["cross_core"] = [
        rack.get(a) is not None and rack.get(b) is not None and rack.get(a) != rack.get(b)
        for a, b in zip(out["src_host"], out["dst_host"])
    ]
    cols = ["flow", "ends", "MB", "packets_fwd", "packets_rev", "retx", "rtt_ms"]
    lines = []
    for port, g in out.groupby("port", sort=True):
        g = g.sort_values("MB", ascending=False)
        lines.append(
            f"port {port}: {len(g)} flows, {g['MB'].sum():.2f} MB, {int(g['retx'].sum())} retransmitted segments"
        )
        lines.append(g[cols].head(top).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
        lines.append("")
    core = out[out["cross_core"]].drop_duplicates(["src_ip", "src_port", "dst_ip", "dst_port"])
    lines.append(f"crossed the core: {len(core)} flows, {core['MB'].sum():.2f} MB (counted once each)")
    retx = out[out["retx"] > 0].sort_values("retx", ascending=False)
    lines.append(
        f"retransmitted: {len(retx)} of {len(out)} flow observations"
        + (
            ""
            if retx.empty
            else "\n" + retx[["port", "flow", "ends", "retransmits_fwd", "retransmits_rev"]].to_string(index=False)
        )
    )
    return "\n".join(lines)


def _cmd_report(args) -> int:
    return get_report(args.paper).main(args.args, prog=f"testbed report {args.paper}")


def _cmd_reproduce(args) -> int:
    entries = load_catalogue()
    if args.list:
        print(format_list(entries))
        return 0
    if args.scoreboard is not None:
        from analysis.scoreboard import scoreboard  # lazy: pandas, only for --scoreboard

        sys.stdout.write(scoreboard(args.scoreboard, entries))
        return 0
    if args.archive is not None:
        from analysis.scoreboard import archive  # lazy: pandas, only for --archive

        made = archive(args.runs_dir or "runs", args.archive)
        print("\n".join(str(d) for d in made) if made else f"nothing new to archive into {args.archive}")
        return 0
    if args.id is None:
        raise TestbedError("testbed reproduce needs an ID, --list, --scoreboard DIR or --archive DEST")
    if args.repeat < 1:
        raise TestbedError(f"--repeat must be at least 1 (got {args.repeat})")
    if not 1 <= args.from_repeat <= args.repeat:
        raise TestbedError(f"--from-repeat must be within 1 to --repeat ({args.repeat}) (got {args.from_repeat})")
    if args.from_repeat > 1 and not args.headline:
        raise TestbedError("--from-repeat continues a headline campaign: give --headline too")
    entry = get_entry(entries, args.id)
    from testbed.reproduce import reproduce  # lazy: Mininet, torch (through the runner)

    return reproduce(
        entry,
        quick=args.quick,
        headline=args.headline,
        repeat=args.repeat,
        runs_dir=args.runs_dir,
        dilation_check=args.dilation_check,
        first_repeat=args.from_repeat,
        stop_when_unsteady=args.stop_when_unsteady,
    )


def _cmd_schema(args) -> int:
    sys.stdout.write(schema_text())
    return 0


#: the shells ``testbed completion`` writes code for (argcomplete's)
SHELLS = ("bash", "zsh", "fish", "tcsh", "powershell")


def _cmd_completion(args) -> int:
    login = os.path.basename(os.environ.get("SHELL", ""))
    shell = args.shell or (login if login in SHELLS else "bash")
    sys.stdout.write(argcomplete.shellcode(["testbed"], shell=shell))
    return 0


def _set_paths(prefix: str, **_) -> list[str]:
    """Completions of ``--set``: every field path of the spec's schema, with ``=``."""
    try:
        return [f"{p}=" for p in field_paths() if p.startswith(prefix)]
    except (OSError, ValueError):
        return []


def _entry_ids(**_) -> list[str]:
    """Completions of ``testbed reproduce ID``: the catalogue's ids."""
    try:
        return [e.id for e in load_catalogue()]
    except TestbedError:
        return []


class _Version(argparse.Action):
    """``--version``: :func:`testbed.version.describe` (git is asked only when it is given)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(describe())
        parser.exit()


def _cmd_clean(args) -> int:
    removed = clean(force=args.force)
    print("\n".join(removed) if removed else "nothing to clean")
    return 0


def _cmd_profile(args) -> int:
    if args.host is not None and args.machine is not None:
        raise TestbedError("--host and --machine measure different things: give one of them")
    if args.force and args.machine is None:
        raise TestbedError("--force replaces an existing cost model: it goes with --machine")
    if args.machine is not None:
        return _cmd_profile_machine(args)
    if args.host:
        return _cmd_profile_host(args)
    if args.model is None or args.batch is None:
        raise TestbedError(
            "testbed profile needs a model and --batch "
            "(or --host OUT.yaml for this machine's host rates, or --machine for its cost model)"
        )
    from traffic.compute_profiles import profile_filename  # lazy: torch
    from traffic.compute_profiles.measure import format_table, measure_profile  # lazy: torch

    out = Path(args.out) if args.out else Path.cwd() / profile_filename(args.model, args.device, args.batch)
    if out.exists():  # checked before measuring too, so a long measurement is not wasted
        raise TestbedError(f"{out} exists; profiles are never overwritten: remove it or pass another --out")
    prof = measure_profile(args.model, args.batch, device=args.device, iterations=args.iterations, warmup=args.warmup)
    print(format_table(prof))
    print(f"wrote {prof.save(out)}")
    return 0


def _cmd_profile_host(args) -> int:
    if args.model is not None or args.batch is not None:
        raise TestbedError("--host measures this machine's host rates, not a model: give no model or --batch")
    out = Path(args.host)
    if out.exists():  # checked before measuring too, so a measurement is not wasted
        raise TestbedError(f"{out} exists; host profiles are never overwritten: remove it or name another file")
    from traffic.hostmodel.measure import measure_host_profile, write_host_profile  # lazy: torch

    prof = measure_host_profile(threads=args.threads)
    for field, v in prof.items():
        if field != "description":
            print(f"{field:20s} {'null' if v['value'] is None else v['value']}")
    print(f"wrote {write_host_profile(prof, out)}")
    return 0


def _cmd_profile_machine(args) -> int:
    if args.model is not None or args.batch is not None:
        raise TestbedError("--machine measures this machine's cost model, not a model: give no model or --batch")
    out = Path(args.machine).expanduser() if args.machine else user_costs_path()
    check_target(out, replace=args.force)  # before measuring too, so a long measurement is not wasted
    from testbed.machine_costs.measure import measure  # lazy: torch, Mininet

    command = shlex.join(["testbed", "profile", "--machine", str(out)] + (["--force"] if args.force else []))
    measure(out, command=command, replace=args.force)
    if out.resolve() == costs_path().resolve():
        print("testbed run and testbed check use it from now on")
    else:
        print(
            f"testbed run and testbed check use {costs_path()}; to use this file: {COSTS_ENV}={out} (or move it "
            f"to {user_costs_path()})"
        )
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="testbed",
        description="Network-emulation testbed for distributed DL training",
        epilog="exit status: 0 done, 1 a run failed (check: the machine is not ready), "
        "2 a usage or spec error, 130 interrupted",
    )
    p.add_argument(
        "--version",
        action=_Version,
        help="print the package's version (and its git commit when it runs from a checkout) and exit",
    )
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser(
        "check", help="what this machine can emulate; --cluster SPEC: each machine of a spec's cluster section"
    )
    s.add_argument(
        "--cluster",
        metavar="SPEC",
        help="check every machine of SPEC's cluster: section over SSH "
        "(root, project version, mnexec, bwm-ng, htb, clock, path MTU)",
    )
    s.set_defaults(fn=_cmd_check)
    s = sub.add_parser("run", help="run an experiment spec (all points of its sweep), or your own program (--program)")
    s.add_argument(
        "spec", nargs="?", help="experiment YAML, e.g. experiments/quickstart.yaml"
    ).completer = FilesCompleter(("yaml", "yml"))
    s.add_argument(
        "--program",
        metavar="COMMAND",
        help="run this command unmodified on every worker host instead of a spec's workload, e.g. "
        "--program 'python train.py --epochs 1' (torchrun's environment; workload.program)",
    )
    s.add_argument(
        "--trace",
        metavar="PREFIX",
        help="replay this Chakra execution trace (files PREFIX.0.et, PREFIX.1.et, ...: one rank per worker "
        "host) instead of a spec's workload (workload.trace)",
    )
    s.add_argument(
        "--topology",
        metavar="SPEC",
        help="with --program or --trace: the network of this spec file (its topology section); default: the "
        "built-in default topology",
    )
    s.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="override a spec field, e.g. --set workload.iterations=20 (repeatable)",
    ).completer = _set_paths
    s.add_argument("--runs-dir", help="where run directories go (default: the spec's run.runs_dir)")
    s.add_argument("--plot", action="store_true", help="draw plots after the runs")
    s.add_argument(
        "--dry-run",
        action="store_true",
        help="only validate the spec and plan every run (hosts, processes); build and write nothing",
    )
    s.add_argument("-q", "--quiet", action="store_true", help="no progress (bar or lines)")
    s.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also write the harness's log lines (logs/harness.log) to stderr as they come",
    )
    s.set_defaults(fn=_cmd_run)
    s = sub.add_parser(
        "export",
        help="write a run as a trace another tool reads: chakra (MLCommons Chakra execution "
        "traces, one .et file per rank)",
    )
    s.add_argument("format", choices=["chakra"], help="the trace format (chakra)")
    s.add_argument("run", metavar="RUN", help="a run directory").completer = DirectoriesCompleter()
    s.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help=f"the directory to write (a new or empty one; never overwritten): DIR/{TRACE_NAME}.<rank>.et",
    )
    s.set_defaults(fn=_cmd_export)
    s = sub.add_parser("ls", help="list runs")
    s.add_argument(
        "runs_dir",
        nargs="?",
        metavar="RUNS_DIR",
        help=f"where the runs are (default: {DEFAULT_RUNS_DIR}; a missing one given is an error)",
    ).completer = DirectoriesCompleter()
    s.set_defaults(fn=_cmd_ls)
    s = sub.add_parser(
        "show",
        help="a run's status and figures as a table (a sweep: one row per run); "
        "--json: its summary.json as one document",
    )
    s.add_argument("run", metavar="RUN_OR_SWEEP").completer = DirectoriesCompleter()
    s.add_argument(
        "--json",
        action="store_true",
        help="print the summary as one JSON document (a sweep: an object keyed by run directory name)",
    )
    s.set_defaults(fn=_cmd_show)
    s = sub.add_parser(
        "plot",
        help="plot runs (interface rates per run; throughput side by side), or a metric "
        "against a swept parameter (--x)",
    )
    s.add_argument(
        "runs", nargs="+", help="run directories or sweep directories (with --x: sweep directories)"
    ).completer = DirectoriesCompleter()
    s.add_argument("--host", help="host whose link to plot (default: the first worker's)")
    s.add_argument(
        "--window",
        type=_time_window,
        metavar="START:END",
        help="show only this span of the rate plots, seconds since the run start (e.g. 10:20, 30:)",
    )
    s.add_argument(
        "--smooth-ms",
        type=_smooth_ms,
        metavar="MS",
        help="window of the rolling mean drawn over the rate samples, ms (default 100; 0: samples only)",
    )
    s.add_argument(
        "--x",
        metavar="PARAM",
        help="plot a sweep's METRIC against this swept parameter (a dotted sweep.csv column, or its last "
        "part: host_bw_mbps), one line per variant, with error bars",
    )
    s.add_argument(
        "--y",
        metavar="METRIC",
        help="with --x: the metric (default samples_per_s; also iter_mean_s, iter_p95_s, core_bytes, accuracy)",
    )
    s.add_argument("--out", help="path of the side-by-side throughput PNG (with --x: of the sweep plot)")
    s.set_defaults(fn=_cmd_plot)
    s = sub.add_parser("timeline", help="write a Chrome trace-event JSON of a run's events")
    s.add_argument("runs", nargs="+", help="run directories or sweep directories").completer = DirectoriesCompleter()
    s.set_defaults(fn=_cmd_timeline)
    s = sub.add_parser(
        "flows",
        help="TCP flows of a run's packet capture (capture.pcap): top flows, what crossed the core, retransmissions",
    )
    s.add_argument("run").completer = DirectoriesCompleter()
    s.add_argument("--port", help="only this captured port (default: every one)")
    s.add_argument("--top", type=int, default=10, help="flows listed per port (by bytes)")
    s.add_argument("--plot", action="store_true", help="also draw per-flow rates over time, stacked, per port")
    s.set_defaults(fn=_cmd_flows)
    s = sub.add_parser(
        "report",
        help="a paper's tables and figures from run or sweep directories",
        description="Print a paper's tables (markdown) from run or sweep directories; "
        "--plots DIR also draws its figures. 'testbed report PAPER --help' "
        "lists the paper's own options.",
    )
    s.add_argument("paper", metavar="PAPER", help=f"one of {', '.join(REPORTS)}").completer = ChoicesCompleter(REPORTS)
    s.add_argument(
        "args",
        nargs=argparse.REMAINDER,
        metavar="RUN_OR_SWEEP... [--plots DIR] [OPTIONS]",
        help="run or sweep directories, then options (e.g. phub's --baseline, pipe_sgd's --alpha-us)",
    )
    s.set_defaults(fn=_cmd_report)
    s = sub.add_parser(
        "reproduce",
        help="the papers' figures and tables: --list shows each one's spec, run time "
        "and reproduction status; ID runs one and compares it with the paper",
    )
    s.add_argument(
        "id",
        nargs="?",
        metavar="ID",
        help="a figure or table to run, e.g. p3.fig7c: its spec, then its report beside the paper's values",
    ).completer = _entry_ids
    s.add_argument("--list", action="store_true", help="list every figure and table of the five papers' evaluations")
    mode = s.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="run the entry's reduced version (a few minutes)")
    mode.add_argument(
        "--headline", action="store_true", help="run the entry's headline run and print its ratios against the paper's"
    )
    s.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="run it N times (each sweep marked as one repeat; 3 for a headline)",
    )
    s.add_argument(
        "--from-repeat",
        type=int,
        default=1,
        metavar="K",
        help="with --headline: run repeats K to N of --repeat N, continuing a campaign whose earlier "
        "repeats are in the same runs directory (the scoreboard pools them when the same code ran)",
    )
    s.add_argument(
        "--dilation-check",
        action="store_true",
        help="with --headline: run each repeat again at twice its dilation; the scoreboard flags a ratio "
        "that moves by more than 5 %% between the two",
    )
    s.add_argument(
        "--stop-when-unsteady",
        action="store_true",
        help="with --headline: run no further repeat once a run had not settled (the iteration time "
        "moved within its measured iterations; every run's steadiness is printed after its sweep)",
    )
    s.add_argument(
        "--runs-dir",
        help="where run directories go (default: the spec's run.runs_dir); "
        "with --archive, where the marked runs are (default: runs)",
    )
    s.add_argument(
        "--scoreboard",
        metavar="DIR",
        help="print REPRODUCTION.md from the marked run directories under DIR (e.g. reproduction/runs)",
    )
    s.add_argument(
        "--archive",
        metavar="DEST",
        help="copy the small files of every marked run directory (--runs-dir) into DEST, never overwriting",
    )
    s.set_defaults(fn=_cmd_reproduce)
    s = sub.add_parser("clean", help="remove namespaces, links, bridges and processes a killed run left")
    s.add_argument(
        "--force",
        action="store_true",
        help="while a run is live, still remove what dead runs left (never the live run's objects)",
    )
    s.set_defaults(fn=_cmd_clean)
    s = sub.add_parser(
        "profile",
        help="measure per-layer forward/backward times of a model on this machine "
        "(or, with --host, this machine's host rates; with --machine, its cost "
        "model)",
    )
    s.add_argument("model", nargs="?", help="registered model name, e.g. digits_mlp")
    s.add_argument("--batch", type=int, help="samples per batch (required with a model)")
    s.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    s.add_argument("--iterations", type=int, default=20, help="timed iterations; the median is reported")
    s.add_argument("--warmup", type=int, default=3, help="untimed iterations first")
    s.add_argument("--out", help="profile JSON to write (default ./<model>-<device>-b<batch>.json; never overwritten)")
    s.add_argument(
        "--host",
        metavar="OUT.yaml",
        help="instead of a model: measure this machine's host rates (message "
        "overhead, aggregation, optimizer, codec) and write them as a host profile (never overwritten)",
    )
    s.add_argument(
        "--threads", type=int, default=1, help="torch threads for --host (default 1, as the runtime's processes)"
    )
    s.add_argument(
        "--machine",
        nargs="?",
        const="",
        metavar="OUT.yaml",
        help="instead of a model: measure this machine's cost model, which the capacity check and scale: "
        "auto use (as root: it builds networks); default OUT: $TESTBED_MACHINE_COSTS, "
        "else $XDG_CONFIG_HOME/dl-netbed/machine_costs.yaml (~/.config/...)",
    )
    s.add_argument("--force", action="store_true", help="with --machine: replace an existing OUT once measured")
    s.set_defaults(fn=_cmd_profile)
    s = sub.add_parser(
        "schema",
        help="print the experiment spec's JSON Schema (what editors check specs with; "
        "committed as testbed/data/spec.schema.json)",
    )
    s.set_defaults(fn=_cmd_schema)
    s = sub.add_parser(
        "completion",
        help="print shell code that completes testbed's commands, options and --set "
        'paths: eval "$(testbed completion)" in ~/.bashrc',
    )
    s.add_argument("--shell", choices=SHELLS, help="default: the login shell ($SHELL) if one of these, else bash")
    s.set_defaults(fn=_cmd_completion)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv`` (default: ``sys.argv[1:]``); returns the exit status (see the
    module doc). Under shell completion (argcomplete's environment) it prints the completions
    and exits instead.

    Raises:
        SystemExit: bad command-line syntax (status 2, argparse's usage message), ``--help``
            and ``--version`` (status 0).
    """
    parser = build_parser()
    argcomplete.autocomplete(parser)
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except RunFailed as e:
        print(f"testbed: error: {e}", file=sys.stderr)
        return 1
    except TestbedError as e:
        print(f"testbed: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("testbed: interrupted; everything the run built was torn down", file=sys.stderr)
        return 130
    except OSError as e:  # the machine refused a file operation (e.g. a full disk): say which, no traceback
        if isinstance(e, BrokenPipeError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        where = f": {e.filename}" if e.filename else ""
        print(f"testbed: error: {e.strerror or e}{where}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
