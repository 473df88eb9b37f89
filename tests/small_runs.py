"""Small specs and profiles that the unit and end-to-end cases share."""

import json

from testbed.spec import Experiment, from_dict


def small_spec(tmp_path, **workload) -> Experiment:
    """A 2 x 2 rack/core network at 50 Mbit/s, a dedicated parameter server, 8 iterations
    (2 of warm-up): the ``workload`` fields given over these; runs under ``tmp_path``."""
    return from_dict(
        {
            "name": "e2e",
            "topology": {
                "kind": "rack_core",
                "racks": 2,
                "hosts_per_rack": 2,
                "host_bw_mbps": 50,
                "oversubscription": 2,
            },
            "workload": {
                "scheme": "ps",
                "iterations": 8,
                "warmup_iterations": 2,
                "batch_size": 16,
                "servers": {"count": 1, "placement": "dedicated", "scope": "global"},
                **workload,
            },
            "run": {"runs_dir": str(tmp_path), "timeout_s": 240},
        }
    )


def write_profile(path, fwd, bwd, model="digits_mlp", batch=32) -> str:
    """Write a compute profile of ``model`` at ``batch`` whose layer i takes ``fwd[i]`` and
    ``bwd[i]`` seconds to ``path``; returns the path."""
    path.write_text(
        json.dumps(
            {
                "model": model,
                "device": "test",
                "batch_size": batch,
                "source": "written by the test",
                "method": "test",
                "derived": False,
                "layers": [
                    {"index": i, "name": f"layer{i}", "forward_s": f, "backward_s": b}
                    for i, (f, b) in enumerate(zip(fwd, bwd))
                ],
            }
        )
    )
    return str(path)
