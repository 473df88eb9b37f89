"""Stanza against the parameter server: Figures 6 a-c, 7 and Table 6 from run directories, Fig. 8 from the model.

    testbed report stanza RUN_OR_SWEEP_DIR [...] [--plots DIR]
    testbed report stanza [RUN_OR_SWEEP_DIR ...] --fig8 MODEL_OR_PROFILE... [--fig8-gbps G...]
        [--fig8-nodes N...] [--plots DIR]
    python -m analysis.stanza_report RUN_OR_SWEEP_DIR [...] [--plot]
    python -m analysis.stanza_report --fig8 MODEL_OR_PROFILE... [--fig8-gbps G...] [--fig8-nodes N...]

For every run (a run directory, or every run of a sweep directory) of scheme ``stanza`` or
``ps`` it computes (:func:`run_figures`):

* ``measured_s``: mean iteration time over the measured iterations (``summary.json``,
  emulated-network time; recomputed from the events when there is no summary);
* ``predicted_s``: Stanza eq. (3) with the run's ``n_c``, ``n_f``, or PS eq. (6) with its
  workers and servers (:mod:`analysis.paper_models.stanza`), from the run's compute profile and
  ``topology.host_bw_mbps`` (real-compute runs have no compute profile: no prediction);
* ``fc_bytes_per_iter`` (Stanza §6.3 "FC-Data"): payload bytes sent per iteration to
  update the FC layers -- Stanza: activations, their gradients, the labels and, with
  several FC workers, the FC allreduce; PS: pushes and pulls of keys in layers at or after
  the model's ``split_index``;
* ``bytes_per_iter``: payload bytes sent by all processes per iteration (every ``tx``
  event of a measured iteration), and ``wire_bytes_per_iter`` from the switch-port
  captures (``summary.json`` ``bytes_per_iteration.host_links`` / 2: each byte crosses two
  host links);
* ``bytes_per_epoch`` ("Total-Data"): ``bytes_per_iter`` times the iterations of one epoch,
  ``floor(samples / global batch)`` (remainder dropped, Stanza footnote 5) with the
  ImageNet-12 training set (1,281,167 images) for emulated runs and the dataset's training
  set for real-compute runs;
* ``final_accuracy`` and the ``eval`` curve (accuracy against seconds since the first
  iteration started) for real-compute runs;
* ``flags``: the run's fidelity flags (:func:`analysis.report.fidelity_flags`).

:func:`pair` puts each Stanza run next to the PS run of the same model and worker count
(the last one if there are several) and gives the speedup ``t_ps / t_stanza`` (equal global
batches, so equal work per iteration), flagged with both runs' fidelity flags. Both tables
are printed as markdown, their ``flags`` explained under a table that has a flagged row.
``--plot`` draws accuracy against wall time of every real-compute run into
``stanza_accuracy.png`` in the first directory given (``--plots DIR``: into ``DIR``).

``--fig8`` needs no run (:func:`fig8`, :func:`fig8_text`): Stanza §7.2's numerical
simulation, Fig. 8. For every model or compute profile given, every bandwidth (``--fig8-gbps``,
Gbit/s at each node; default the paper's 25, 40 and 100) and every cluster size
(``--fig8-nodes``; default the paper's 5, 10, 20, 40 and 80 nodes in total), the
throughput-maximizing node assignment of Stanza (eq. (5): ``n_c`` CONV + ``n_f`` FC workers)
and of PS (§7.2: ``n_w`` workers + ``n_s`` servers), their predicted times per iteration
(eqs. (3), (6)), throughputs (eqs. (4), (7)), the speedup (throughput ratio) and each
system's throughput over that of the previous cluster size (the paper's "40 to 80 nodes"
scalability). The paper's ``T_ps``, ``T_c`` and ``T_f`` come from its EC2 runs and are not
printed, so compute profiles stand in: a model name takes :data:`FIG8_PROFILES` (the V100
profiles that ship, at Stanza Table 5's batch), a ``.json`` path any profile
(its model and batch size are the file's). ``--plots DIR`` draws ``stanza_fig8.png``
(throughput against nodes, one panel per profile and bandwidth, as the paper's figure).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
from pathlib import Path

import pandas as pd

from analysis import report as skeleton
from analysis.load import Run, load
from analysis.metrics import global_iterations
from analysis.paper_models import stanza as sm
from traffic.compute_profiles import Profile, load_profile
from traffic.data import load_dataset
from traffic.models import model_info
from traffic.rundir import find_runs

__all__ = [
    "IMAGENET_TRAIN",
    "REPORT",
    "FIG8_GBPS",
    "FIG8_NODES",
    "FIG8_PAPER",
    "FIG8_PROFILES",
    "TABLE5_BATCH",
    "run_figures",
    "pair",
    "report",
    "table",
    "plots",
    "plot_speedup",
    "fig8_constants",
    "fig8_rows",
    "fig8_text",
    "plot_fig8",
    "main",
]

IMAGENET_TRAIN = 1_281_167
"""Training images of ImageNet-12 (ILSVRC 2012), the data set of Stanza §6.3."""

_STANZA_FC_KINDS = {"activation", "activation_grad", "label"}


def _measured_iterations(run: Run) -> list[int]:
    it = run.events[(run.events["kind"] == "iteration") & (run.events["role"] == "worker")]["iteration"]
    first, stop = run.measured_span
    its = sorted(set(int(i) for i in it.dropna()))
    return its[first:] if stop is None else its[first:stop]


def _iteration_time(run: Run, measured: list[int]) -> float | None:
    it = run.summary.iteration_time_s if run.summary else None
    if it is not None and it.mean is not None:
        return float(it.mean)
    g = global_iterations(run.iterations)
    g = g[g["iteration"].isin(measured)]
    return float(g["time_s"].mean()) if len(g) else None


def run_figures(run_dir: str | Path) -> dict:
    """The figures of one run (see the module docstring).

    Returns a dict: ``run``, ``scheme``, ``model``, ``workers`` (CONV workers / PS
    workers), ``fc_workers`` / ``servers``, ``batch_size``, ``measured_s``, ``predicted_s``,
    ``model_error`` (``(predicted - measured) / measured``), ``fc_bytes_per_iter``,
    ``bytes_per_iter``, ``wire_bytes_per_iter``, ``iters_per_epoch``, ``bytes_per_epoch``,
    ``final_accuracy``, ``accuracy_curve`` (list of ``(seconds, accuracy)``), ``flags``
    (:func:`analysis.report.fidelity_flags`).

    Raises:
        FileNotFoundError: not a run directory.
    """
    run = load(run_dir)
    w = run.spec.get("workload") or {}
    scheme, model = w.get("scheme"), w.get("model")
    procs = run.processes.get("processes", [])
    n = sum(p["role"] == "worker" for p in procs)
    other = sum(p["role"] in ("fc", "server") for p in procs)
    if not procs:  # an archived run keeps no processes.json: the counts its spec asked for
        n = int(w.get("workers") or 0)
        other = (
            int((w.get("options") or {}).get("fc_workers") or 0)
            if scheme == "stanza"
            else int((w.get("servers") or {}).get("count") or 0)
        )
    K = int(w.get("batch_size") or 0)
    ev = run.events
    measured = _measured_iterations(run) if not ev.empty else []
    compute = w.get("compute") or {}
    out = {
        "run": run.path.name,
        "scheme": scheme,
        "model": model,
        "workers": n,
        "profile": _profile_name(compute),
        "fc_workers" if scheme == "stanza" else "servers": other,
        "batch_size": K,
        "measured_s": _iteration_time(run, measured),
        "predicted_s": None,
        "model_error": None,
        "flags": skeleton.fidelity_flags(run_dir),
    }
    split = model_info(model)["split_index"]
    tx = ev[(ev.get("dir") == "tx") & ev["iteration"].isin(measured)] if not ev.empty and "dir" in ev else ev.iloc[0:0]
    m = max(len(measured), 1)
    out["bytes_per_iter"] = float(tx["bytes"].sum()) / m
    if scheme == "stanza":
        fc = tx[tx["kind"].isin(_STANZA_FC_KINDS) | ((tx["kind"] == "allreduce") & (tx.get("members") == "fc"))]
    else:
        fc = tx[tx["kind"].isin({"push", "pull"}) & (pd.to_numeric(tx["layer"], errors="coerce") >= split)]
    out["fc_bytes_per_iter"] = float(fc["bytes"].sum()) / m
    bpi = run.summary.bytes_per_iteration if run.summary else None
    hl = bpi.host_links if bpi else None
    out["wire_bytes_per_iter"] = None if hl is None else hl / 2
    if compute.get("mode") == "emulated":
        samples = IMAGENET_TRAIN
    else:
        samples = load_dataset(w.get("dataset", "digits"), int(w.get("seed") or 0)).n_train
    out["iters_per_epoch"] = samples // max(n * K, 1)
    if ev.empty:  # no events kept (an archived run's small files): the payload is not known, not 0
        out["bytes_per_iter"] = out["fc_bytes_per_iter"] = None
    out["bytes_per_epoch"] = None if out["bytes_per_iter"] is None else out["bytes_per_iter"] * out["iters_per_epoch"]
    if compute.get("mode") == "emulated" and scheme in ("stanza", "ps") and n >= 1 and other >= 1:
        out["predicted_s"] = _predict(run, scheme, model, K, n, other, compute.get("profile", "zero"))
        if out["measured_s"]:
            out["model_error"] = (out["predicted_s"] - out["measured_s"]) / out["measured_s"]
    evals = ev[(ev["kind"] == "eval") & (ev["proc"] == "worker0")] if not ev.empty else ev
    if len(evals) and "accuracy" in evals:
        start = ev[(ev["kind"] == "iteration") & (ev["role"] == "worker")]["ts"].min()
        out["accuracy_curve"] = [(float(r.ts + r.dur - start), float(r.accuracy)) for r in evals.itertuples()]
        out["final_accuracy"] = float(evals["accuracy"].iloc[-1])
    else:
        out["accuracy_curve"], out["final_accuracy"] = [], None
    return out


def _profile_name(compute: dict) -> str:
    """The compute profile of a run as a short name: ``real``, a device (``v100``), or a
    profile file's stem (``alexnet-v100table1-b128``)."""
    if compute.get("mode") != "emulated":
        return "real"
    ref = str(compute.get("profile", "zero"))
    return Path(ref).stem if ref.endswith(".json") else ref


