"""Datasets (``workload.dataset``) and the global batches every worker and the reference share.

A dataset is loaded whole into memory as tensors (the datasets used for real-compute runs
are small). Data parallelism follows the usual rule: at iteration ``t`` the *global batch* of
``batch_size * W`` samples is drawn from the training set, and worker ``w`` trains on its
*shard*, rows ``[w*batch_size, (w+1)*batch_size)`` of it. Because the global batches depend
only on the seed, a single process (:mod:`traffic.reference`) can train on exactly the same
data as ``W`` workers together.

``digits`` reads the copy of the UCI handwritten digits that ships inside scikit-learn (no
download) straight from its CSV, so that importing this module and loading the data does not
import scikit-learn (which takes seconds in each of the run's processes).
"""

from __future__ import annotations

import gzip
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

__all__ = ["Dataset", "GlobalBatches", "available_datasets", "load_dataset", "register_dataset"]


@dataclass
class Dataset:
    """A dataset in memory.

    Attributes:
        name: registry name.
        x_train: ``(n_train, *input_shape)`` float32 features.
        y_train: ``(n_train,)`` int64 class labels in ``[0, num_classes)``.
        x_test: ``(n_test, *input_shape)`` float32.
        y_test: ``(n_test,)`` int64.
        num_classes: number of classes.
    """

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one sample (no batch dimension), e.g. ``(64,)``."""
        return tuple(self.x_train.shape[1:])

    @property
    def n_train(self) -> int:
        return int(self.x_train.shape[0])


Loader = Callable[[int], Dataset]
_DATASETS: dict[str, Loader] = {}


def register_dataset(name: str) -> Callable[[Loader], Loader]:
    """Decorator: register ``loader(seed) -> Dataset`` as ``name``."""

    def deco(fn: Loader) -> Loader:
        _DATASETS[name] = fn
        return fn

    return deco


def available_datasets() -> list[str]:
    """Names of every registered dataset, sorted."""
    return sorted(_DATASETS)


def load_dataset(name: str, seed: int = 0) -> Dataset:
    """Load dataset ``name`` with its train/test split drawn from ``seed``.

    Raises:
        KeyError: unknown ``name`` (the spec validation reports it first as a SpecError).
        FileNotFoundError: the dataset's files are missing from the installation.
    """
    if name not in _DATASETS:
        raise KeyError(f"unknown dataset {name!r}; available: {', '.join(available_datasets())}")
    return _DATASETS[name](seed)


def split_standardize(
    name: str, x: np.ndarray, y: np.ndarray, num_classes: int, seed: int, test_fraction: float = 0.2
) -> Dataset:
    """Shuffle-split ``(x, y)`` into train/test by ``seed`` and standardize each feature.

    ``x``: ``(n, *shape)``; the mean and standard deviation come from the training rows
    only (a constant feature gets std 1). ``ceil(n * test_fraction)`` rows go to the test set
    (as scikit-learn's ``train_test_split``).
    """
    n = len(x)
    perm = np.random.default_rng([seed, 0x5D]).permutation(n)
    n_test = int(np.ceil(n * test_fraction))
    test, train = perm[:n_test], perm[n_test:]
    x = x.astype(np.float64)
    mean = x[train].mean(axis=0)
    std = x[train].std(axis=0)
    std[std == 0] = 1.0
    x = ((x - mean) / std).astype(np.float32)
    y = y.astype(np.int64)
    return Dataset(
        name,
        torch.from_numpy(x[train].copy()),
        torch.from_numpy(y[train].copy()),
        torch.from_numpy(x[test].copy()),
        torch.from_numpy(y[test].copy()),
        num_classes,
    )


def _sklearn_data_file(fname: str) -> Path:
    """Path of a file in ``sklearn/datasets/data`` without importing scikit-learn."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("scikit-learn is not installed (pip install scikit-learn)")
    return Path(list(spec.submodule_search_locations)[0]) / "datasets" / "data" / fname


@register_dataset("digits")
def digits(seed: int) -> Dataset:
    """UCI handwritten digits as in ``sklearn.datasets.load_digits``: 1797 8x8 images, 10 classes.

    Features: 64 pixel intensities (0..16), standardized. Split 80/20: 1437 train, 360 test.
    """
    x, y = digits_raw()
    return split_standardize("digits", x, y, 10, seed)


def digits_raw() -> tuple[np.ndarray, np.ndarray]:
    """The digits as ``sklearn.datasets.load_digits(return_X_y=True)`` gives them:
    ``x`` ``(1797, 64)`` float64 in 0..16, ``y`` ``(1797,)`` int in 0..9."""
    path = _sklearn_data_file("digits.csv.gz")
    if path.is_file():
        with gzip.open(path, "rt") as f:
            raw = np.loadtxt(f, delimiter=",")
        return raw[:, :-1], raw[:, -1].astype(int)
    from sklearn.datasets import load_digits  # layout changed in some version: use its loader

    return load_digits(return_X_y=True)


class GlobalBatches:
    """Deterministic global batches and per-worker shards.

    The training set is read as an endless stream: epoch ``e`` is a permutation of the
    ``n_train`` rows drawn from ``(seed, e)``, epochs follow one another, and global batch
    ``t`` is stream positions ``[t*B, (t+1)*B)`` with ``B = batch_size * workers``. No sample
    is dropped; a batch may span two epochs, and ``B`` may exceed ``n_train``.

    Args:
        dataset: the dataset (its training part is used).
        batch_size: samples per worker per iteration (``workload.batch_size``).
        workers: number of workers ``W``.
        seed: shuffling seed (``workload.seed``).

    Raises:
        ValueError: ``batch_size`` or ``workers`` < 1, or an empty training set.
    """

    def __init__(self, dataset: Dataset, batch_size: int, workers: int, seed: int):
        if batch_size < 1 or workers < 1:
            raise ValueError(f"batch_size ({batch_size}) and workers ({workers}) must be >= 1")
        if dataset.n_train < 1:
            raise ValueError(f"dataset {dataset.name!r} has no training samples")
        self.dataset = dataset
        self.batch_size = batch_size
        self.workers = workers
        self.seed = seed
        self.global_size = batch_size * workers
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        p = self._perms.get(epoch)
        if p is None:
            if len(self._perms) > 4:
                self._perms.clear()
            p = np.random.default_rng([self.seed, 0xB7, epoch]).permutation(self.dataset.n_train)
            self._perms[epoch] = p
        return p

    def epoch_of(self, it: int) -> float:
        """Epochs completed at the start of iteration ``it`` (fractional)."""
        return it * self.global_size / self.dataset.n_train

    def indices(self, it: int) -> torch.Tensor:
        """Training-set rows of global batch ``it``: int64 ``(batch_size * workers,)``.

        Raises:
            ValueError: ``it`` < 0.
        """
        if it < 0:
            raise ValueError(f"iteration must be >= 0, got {it}")
        n = self.dataset.n_train
        pos = np.arange(it * self.global_size, (it + 1) * self.global_size)
        epochs, offsets = np.divmod(pos, n)
        out = np.empty(len(pos), dtype=np.int64)
        for e in np.unique(epochs):
            sel = epochs == e
            out[sel] = self._perm(int(e))[offsets[sel]]
        return torch.from_numpy(out)

    def global_batch(self, it: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Global batch ``it``: ``x`` ``(B, *input_shape)`` float32, ``y`` ``(B,)`` int64."""
        idx = self.indices(it)
        return self.dataset.x_train[idx], self.dataset.y_train[idx]

    def shard(self, it: int, worker: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Worker ``worker``'s part of global batch ``it``: rows ``[w*b, (w+1)*b)``.

        Returns ``x`` ``(batch_size, *input_shape)``, ``y`` ``(batch_size,)``.

        Raises:
            ValueError: ``worker`` not in ``[0, workers)``.
        """
        if not 0 <= worker < self.workers:
            raise ValueError(f"worker index {worker} not in [0, {self.workers})")
        idx = self.indices(it)[worker * self.batch_size : (worker + 1) * self.batch_size]
        return self.dataset.x_train[idx], self.dataset.y_train[idx]
