"""PHub's analytic models: PS bandwidth lower bounds (Sec. 2.3.1, Fig. 4, Table 2)
and when hierarchical reduction pays (Sec. 3.4).

Notation: ``M`` model size (bytes; gradients and parameters have the model's size), ``T``
compute time of one iteration (forward + backward of one batch, seconds), ``N`` workers,
``R`` racks, bandwidths ``B`` in any one unit (bit/s unless a name says otherwise).

**Bandwidth lower bounds** (Sec. 2.3.1: "given a model size of M, and T time for each
iteration, with N workers participating, the network should at least be able to send and
receive model updates within the computation time"; Fig. 4 gives the per-host bound of each
PS configuration of Sec. 2.1). Fig. 4's formulas are drawn in the figure, not in the text;
they follow from Sec. 2.1 (a colocated server's own worker does not use the network -- the
``1/N`` saving -- and a colocated host's interface carries both its worker's and its
server's traffic, "roughly 2x") and reproduce Table 2's column ratios exactly
(``CC/NCC = (N-1)/N``, ``CS/CC = 2/N``, ``NCS/NCC = 1/N``; N = 8: 7/8, 1/4, 1/8)::

    CC   2 (N-1) M / T       the central server host receives N-1 gradients, sends N-1 models
    CS   4 (N-1) M / (N T)   each host: its worker pushes/pulls (N-1)/N of the model, its
                             server shard (M/N) talks to N-1 remote workers
    NCC  2 N M / T           the central server host, N workers
    NCS  2 M / T             each of N server hosts holds M/N for N workers

**Hierarchical reduction** (Sec. 3.4): it pays when the flat scheme's cross-rack transfer
takes longer than the added latency of a two-level reduction::

    N (R-1) / (R B_Core)  >  max(N / B_PBox, 1 / B_Wkr) + C                  (Sec. 3.4)

per byte of the model, with ``C = (R-1) / (R B_bn)``, ``B_bn = min(B_PBox, B_Core)`` for
the inter-rack step (sharded PSs, or approximately a ring of racks). Both sides scale as
``1/B``, so any bandwidth unit works if all three use it. Cross-rack traffic (bytes per
iteration, both directions): flat ``2 M N (R-1)`` (every worker exchanges the ``(R-1)/R``
of the model held in other racks, or all of it with one central PS in another rack: the
same total), hierarchical with a ring ``2 M (R-1)`` (each PBox sends ``2 (R-1)/R M``):
``1/N`` of the flat scheme's.

The inequality's functions (:func:`inter_rack_cost`, :class:`HierarchicalTerms`,
:func:`hierarchical_terms`, :func:`hierarchical_pays`) live with the scheme that evaluates
it for ``hierarchical: auto``, :mod:`traffic.schemes.phub.hierarchy`, and are re-exported
here with PHub's other models.
"""

from __future__ import annotations

from traffic.compute_profiles import load_profile
from traffic.models import build_model
from traffic.schemes.phub.hierarchy import HierarchicalTerms, hierarchical_pays, hierarchical_terms, inter_rack_cost

__all__ = [
    "PAPER_TABLE2",
    "PAPER_TABLE3",
    "ZOO_MODELS",
    "bandwidth_lower_bounds",
    "table2",
    "inter_rack_cost",
    "HierarchicalTerms",
    "hierarchical_terms",
    "hierarchical_pays",
    "cross_rack_bytes",
]

PAPER_TABLE3 = {  # PHub Table 3: model size (MB), forward+backward time per batch (ms), batch
    "AlexNet": (194, 16, 32),
    "VGG 11": (505, 121, 32),
    "VGG 19": (548, 268, 32),
    "GoogleNet": (38, 100, 32),
    "Inception V3": (91, 225, 32),
    "ResNet 18": (45, 54, 32),
    "ResNet 50": (97, 161, 32),
    "ResNet 269": (390, 350, 16),
    "ResNext 269": (390, 386, 8),
}
PAPER_TABLE2 = {  # PHub Table 2: PS-side bandwidth lower bound, Gbit/s, 8 workers
    "ResNet 269": {"CC": 122, "CS": 31, "NCC": 140, "NCS": 17},
    "Inception V3": {"CC": 44, "CS": 11, "NCC": 50, "NCS": 6},
    "GoogleNet": {"CC": 40, "CS": 10, "NCC": 46, "NCS": 6},
    "AlexNet": {"CC": 1232, "CS": 308, "NCC": 1408, "NCS": 176},
}
ZOO_MODELS = {  # paper name -> traffic.models name (models of Table 3 the zoo has)
    "AlexNet": "alexnet",
    "VGG 19": "vgg19",
    "GoogleNet": "googlenet",
    "Inception V3": "inception_v3",
    "ResNet 18": "resnet18",
    "ResNet 50": "resnet50",
}
CONFIGS = ("CC", "CS", "NCC", "NCS")