def _predict(run: Run, scheme: str, model: str, K: int, n: int, other: int, profile: str) -> float:
    c = sm.Constants.from_profile(model, load_profile(profile, model, K))
    bw = float((run.spec.get("topology") or {}).get("host_bw_mbps") or 0) * 1e6
    if scheme == "stanza":
        return sm.stanza_iteration_time(c, n, other, bw)
    return sm.ps_iteration_time(c, n, other, bw)


#: What identifies a Stanza run's PS baseline: the same model, worker count and compute
#: profile (a sweep over compute profiles gives the band of compute times: PHub-derived against
#: Table-1-derived).
POINT = ["model", "workers", "profile"]

#: ``pair``'s ratios, PS over Stanza: name -> the per-run figure compared.
RATIOS = {
    "speedup": "measured_s",
    "speedup_predicted": "predicted_s",
    "fc_data_ratio": "fc_bytes_per_iter",
    "epoch_data_ratio": "bytes_per_epoch",
}


def pair(rows) -> pd.DataFrame:
    """Stanza and PS rows of the same model, worker count and compute profile side by side (columns
    ``<figure>_stanza`` and ``<figure>_ps``), with ``speedup`` (measured ``t_ps /
    t_stanza``), ``speedup_predicted`` (eq. 6 / eq. 3), ``fc_data_ratio`` and
    ``epoch_data_ratio`` (PS bytes over Stanza bytes), and ``flags``: the union of both runs'
    fidelity flags (:func:`analysis.report.union_flags`). One row per Stanza run that has a PS
    run at its point (the last one if several).

    Args:
        rows: :func:`run_figures` dicts (or a frame of them).
    """
    df = pd.DataFrame(rows).reset_index(drop=True)
    if df.empty:
        return df
    partner = skeleton.baseline_rows(df, "ps", POINT, variant="scheme")
    ratios = {k: skeleton.per_point(df, v, "ps", POINT, variant="scheme", inverse=True) for k, v in RATIOS.items()}
    keep = [i for i in df.index if df.at[i, "scheme"] == "stanza" and partner[i] is not None]
    rest = [c for c in df.columns if c not in POINT]
    j = pd.concat(
        [
            df.loc[keep, POINT].reset_index(drop=True),
            df.loc[keep, rest].add_suffix("_stanza").reset_index(drop=True),
            df.loc[[partner[i] for i in keep], rest].add_suffix("_ps").reset_index(drop=True),
        ],
        axis=1,
    )
    for k, v in ratios.items():
        j[k] = [v[i] for i in keep]
    j["flags"] = [skeleton.union_flags(a, b) for a, b in zip(j["flags_stanza"], j["flags_ps"])]
    return j


