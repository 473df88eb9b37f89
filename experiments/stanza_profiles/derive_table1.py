"""Derive the upper end of Stanza's compute band from the paper's own Table 1.

The shipped V100 profiles (``alexnet-v100-b128.json``, ``vgg16-v100-b64.json``,
``vgg19-v100-b64.json``, written by ``derive_batch.py``) are PHub's
GTX 1080 Ti times (PHub Table 3) scaled by the two GPUs' peak FP32 ratio and by batch
size: the *lower* end of the band. Stanza's Table 1 (Stanza Sec. 2.2) gives, for its
PyTorch PS with 4 workers and 1 server on p3.2xlarge (Tesla V100, 10 Gbit/s), the measured
time per iteration and the communication time "estimated by dividing total data size over
10G". The PS overlaps nothing, so measured minus estimated communication is the time a worker
spends on everything that is not the 10 Gbit/s transfer: compute, the server's update, the
framework's overheads, and the gap between 10 Gbit/s and the rate TCP reaches. It is an
*upper* bound on compute: the profiles written here scale every layer of the lower-end
profile by (measured - estimated) / (the lower-end profile's total), keeping its per-layer
shape (the FLOP split of PHub's figure).

    Table 1 (per-worker batch from Table 5)   measured   estimated comm.   residual
    AlexNet, batch 128                        1.99 s     1.56 s            0.43 s
    VGG-16,  batch 64                         4.93 s     3.53 s            1.40 s
    VGG-19,  batch 64                         5.15 s     3.66 s            1.49 s

Usage (from the repository root; never overwrites)::

    .venv/bin/python experiments/stanza_profiles/derive_table1.py
"""

from __future__ import annotations

from pathlib import Path

from traffic.compute_profiles.profile import Profile, load_profile

HERE = Path(__file__).resolve().parent

TABLE1 = {  # model: (lower-end profile file, batch (Table 5), measured s, estimated communication s)
    "alexnet": ("alexnet-v100-b128.json", 128, 1.99, 1.56),
    "vgg16": ("vgg16-v100-b64.json", 64, 4.93, 3.53),
    "vgg19": ("vgg19-v100-b64.json", 64, 5.15, 3.66),
}

SOURCE = (
    'Stanza (Wu et al., "Stanza: Layer Separation for Distributed Training in Deep Learning"), '
    "Table 1 (Sec. 2.2): PyTorch PS, 4 workers and 1 server, p3.2xlarge (Tesla V100, 10 Gbit/s); "
    '"Training time results are averaged over 100 iterations"; "Comm. time is estimated by '
    'dividing total data size over 10G"'
)


def derive(model: str) -> Profile:
    """The Table-1 profile of ``model`` (``alexnet``, ``vgg16`` or ``vgg19``): the lower-end profile
    scaled so that its forward+backward total equals Table 1's measured minus estimated
    communication time (seconds per batch)."""
    name, batch, measured, comm = TABLE1[model]
    low = load_profile(str(HERE / name), model, batch)
    residual = measured - comm
    factor = residual / low.total_s()
    method = (
        f"derived: {name} x {factor:.4f} = (Table 1 measured {measured} s - estimated "
        f"communication {comm} s) / that profile's total {low.total_s():.4f} s; an upper bound "
        "on compute (the residual also holds the PS server's update and framework overheads)"
    )
    return low.scaled(factor, "v100table1", method, source=SOURCE)


def main() -> None:
    for model in TABLE1:
        p = derive(model)
        target = HERE / f"{model}-v100table1-b{p.batch_size}.json"
        kept = p.save_new(target) is None
        print(f"{target}: " + ("exists, kept" if kept else f"total {p.total_s():.4f} s per batch"))


if __name__ == "__main__":
    main()
