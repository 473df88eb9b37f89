"""Regenerate the shipped profiles in ``traffic/compute_profiles/data/`` from published numbers.

    python -m traffic.compute_profiles.generate [--out-dir DIR]

Four kinds of files, each labelled in its ``method`` and ``source`` fields:

1. :data:`PUBLISHED`: a paper's forward+backward time per batch, split over the layers by
   FLOPs (:func:`traffic.compute_profiles.flops.split_published`).
2. :data:`SIBLINGS`: a model the paper did not time, from a published sibling on the same GPU
   and batch, scaled by the ratio of the two models' forward+backward FLOPs (derived).
3. :data:`DEVICES`: every GTX 1080 Ti profile scaled to another GPU by the ratio of peak
   FP32 throughput (derived). The papers give their GPUs' relative speed only in figures
   (PHub Figure 1), never as a number in the text, so the ratio is the vendors' peak FP32
   TFLOPS; it assumes compute-bound FP32 training (no tensor cores, no mixed precision).
4. :data:`BATCHES`: a device's batch-32 profile at the batch a paper trains with, its total
   scaled by the ratio of the model's forward+backward FLOPs at the two batches (derived;
   every op the FLOP counter counts is linear in the batch, so the ratio is batch / 32), split
   by FLOPs. It assumes time proportional to FLOPs (a GPU kept as busy at either batch).

A model that is not registered (``traffic.models``) is skipped with a message. Existing
files of the same names are replaced; nothing else in the directory is touched.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from traffic.compute_profiles.flops import flops_per_layer, split_published
from traffic.compute_profiles.profile import DATA_DIR, Profile, profile_filename
from traffic.models import available_models

__all__ = ["Published", "PUBLISHED", "SIBLINGS", "DEVICES", "BATCHES", "generate"]

_PHUB = (
    'PHub (Luo et al., "Parameter Hub: a Rack-Scale Parameter Server for Distributed Deep '
    'Neural Network Training", SoCC 2018), Table 3 (Section 4.2): forward and backward compute '
    "time per batch of 32 on one GTX 1080 Ti (MXNet): {ms} ms"
)


@dataclass(frozen=True)
class Published:
    """A published forward+backward time per batch: ``total_s`` seconds for ``batch_size``
    samples of ``model`` on ``device``, as cited by ``source``."""

    model: str
    device: str
    batch_size: int
    total_s: float
    source: str


PUBLISHED: list[Published] = [
    Published("alexnet", "gtx1080ti", 32, 0.016, _PHUB.format(ms=16)),
    Published("vgg11", "gtx1080ti", 32, 0.121, _PHUB.format(ms=121)),
    Published("vgg19", "gtx1080ti", 32, 0.268, _PHUB.format(ms=268)),
    Published("googlenet", "gtx1080ti", 32, 0.100, _PHUB.format(ms=100)),
    Published("inception_v3", "gtx1080ti", 32, 0.225, _PHUB.format(ms=225)),
    Published("resnet18", "gtx1080ti", 32, 0.054, _PHUB.format(ms=54)),
    Published("resnet50", "gtx1080ti", 32, 0.161, _PHUB.format(ms=161)),
    # Stanza Section 6.2 (text after Table 6): PS on the Azure cluster (standard_NC6: half a Tesla
    # K80, Section 6.1), VGG-16 on CIFAR-10, per-node batch 128, 40 epochs: "the time spent on
    # computation in PS over 40 epochs, which is 0.47h and 0.25h for 4 and 8 workers". With 4
    # workers an epoch is floor(50000 / (4 * 128)) = 97 iterations (remainder dropped, footnote 5):
    # 0.47 h * 3600 / (40 * 97) = 0.436 s per batch. (8 workers: 0.25 h * 3600 / (40 * 48) =
    # 0.469 s; the 4-worker figure is used, its two significant digits being the more precise.)
    Published(
        "vgg16_cifar10",
        "k80",
        128,
        0.47 * 3600 / (40 * 97),
        'Stanza (Wu et al., "Stanza: Layer Separation for Distributed Training in Deep '
        'Learning"), Section 6.2 after Table 6: PS computation time 0.47 h over 40 epochs with '
        "4 workers, VGG-16 on CIFAR-10, per-node batch 128, Azure standard_NC6 (half a Tesla "
        "K80); 50000/(4*128) -> 97 iterations per epoch (footnote 5): 0.47*3600/(40*97) = "
        "0.436 s per batch",
    ),
]
"""Published forward+backward times per batch used for the shipped profiles.