def _mb(x) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x / 1e6:,.1f}"


def _s(x) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


def _run_table(rows: list[dict]) -> pd.DataFrame:
    """The run figures as the report prints them (strings)."""
    return pd.DataFrame(
        [
            {
                "scheme": r["scheme"],
                "model": r["model"],
                "n": r["workers"],
                "K": r["batch_size"],
                "profile": r["profile"],
                "measured": _s(r["measured_s"]),
                "predicted": _s(r["predicted_s"]),
                "err": "-" if r["model_error"] is None else f"{100 * r['model_error']:+.0f}%",
                "FC MB/it": _mb(r["fc_bytes_per_iter"]),
                "MB/it": _mb(r["bytes_per_iter"]),
                "wire MB/it": _mb(r["wire_bytes_per_iter"]),
                "MB/epoch": _mb(r["bytes_per_epoch"]),
                "acc": "-" if r["final_accuracy"] is None else f"{100 * r['final_accuracy']:.1f}",
                "flags": r["flags"],
            }
            for r in rows
        ],
        columns=[
            "scheme",
            "model",
            "n",
            "K",
            "profile",
            "measured",
            "predicted",
            "err",
            "FC MB/it",
            "MB/it",
            "wire MB/it",
            "MB/epoch",
            "acc",
            "flags",
        ],
    )


