"""Per-layer compute profiles: how long each layer's forward and backward take.

Emulated compute (one of the two compute modes, ``docs/architecture.md``) sleeps for these
times instead of computing. A :class:`Profile` gives, for one model, one device and one batch
size, the forward and backward time in seconds *per batch* of every layer of the model's
:class:`~traffic.models.LayeredModel`, in forward order.

Where profiles come from (the ``method`` field):

- ``"flops-split of published per-batch time"``: a paper's forward+backward time per batch,
  split over the layers in proportion to each layer's forward+backward FLOPs
  (:func:`traffic.compute_profiles.flops.split_published`); the data files in
  ``traffic/compute_profiles/data/`` are made this way by ``python -m traffic.compute_profiles.generate``.
- ``"derived: <ratio and its source>"``: another profile scaled by a stated ratio (another
  GPU's peak throughput, another model's FLOPs); ``derived`` is true.
- ``"measured"``: timed on this machine by ``testbed profile`` (:mod:`traffic.compute_profiles.measure`).
- ``"zero"``: all times zero, i.e. infinitely fast compute, as PHub's ``ZeroComputeEngine``
  (PHub Section 4.4).

File format (JSON)::

    {"model": "alexnet", "device": "gtx1080ti", "batch_size": 32,
     "source": "PHub (SoCC'18) Table 3 ...", "method": "flops-split of published per-batch time",
     "derived": false,
     "layers": [{"index": 0, "name": "...", "forward_s": 0.0012, "backward_s": 0.0012,
                 "flops_forward": 4.5e9, "flops_backward": 4.5e9}, ...]}

Data files are named ``<model>-<device>-b<batch>.json``.
"""

from __future__ import annotations

from traffic.compute_profiles.flops import flops_per_layer, layer_flops, split_published
from traffic.compute_profiles.measure import measure_profile
from traffic.compute_profiles.profile import (
    DATA_DIR,
    METHOD_MEASURED,
    METHOD_PUBLISHED,
    LayerProfile,
    Profile,
    available_profiles,
    build_for_profile,
    example_input,
    layer_names,
    load_profile,
    profile_filename,
)

__all__ = [
    "DATA_DIR",
    "METHOD_MEASURED",
    "METHOD_PUBLISHED",
    "LayerProfile",
    "Profile",
    "load_profile",
    "available_profiles",
    "profile_filename",
    "layer_names",
    "build_for_profile",
    "example_input",
    "flops_per_layer",
    "layer_flops",
    "split_published",
    "measure_profile",
]
