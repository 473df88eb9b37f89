"""Derive Stanza's V100 compute profiles at the paper's batch sizes from the batch-32 ones.

Stanza trains each network at its own per-worker batch (Stanza Table 5: AlexNet 128, VGG-16 and
VGG-19 64). The V100 profiles that ship are at batch 32 (PHub Table 3's GTX 1080 Ti times
scaled by peak FP32; ``traffic/compute_profiles/data/<model>-v100-b32.json``). The profiles
written here multiply every layer's forward and backward time, and its FLOPs, by batch / 32,
assuming per-layer time linear in batch size (a GPU that is already busy at 32 samples). These
are the *lower* end of the compute band; ``derive_table1.py`` derives the upper end from
Table 1.

Usage (from the repository root; never overwrites)::

    .venv/bin/python experiments/stanza_profiles/derive_batch.py
"""

from __future__ import annotations

from pathlib import Path

from traffic.compute_profiles.profile import LayerProfile, Profile, load_profile

HERE = Path(__file__).resolve().parent

BATCH = {"alexnet": 128, "vgg16": 64, "vgg19": 64}  # Stanza Table 5, per-worker batch
BASE_BATCH = 32


def derive(model: str) -> Profile:
    """The V100 profile of ``model`` at its Stanza Table 5 batch: the shipped batch-32 V100
    profile with every time (seconds per batch) and FLOPs count (per batch) x batch / 32."""
    batch = BATCH[model]
    base = load_profile("v100", model, BASE_BATCH)
    factor = batch // BASE_BATCH
    method = (
        f"derived: v100 batch-32 profile x {factor} (batch {batch}, Stanza Table 5), assuming "
        f"per-layer time linear in batch size; the v100 b32 profile is itself derived ({base.method})"
    )
    return Profile(
        model=model,
        device="v100",
        batch_size=batch,
        source=base.source,
        method=method,
        derived=True,
        layers=[
            LayerProfile(
                l.index,
                l.name,
                l.forward_s * factor,
                l.backward_s * factor,
                _times(l.flops_forward, factor),
                _times(l.flops_backward, factor),
            )
            for l in base.layers
        ],
    )


def _times(flops: float | None, factor: int) -> float | None:
    return None if flops is None else float(flops) * factor


def main() -> None:
    for model in BATCH:
        p = derive(model)
        target = HERE / f"{model}-v100-b{p.batch_size}.json"
        kept = p.save_new(target) is None
        print(f"{target}: " + ("exists, kept" if kept else f"total {p.total_s():.4f} s per batch"))


if __name__ == "__main__":
    main()