def _pair_table(j: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "model": r.model,
                "n": r.workers,
                "profile": r.profile,
                "speedup": f"{r.speedup:.2f}",
                "predicted": f"{r.speedup_predicted:.2f}",
                "FC-data ps/stanza": f"{r.fc_data_ratio:.1f}",
                "epoch-data ps/stanza": f"{r.epoch_data_ratio:.1f}",
                "flags": r.flags,
            }
            for r in j.itertuples()
        ]
    )


def _text(rows: list[dict]) -> str:
    """The text report of :func:`run_figures` rows."""
    right = ["left", "left"] + ["right"] * 10
    lines = [
        "run figures (times in s of the emulated network; bytes in MB of payload):",
        skeleton.flagged_markdown(_run_table(rows), preformatted=True, colalign=right + ["left"]),
    ]
    j = pair(rows)
    if not j.empty:
        lines += [
            "",
            "stanza vs ps (same model, workers, global batch):",
            skeleton.flagged_markdown(_pair_table(j), preformatted=True, colalign=right[1:7] + ["left"]),
        ]
    curves = [r for r in rows if r["accuracy_curve"]]
    if curves:
        lines += ["", "accuracy against wall time (worker 0's eval events; s since the first iteration):"]
        for r in curves:
            pts = ", ".join(f"{t:.1f}s {100 * a:.1f}%" for t, a in r["accuracy_curve"])
            lines.append(f"{r['scheme']}: {pts}")
    return "\n".join(lines)


def _rows(paths) -> list[dict]:
    return skeleton.load_rows(find_runs(paths), run_figures)[0]


def report(paths, plot: bool = False) -> str:
    """The text report of every run under ``paths`` (see the module docstring); with
    ``plot``, also the accuracy plot in the first directory given (the parent of a run)."""
    rows = _rows(paths)
    curves = [r for r in rows if r["accuracy_curve"]]
    if plot and curves:
        first = Path(paths[0])
        _plot(curves, first.parent if (first / "spec.yaml").is_file() else first)
    return _text(rows)


# ----------------------------------------------------------------------------- Fig. 8: the model only

_REPO = Path(__file__).resolve().parents[1]

FIG8_NODES = (5, 10, 20, 40, 80)
"""Stanza Fig. 8's cluster sizes: "Stanza and PS use 5, 10, 20, 40, and 80 nodes in total"
(the figure's caption, §7.2)."""

FIG8_GBPS = (25.0, 40.0, 100.0)
"""Stanza Fig. 8's bandwidths at each node, Gbit/s: "We vary the network bandwidth from 25G to
40G and 100G" (§7.2)."""

TABLE5_BATCH = {"alexnet": 128, "vgg16": 64, "vgg19": 64}
"""Per-worker batch of Fig. 8's CNNs ("AlexNet, VGG-16, and VGG-19 on ImageNet-12", §7.2) in
Stanza Table 5 (§6.1)."""

FIG8_PROFILES = {
    "alexnet": _REPO / "experiments" / "stanza_profiles" / "alexnet-v100-b128.json",
    "vgg16": _REPO / "experiments" / "stanza_profiles" / "vgg16-v100-b64.json",
    "vgg19": _REPO / "experiments" / "stanza_profiles" / "vgg19-v100-b64.json",
}
"""The compute profile a model name stands for in ``--fig8``: the Tesla V100 profiles at Table 5's
batch (PHub's GTX 1080 Ti times scaled by the two GPUs' peak FP32 ratio and by batch size,
written by ``experiments/stanza_profiles/derive_batch.py``: each file's ``method``)."""