Numbers looked for and not usable: Stanza Table 1 (V100 per-iteration times) includes
communication, and subtracting its *estimated* communication leaves compute times longer
than PHub's GTX 1080 Ti ones; Stanza Table 7 (MLP) gives whole-epoch times including
communication; iBatch, P3 and Pipe-SGD give their compute times only in figures.
"""

SIBLINGS: list[tuple[str, str]] = [("vgg16", "vgg19"), ("resnet152", "resnet50"), ("vgg19_22k", "vgg19")]
"""``(model, published sibling)``: the model's GTX 1080 Ti time at batch 32 is the sibling's
published time times the ratio of their forward+backward FLOPs (Stanza's VGG-16 and
ResNet-152 and iBatch's VGG19-22K are not in PHub Table 3)."""

_PEAK_1080TI = 11.3
DEVICES: dict[str, tuple[float, str]] = {
    "v100": (15.7, "Tesla V100 SXM2 (EC2 p3.2xlarge, Stanza Section 6.1)"),
    "titanxp": (12.1, "TITAN Xp (Pipe-SGD Section 4)"),
    "p4000": (5.3, "Quadro P4000 (P3 Section 5.1)"),
    "m60": (
        4.825,
        "Tesla M60, one of the board's two GPUs (AWS g3.4xlarge, P3 Section 5.1, has one; "
        "2,048 CUDA cores x 2 FLOPs per cycle x 1,178 MHz boost clock, half the board's 9.65 TFLOPS)",
    ),
}
"""Device name -> (peak FP32 TFLOPS from the NVIDIA datasheet, which GPU and where it is used).
GTX 1080 Ti: 11.3 TFLOPS. A board of two GPUs (Tesla M60) counts one GPU: a cloud instance's
"GPU" is one of them (the Tesla M60's peak is its per-GPU CUDA cores x 2 FLOPs x the boost
clock, the product of the datasheet's figures)."""

_PIPE_SGD_BATCH = (
    'Pipe-SGD Sec. 4 trains AlexNet and ResNet-18 "both with a global batch size of 256" on "a '
    'cluster of four nodes": 256 / 4 = 64 per worker'
)
BATCHES: list[tuple[str, str, int, str]] = [
    ("alexnet", "titanxp", 64, _PIPE_SGD_BATCH),
    ("resnet18", "titanxp", 64, _PIPE_SGD_BATCH),
]
"""``(model, device, batch, why)``: the ``device`` profile of ``model`` at batch 32 made above,
at ``batch``: its total x forward+backward FLOPs at ``batch`` / at 32 (counted by
:mod:`traffic.compute_profiles.flops`), split by FLOPs; ``why`` cites the paper's batch."""


def _registered() -> set[str]:
    return set(available_models())


def _total_flops(model: str, batch_size: int) -> int:
    return sum(f + b for f, b in flops_per_layer(model, batch_size))


def generate(out_dir: str | Path = DATA_DIR, log=print) -> list[Path]:
    """Write every profile this module defines into ``out_dir``; returns the files written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    have = _registered()
    written: list[Path] = []
    base: dict[str, Profile] = {}  # model -> its gtx1080ti b32 profile
    made: dict[tuple[str, str], Profile] = {}  # (model, device) -> its b32 profile scaled by peak FP32

    def save(p: Profile) -> None:
        path = p.save(out_dir / profile_filename(p.model, p.device, p.batch_size), overwrite=True)
        written.append(path)
        log(f"{path.name:40s} {p.total_s() * 1e3:9.2f} ms  {p.method}")

    for pub in PUBLISHED:
        if pub.model not in have:
            log(f"skip {pub.model}: not a registered model")
            continue
        p = split_published(pub.model, pub.device, pub.batch_size, pub.total_s, pub.source, out_dir=None)
        save(p)
        if pub.device == "gtx1080ti" and pub.batch_size == 32:
            base[pub.model] = p

    for model, sibling in SIBLINGS:
        if model not in have or sibling not in base:
            log(f"skip {model}: {model if model not in have else sibling} not available")
            continue
        ref = base[sibling]
        ratio = _total_flops(model, 32) / _total_flops(sibling, 32)
        total = ref.total_s() * ratio
        method = (
            f"derived: {sibling}'s published {ref.total_s() * 1e3:g} ms x forward+backward FLOPs "
            f"ratio {model}/{sibling} = {ratio:.4f} (FLOPs counted by traffic.compute_profiles.flops), "
            "split by FLOPs"
        )
        p = split_published(
            model, "gtx1080ti", 32, total, f"{ref.source} (for {sibling})", method=method, derived=True, out_dir=None
        )
        save(p)
        base[model] = p

    for device, (peak, what) in DEVICES.items():
        factor = _PEAK_1080TI / peak
        for model, ref in base.items():
            how = (
                f"derived: GTX 1080 Ti profile x {factor:.4f} = ratio of peak FP32 throughput, GTX "
                f"1080 Ti {_PEAK_1080TI} TFLOPS / {what} {peak} TFLOPS (NVIDIA datasheets)"
            )
            if ref.derived:
                how += f"; the GTX 1080 Ti profile is itself {ref.method}"
            made[(model, device)] = ref.scaled(factor, device, how)
            save(made[(model, device)])

    for model, device, batch, why in BATCHES:
        if (model, device) not in made:
            log(f"skip {model}-{device}-b{batch}: no {device} batch-32 profile of {model}")
            continue
        ref = made[(model, device)]
        f32, fb = _total_flops(model, ref.batch_size), _total_flops(model, batch)
        ratio = fb / f32
        method = (
            f"derived: {device} batch-{ref.batch_size} profile {ref.total_s() * 1e3:.4f} ms x {ratio:.4f} = "
            f"forward+backward FLOPs at batch {batch} / at batch {ref.batch_size} ({fb:,} / {f32:,}, counted "
            f"by traffic.compute_profiles.flops; time taken as proportional to FLOPs), split by FLOPs; batch "
            f"{batch}: {why}; the batch-{ref.batch_size} profile is itself {ref.method}"
        )
        save(
            split_published(
                model, device, batch, ref.total_s() * ratio, ref.source, method=method, derived=True, out_dir=None
            )
        )
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m traffic.compute_profiles.generate", description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default=str(DATA_DIR), help=f"where to write (default {DATA_DIR})")
    args = ap.parse_args(argv)
    files = generate(args.out_dir)
    print(f"{len(files)} profiles in {args.out_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
