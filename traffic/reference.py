"""Single-process reference training: what the distributed schemes must reproduce.

:func:`reference_train` trains one model on the *global* batches of a run (the
``batch_size * W`` samples the ``W`` workers share at each iteration, see
:class:`traffic.data.GlobalBatches`), from the same initial parameters (``workload.seed``)
with the same optimizer (:func:`traffic.runtime.trainer.make_optimizer`). The loss is the
mean cross entropy over the global batch, which equals the mean of the workers' local mean
losses, so a correct synchronous scheme (``ps``, ``allreduce``) ends with the same
parameters up to floating-point rounding.
"""

from __future__ import annotations

import torch

from traffic.data import GlobalBatches, load_dataset
from traffic.models import LayeredModel, build_model
from traffic.runtime.trainer import evaluate, make_optimizer

__all__ = ["reference_train", "reference_model", "reference_accuracy"]


def reference_model(workload, workers: int, iterations: int | None = None) -> LayeredModel:
    """Train as :func:`reference_train` and return the trained model itself.

    Args:
        workload: a ``testbed.spec.WorkloadSpec`` (model, dataset, seed, batch_size,
            optimizer, iterations).
        workers: ``W``, the number of workers whose global batch is emulated (the run's
            worker count: ``workload.workers`` may be 0, meaning "every host").
        iterations: defaults to ``workload.iterations``.

    Raises:
        ValueError: ``workers`` < 1.
        KeyError: unknown model or dataset.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    data = load_dataset(workload.dataset, workload.seed)
    model = build_model(workload.model, workload.seed, data.input_shape, data.num_classes)
    batches = GlobalBatches(data, workload.batch_size, workers, workload.seed)
    opt = make_optimizer(model.parameters(), workload.optimizer)
    for it in range(workload.iterations if iterations is None else iterations):
        x, y = batches.global_batch(it)
        opt.zero_grad(set_to_none=True)
        model.loss(model(x), y).backward()
        opt.step()
    return model


def reference_train(workload, workers: int, iterations: int | None = None) -> dict[str, torch.Tensor]:
    """Final state dict (parameter name -> tensor of the parameter's shape) after training
    ``iterations`` global batches in one process (arguments as :func:`reference_model`)."""
    return {k: v.detach().clone() for k, v in reference_model(workload, workers, iterations).state_dict().items()}


def reference_accuracy(workload, workers: int, iterations: int | None = None) -> tuple[float, float]:
    """Test accuracy in [0, 1] and mean test loss of the reference model."""
    model = reference_model(workload, workers, iterations)
    data = load_dataset(workload.dataset, workload.seed)
    return evaluate(model, data.x_test, data.y_test)