FIG8_PAPER = {
    "alexnet": "80 nodes at 40G 1.79x; 40 nodes at 25G 2.29x; at 100G 1.55x; 40 -> 80 nodes: Stanza 2x "
    "(25G, 100G), PS 1.73x (25G), 1.85x (100G)",
    "vgg16": "80 nodes at 40G 1.97x; 40 nodes at 25G 2.35x; at 100G 1.72x; 40 -> 80 nodes: Stanza 2x (25G), "
    "PS 1.81x (25G), 1.91x (100G)",
    "vgg19": "80 nodes at 40G 1.87x; 40 nodes at 25G 2.33x; at 100G 1.84x; 40 -> 80 nodes: Stanza 2x "
    "(25G, 100G), PS 1.70x (25G), 1.73x (100G)",
}
"""What Stanza §7.2's text states of Fig. 8 per model (speedups are throughput ratios; the
figure itself prints no value)."""

FIG8_NOTE = (
    "Stanza Fig. 8 (§7.2) from the performance models, no emulation: on N nodes in total, Stanza's node "
    "assignment (eq. (5): n_c CONV + n_f FC workers maximizing eq. (4)) against PS's (§7.2: n_w workers + n_s "
    "servers maximizing eq. (7)); ms = predicted time per iteration (eqs. (3), (6)); throughput in 10^3 "
    "samples/s (the figure's y axis); speedup = Stanza's throughput / PS's; scale = throughput over that of the "
    "previous N at the same bandwidth. The paper's T_ps, T_c and T_f come from its EC2 runs (Tesla V100, §7.1) "
    "and are not printed in the paper, so the compute profiles below stand in for them: T_c = forward + backward "
    "of the layers before the model's CONV/FC split, T_f = of the others, T_ps = T_c + T_f. Not modelled: the "
    "GPU memory the paper also considers in node assignment (footnote 6)."
)