def bandwidth_lower_bounds(model_bytes: float, time_per_batch_s: float, workers: int) -> dict[str, float]:
    """Per-host bandwidth (bit/s) a PS host needs to hide communication, per configuration
    (PHub Sec. 2.3.1, Fig. 4; formulas in the module docstring).

    Args:
        model_bytes: ``M``, bytes of the model (= of one gradient).
        time_per_batch_s: ``T``, forward + backward time of one batch, seconds.
        workers: ``N`` >= 1.

    Returns:
        ``{"CC": ..., "CS": ..., "NCC": ..., "NCS": ...}`` in bit/s.

    Raises:
        ValueError: ``time_per_batch_s`` <= 0, ``workers`` < 1 or ``model_bytes`` < 0.
    """
    if time_per_batch_s <= 0 or workers < 1 or model_bytes < 0:
        raise ValueError(f"need T > 0 s, N >= 1, M >= 0; got T={time_per_batch_s}, N={workers}, M={model_bytes}")
    m, t, n = 8.0 * model_bytes, float(time_per_batch_s), int(workers)
    return {"CC": 2 * (n - 1) * m / t, "CS": 4 * (n - 1) * m / (n * t), "NCC": 2 * n * m / t, "NCS": 2 * m / t}


def table2(workers: int = 8, source: str = "paper", profile: str = "gtx1080ti") -> list[dict]:
    """Table 2 recomputed: one row per network with the four bounds in Gbit/s.

    Args:
        workers: ``N``.
        source: ``"paper"``: ``M`` and ``T`` from Table 3 (MB = 1e6 bytes), every network
            of Table 3; ``"zoo"``: ``M`` counted from the model of :mod:`traffic.models`
            (float32 parameters, built on the meta device) and ``T`` the sum of the compute
            profile ``profile``'s forward and backward times (batch of Table 3), for the
            networks the zoo has.
        profile: device profile for ``source="zoo"``.

    Returns:
        Rows ``{"network", "model_bytes", "time_s", "CC", "CS", "NCC", "NCS", "paper"}``,
        ``paper`` being Table 2's row (or None where Table 2 has none).

    Raises:
        ValueError: unknown ``source``.
    """
    rows = []
    for net, (mb, ms, batch) in PAPER_TABLE3.items():
        if source == "paper":
            m, t = mb * 1e6, ms / 1e3
        elif source == "zoo":
            if net not in ZOO_MODELS:
                continue
            name = ZOO_MODELS[net]
            model = build_model(name, 0, device="meta")
            m = 4 * model.num_params()
            p = load_profile(profile, name, batch, n_layers=len(model.layers))
            t = sum(p.forward_s()) + sum(p.backward_s())
        else:
            raise ValueError(f"source must be 'paper' or 'zoo', got {source!r}")
        b = bandwidth_lower_bounds(m, t, workers)
        rows.append(
            {
                "network": net,
                "model_bytes": m,
                "time_s": t,
                **{k: v / 1e9 for k, v in b.items()},
                "paper": PAPER_TABLE2.get(net),
            }
        )
    return rows


def cross_rack_bytes(model_bytes: float, racks: int, n: int, hierarchical: bool) -> float:
    """Bytes crossing the core per iteration (both directions; module docstring):
    flat ``2 M N (R-1)``, hierarchical with a ring of PBoxes ``2 M (R-1)`` (PHub Sec. 3.4:
    "lower cross-rack traffic (1/N with N-worker racks)").

    Raises:
        ValueError: ``racks`` or ``n`` < 1.
    """
    if racks < 1 or n < 1:
        raise ValueError(f"need R >= 1 and N >= 1; got R={racks}, N={n}")
    return 2.0 * model_bytes * (racks - 1) * (1 if hierarchical else n)
