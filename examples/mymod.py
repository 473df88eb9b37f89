"""A scheme of your own, outside the testbed's repository (docs/schemes.md: "Writing a scheme").

PYTHONPATH=examples testbed run experiments/quickstart.yaml --set workload.scheme=mymod:MyAllreduce
"""

import torch
from pydantic import Field

from traffic import schemes

AllReduce = schemes.get("allreduce")


class MyAllreduce(AllReduce):
    """Ring allreduce of the gradients, then clipping of their L2 norm, then the SGD step."""

    class Options(AllReduce.Options):
        clip_norm: float = Field(1.0, gt=0)
        """Largest L2 norm of the averaged gradient."""

    def step(self, it: int) -> None:
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.opts.clip_norm)
        self.ctx.events.instant("clip", iteration=it, norm=float(norm))
        super().step(it)