def fig8_constants(ref: str) -> tuple[str, Profile, sm.Constants]:
    """The model constants (Stanza Table 3) of one ``--fig8`` argument.

    Args:
        ref: a model of :data:`FIG8_PROFILES` (its shipped V100 profile), or the path of a
            profile JSON (:mod:`traffic.compute_profiles` format; its ``model``, which needs a
            CONV/FC ``split_index``, and its ``batch_size``, which is ``K``).

    Returns:
        ``(path of the profile, the profile, its constants)``.

    Raises:
        ReportError: ``ref`` is neither a Fig. 8 model nor a ``.json`` path; the file is a
            directory, cannot be read, is not JSON or names no model and integer batch size;
            the model has no CONV/FC split.
        TestbedError: the file is not a valid profile, its model is unknown, or its layer
            count differs from the model's (:func:`traffic.compute_profiles.load_profile`).
    """
    if ref in FIG8_PROFILES:
        path = FIG8_PROFILES[ref]
    elif ref.endswith(".json") or "/" in ref:
        path = Path(ref)
    else:
        raise skeleton.ReportError(
            f"--fig8: {ref!r} is neither a model of Fig. 8 ({', '.join(FIG8_PROFILES)}) "
            "nor a compute profile file (.json)"
        )
    if path.is_dir():
        raise skeleton.ReportError(
            f"--fig8: {ref} is a directory, not a compute profile; give run or sweep directories before --fig8"
        )
    try:
        doc = json.loads(path.read_text())
    except OSError as e:
        raise skeleton.ReportError(f"--fig8: cannot read compute profile {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise skeleton.ReportError(f"--fig8: {path} is not JSON ({e})") from None
    if not (
        isinstance(doc, dict)
        and isinstance(doc.get("model"), str)
        and isinstance(doc.get("batch_size"), int)
        and not isinstance(doc.get("batch_size"), bool)
    ):
        raise skeleton.ReportError(
            f"--fig8: {path} is not a compute profile (no string 'model' and integer 'batch_size')"
        )
    prof = load_profile(str(path), doc["model"], doc["batch_size"])
    try:
        c = sm.Constants.from_profile(prof.model, prof)
    except ValueError as e:
        raise skeleton.ReportError(f"--fig8: {path}: {e}; Stanza's model needs a CONV/FC boundary") from None
    return str(path), prof, c


def _fig8_sections(refs, gbps, nodes) -> list[tuple[str, Profile, sm.Constants, pd.DataFrame]]:
    if not refs:
        raise skeleton.ReportError("--fig8: give at least one model or compute profile")
    nodes = sorted({int(n) for n in nodes})
    gbps = sorted({float(g) for g in gbps})
    if not nodes or nodes[0] < 2:
        raise skeleton.ReportError(
            f"--fig8-nodes: every node count must be at least 2 (one CONV and one FC worker, "
            f"one PS worker and one server), got {nodes[0] if nodes else 'none'}"
        )
    if not gbps or not all(math.isfinite(g) and g > 0 for g in gbps):
        raise skeleton.ReportError(
            f"--fig8-gbps: every bandwidth must be a finite number of Gbit/s > 0, got "
            f"{', '.join(f'{g:g}' for g in gbps) or 'none'}"
        )
    out = []
    for ref in refs:
        path, prof, c = fig8_constants(ref)
        rows = []
        for g in gbps:
            prev = None
            for N in nodes:
                pt = sm.stanza_vs_ps(c, N, g * 1e9)
                s, p = pt.stanza, pt.ps
                rows.append(
                    {
                        "model": prof.model,
                        "profile": path,
                        "K": c.K,
                        "gbps": g,
                        "N": N,
                        "n_c": s.n_c,
                        "n_f": s.n_f,
                        "stanza_s": s.time_s,
                        "stanza_sps": s.throughput,
                        "n_w": p.n_c,
                        "n_s": p.n_f,
                        "ps_s": p.time_s,
                        "ps_sps": p.throughput,
                        "speedup": pt.speedup,
                        "stanza_scale": s.throughput / prev.stanza.throughput if prev else math.nan,
                        "ps_scale": p.throughput / prev.ps.throughput if prev else math.nan,
                    }
                )
                prev = pt
        out.append((path, prof, c, pd.DataFrame(rows)))
    return out


def fig8_rows(refs, gbps=FIG8_GBPS, nodes=FIG8_NODES) -> pd.DataFrame:
    """Stanza Fig. 8 from the models (:func:`analysis.paper_models.stanza.stanza_vs_ps`).

    Args:
        refs: models or compute profile files (:func:`fig8_constants`).
        gbps: bandwidths at each node, Gbit/s (``B`` = ``gbps`` x 1e9 bit/s).
        nodes: cluster sizes ``N`` (both systems use all ``N`` nodes).

    Returns:
        One row per (ref, bandwidth, N), bandwidths and node counts ascending (duplicates
        dropped): ``model``, ``profile`` (path), ``K``, ``gbps``, ``N``, ``n_c``, ``n_f``
        (Stanza's CONV and FC workers), ``stanza_s`` (eq. (3), s), ``stanza_sps`` (eq. (4),
        samples/s), ``n_w``, ``n_s`` (PS workers and servers), ``ps_s`` (eq. (6), s),
        ``ps_sps`` (eq. (7), samples/s), ``speedup`` (``stanza_sps / ps_sps``),
        ``stanza_scale``, ``ps_scale`` (throughput over the previous ``N``'s at that ref and
        bandwidth; NaN for the smallest ``N``).

    Raises:
        ReportError: no ref, a node count < 2, a bandwidth that is not a finite number > 0,
            or a ref :func:`fig8_constants` refuses.
        TestbedError: as :func:`fig8_constants`.
    """
    return pd.concat([df for *_, df in _fig8_sections(refs, gbps, nodes)], ignore_index=True)


def _shown(path: str) -> str:
    """``path`` relative to the repository when it is inside it."""
    try:
        return str(Path(path).resolve().relative_to(_REPO))
    except ValueError:
        return path


def _x(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:.3f}"


def fig8_text(refs, gbps=FIG8_GBPS, nodes=FIG8_NODES) -> str:
    """:func:`fig8_rows` as text: :data:`FIG8_NOTE`, then per ref its constants, its profile's
    provenance and a markdown table (times in ms, throughputs in 10^3 samples/s, ratios to
    3 decimals), and what the paper states for that model (:data:`FIG8_PAPER`).

    Raises:
        ReportError, TestbedError: as :func:`fig8_rows`.
    """
    lines = [textwrap.fill(FIG8_NOTE, width=110)]
    for path, prof, c, df in _fig8_sections(refs, gbps, nodes):
        t5 = TABLE5_BATCH.get(prof.model)
        batch = "" if t5 in (None, c.K) else f" (Stanza Table 5 trains {prof.model} with {t5} per worker)"
        lines += [
            "",
            f"## Fig. 8: {prof.model}, K = {c.K} per node{batch}: {_shown(path)}",
            f"device {prof.device}; T_c {1e3 * c.T_c:.2f} ms, T_f {1e3 * c.T_f:.2f} ms, "
            f"T_ps {1e3 * c.T_ps:.2f} ms "
            f"per batch of K; P {c.P / 1e6:.3f} M, P_c {c.P_c / 1e6:.3f} M parameters; A {c.A:,} activations "
            "per sample",
            f"profile: {prof.method}",
            "",
        ]
        t = pd.DataFrame(
            {
                "Gbit/s": [f"{g:g}" for g in df["gbps"]],
                "N": df["N"].astype(str),
                "n_c": df["n_c"].astype(str),
                "n_f": df["n_f"].astype(str),
                "Stanza ms": [f"{1e3 * v:.2f}" for v in df["stanza_s"]],
                "Stanza 10^3/s": [f"{v / 1e3:.3f}" for v in df["stanza_sps"]],
                "n_w": df["n_w"].astype(str),
                "n_s": df["n_s"].astype(str),
                "PS ms": [f"{1e3 * v:.2f}" for v in df["ps_s"]],
                "PS 10^3/s": [f"{v / 1e3:.3f}" for v in df["ps_sps"]],
                "speedup": [_x(v) for v in df["speedup"]],
                "Stanza scale": [_x(v) for v in df["stanza_scale"]],
                "PS scale": [_x(v) for v in df["ps_scale"]],
            }
        )
        lines.append(skeleton.markdown(t, preformatted=True, colalign=["right"] * len(t.columns)))
        if prof.model in FIG8_PAPER:
            lines += ["", f"paper (§7.2, {prof.model}, its own T_ps, T_c, T_f): {FIG8_PAPER[prof.model]}"]
    return "\n".join(lines)


def plot_fig8(rows: pd.DataFrame, path) -> Path:
    """Fig. 8: Stanza's and PS's modelled throughput (10^3 samples/s) against nodes (log
    axis), one panel per profile (row) and bandwidth (column), from :func:`fig8_rows`."""
    # lazy: analysis.plots loads matplotlib, which the tables do not need
    from analysis.plots import plt, save_figure

    profiles = list(dict.fromkeys(rows["profile"]))
    gbps = sorted(rows["gbps"].unique())
    fig, axes = plt.subplots(len(profiles), len(gbps), figsize=(3.6 * len(gbps), 2.9 * len(profiles)), squeeze=False)
    for i, prof in enumerate(profiles):
        for j, g in enumerate(gbps):
            ax = axes[i][j]
            d = rows[(rows["profile"] == prof) & (rows["gbps"] == g)]
            ax.plot(d["N"], d["stanza_sps"] / 1e3, "o-", label="Stanza")
            ax.plot(d["N"], d["ps_sps"] / 1e3, "s-", label="PS")
            ax.set_xscale("log")
            ax.set_xticks(list(d["N"]))
            ax.set_xticklabels([str(n) for n in d["N"]])
            ax.minorticks_off()
            ax.set_title(f"{Path(prof).stem}, {g:g} Gbit/s", fontsize=9)
            ax.set_xlabel("nodes")
            ax.set_ylabel("10^3 samples/s")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


def table(paths, fig8: list[str] | None = None, fig8_gbps=FIG8_GBPS, fig8_nodes=FIG8_NODES) -> str:
    """:func:`report` without the plot, then, with ``fig8`` (models or profile files, see
    :func:`fig8_constants`), :func:`fig8_text`; ``paths`` may be empty then.

    Raises:
        ReportError, TestbedError: as :func:`fig8_rows` (a bad ``--fig8`` argument).
    """
    parts = [_text(_rows(paths))] if paths else []
    if fig8:
        parts.append(fig8_text(fig8, fig8_gbps, fig8_nodes))
    return "\n\n".join(parts)


def plots(paths, out_dir, fig8: list[str] | None = None, fig8_gbps=FIG8_GBPS, fig8_nodes=FIG8_NODES) -> list[Path]:
    """``stanza_speedup.png`` in ``out_dir`` when a Stanza run has its PS run
    (:func:`plot_speedup`), ``stanza_accuracy.png`` when a run has an accuracy curve, and with
    ``fig8`` ``stanza_fig8.png`` (:func:`plot_fig8`)."""
    out = []
    runs = find_runs(paths) if paths else []
    rows = skeleton.load_rows(runs, run_figures)[0]
    paired = pair([{**r, "path": str(p)} for r, p in zip(rows, runs)])
    if not paired.empty:
        out.append(plot_speedup(paired, Path(out_dir) / "stanza_speedup.png", sweeps=paths))
    curves = [r for r in rows if r["accuracy_curve"]]
    if curves:
        out.append(_plot(curves, Path(out_dir)))
    if fig8:
        out.append(plot_fig8(fig8_rows(fig8, fig8_gbps, fig8_nodes), Path(out_dir) / "stanza_fig8.png"))
    return out


def plot_speedup(paired: pd.DataFrame, path, sweeps=()) -> Path:
    """Fig. 6a: the measured speedup of each Stanza run over its PS run (:func:`pair`, with the
    run directories in ``path_stanza``), a bar per pair, eqs. (3)/(6)'s prediction as a marker,
    and the paper's value of the catalogue's headline ratios for ``sweeps``
    (:func:`analysis.plots.mark_paper`)."""
    # lazy: analysis.plots loads matplotlib, which the tables do not need
    from analysis.plots import mark_paper, plt, save_figure

    fig, ax = plt.subplots(figsize=(max(5.0, 1.6 * len(paired) + 2.5), 4.0))
    x = list(range(len(paired)))
    ax.bar(x, paired["speedup"], color="tab:blue", alpha=0.85, label="measured (PS time / Stanza time)")
    ax.plot(x, paired["speedup_predicted"], "rx", label="eqs. (3), (6)")
    mark_paper(
        ax,
        sweeps,
        dict(zip(paired["path_stanza"], paired["speedup"])),
        {p: (i - 0.4, i + 0.4) for p, i in zip(paired["path_stanza"], x)},
    )
    ax.set_xticks(
        x,
        [f"{m}, {n} workers\n{p}" for m, n, p in zip(paired["model"], paired["workers"], paired["profile"])],
        fontsize=7,
    )
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_ylabel("speedup of Stanza over PS")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path)


def _plot(curves: list[dict], out_dir: Path) -> Path:
    # lazy: analysis.plots loads matplotlib, which the tables do not need
    from analysis.plots import plt, save_figure

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in curves:
        t, a = zip(*r["accuracy_curve"])
        ax.plot(t, [100 * x for x in a], marker="o", label=f"{r['scheme']} ({r['workers']} workers)")
    ax.set_xlabel("wall time since the first iteration (s)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"{curves[0]['model']}: accuracy against wall time")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return save_figure(fig, out_dir / "stanza_accuracy.png")


def _options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--fig8",
        nargs="+",
        metavar="MODEL_OR_PROFILE",
        help=f"print Fig. 8 from the performance models, no run needed: a model "
        f"({', '.join(FIG8_PROFILES)}: the V100 profiles that ship) or a compute profile .json each",
    )
    ap.add_argument(
        "--fig8-gbps",
        nargs="+",
        type=float,
        default=list(FIG8_GBPS),
        metavar="GBPS",
        help="bandwidths at each node for --fig8, Gbit/s (default the paper's 25 40 100)",
    )
    ap.add_argument(
        "--fig8-nodes",
        nargs="+",
        type=int,
        default=list(FIG8_NODES),
        metavar="N",
        help="nodes in total for --fig8 (default the paper's 5 10 20 40 80)",
    )


REPORT = skeleton.Report("stanza", __doc__.split("\n")[0], table, plots, _options, standalone=("fig8",))


def main(argv: list[str] | None = None) -> int:
    """Command line: print :func:`report` of the given run or sweep directories, and with
    ``--fig8`` :func:`fig8_text`."""
    ap = argparse.ArgumentParser(prog="python -m analysis.stanza_report", description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="*", help="run or sweep directories (none needed with --fig8)")
    ap.add_argument("--plot", action="store_true", help="accuracy against wall time -> stanza_accuracy.png")
    _options(ap)
    a = ap.parse_args(argv)
    if not a.dirs and not a.fig8:
        ap.error("give run or sweep directories or --fig8")
    parts = [report(a.dirs, plot=a.plot)] if a.dirs else []
    if a.fig8:
        parts.append(fig8_text(a.fig8, a.fig8_gbps, a.fig8_nodes))
    print("\n\n".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(skeleton.alias(main))
