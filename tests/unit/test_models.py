"""The model zoo: parameter counts against the papers, CONV/FC split, shapes, example inputs, API.

Big ImageNet models are built on the meta device (no memory, no initialisation); only small
models and ResNet-18 / Inception-v3 at batch 1-2 run for real.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from traffic.models import LayeredModel, available_models, build_model, model_info, model_output_shape, register_model
from traffic.models.base import _MODELS

# name -> parameters the papers (or our documented choice) give; each must match within 1%
PAPER_PARAMS = {
    "alexnet": 61.1e6,  # Stanza Table 1
    "vgg16": 138e6,  # Stanza Table 1
    "vgg19": 143e6,  # Stanza Table 1, iBatch Table 1
    "vgg19_22k": 229e6,  # iBatch Table 1 (VGG19-22K on ImageNet22K)
    "vgg16_cifar10": 33.6e6,  # Stanza Table 5
    "resnet18": 11.7e6,  # PHub Table 3 (45 MB)
    "resnet50": 25.6e6,  # standard
    "resnet152": 60.2e6,  # Stanza Table 1
    "inception_v3": 27e6,  # Stanza Table 1, iBatch Table 1 (with the aux classifier)
    "googlenet": 6.6e6,  # torchvision's definition (iBatch's framework: 5M)
    "mnist_mlp": 0.65e6,  # Pipe-SGD §4: 784-500-500-10
    "cifar100_alexnet": 151_428,  # Pipe-SGD §4 / [32]: 3 conv + 2 FC (our reading of [32])
    "stanza_mlp": 8_435_722,  # Stanza Table 7: 3072-1024-1024-4096-10
    "sockeye_lstm": 54_638_384,  # P3 §5, sizes documented in traffic/models/seq2seq.py
    "digits_mlp": 301_066,
    "digits_cnn": 71_754,  # the Stanza accuracy check's small CNN (traffic/models/cnn.py)
}
CONV_MODELS = [
    "alexnet",
    "vgg16",
    "vgg19",
    "vgg19_22k",
    "vgg16_cifar10",
    "resnet18",
    "resnet50",
    "resnet152",
    "inception_v3",
    "googlenet",
    "cifar100_alexnet",
    "digits_cnn",
]
SMALL = ["digits_mlp", "digits_cnn", "mnist_mlp", "stanza_mlp", "cifar100_alexnet", "vgg16_cifar10", "sockeye_lstm"]
POOLS = (nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d)
FC_TYPES = (nn.Linear, nn.ReLU, nn.Dropout, nn.Flatten, nn.Sequential)


def _aux_free_modules(layer: nn.Module):
    """The layer's modules, without auxiliary classifier heads (Inception-v3's AuxLogits)."""
    skip = set()
    for m in layer.modules():
        if hasattr(m, "aux_logits") and hasattr(m, "aux"):
            skip.update(id(s) for s in m.aux.modules())
    return [m for m in layer.modules() if id(m) not in skip]


@pytest.fixture(scope="module")
def meta_models():
    return {n: build_model(n, 0, device="meta") for n in available_models()}


def test_every_model_of_the_table_is_registered():
    assert set(PAPER_PARAMS) <= set(available_models())


@pytest.mark.parametrize("name", sorted(PAPER_PARAMS))
def test_parameter_count_matches_the_paper(name, meta_models):
    m = meta_models[name]
    n = m.num_params()
    assert abs(n - PAPER_PARAMS[name]) <= 0.01 * PAPER_PARAMS[name], f"{name}: {n:,} vs {PAPER_PARAMS[name]:,.0f}"
    assert model_info(name)["num_params"] == n
    assert all(p.device.type == "meta" for p in m.parameters())


def test_exact_counts_of_the_reference_definitions(meta_models):
    # torchvision's counts of the same definitions
    exact = {
        "alexnet": 61_100_840,
        "vgg16": 138_357_544,
        "vgg19": 143_667_240,
        "resnet18": 11_689_512,
        "resnet50": 25_557_032,
        "resnet152": 60_192_808,
        "inception_v3": 27_161_264,
        "googlenet": 6_624_904,
        "vgg16_cifar10": 33_638_218,
        "mnist_mlp": 648_010,
        "vgg19_22k": 229_052_817,
    }  # vgg19 with fc8 4096 -> 21,841
    assert {n: meta_models[n].num_params() for n in exact} == exact


@pytest.mark.parametrize("name", available_models())
def test_every_layer_owns_parameters_and_info_is_consistent(name, meta_models):
    m = meta_models[name]
    assert isinstance(m, LayeredModel)
    numels = m.layer_numels()
    assert all(n > 0 for n in numels), f"{name}: layers without parameters {numels}"
    assert sum(numels) == m.num_params()
    assert m.param_layers() == sorted(m.param_layers())
    assert len(m.layer_names) == len(m.layers) == len(set(m.layer_names))
    info = model_info(name)
    assert info["layer_numels"] == tuple(numels) and info["num_layers"] == len(m.layers)
    assert info["split_index"] == m.split_index and info["param_bytes"] == 4 * m.num_params()
    assert info["input_shape"] == m.input_shape and info["num_classes"] == m.num_classes
    assert info["description"]


@pytest.mark.parametrize("name", CONV_MODELS)
def test_split_index_is_the_conv_fc_boundary(name, meta_models):
    m = meta_models[name]
    s = m.split_index
    assert s is not None and 0 < s < len(m.layers)
    for i, layer in enumerate(m.layers):
        mods = _aux_free_modules(layer)
        if i < s:
            assert any(isinstance(x, nn.Conv2d) for x in mods), f"{name} layer {i} has no convolution"
            assert not any(isinstance(x, nn.Linear) for x in mods), f"{name} CONV layer {i} has a Linear"
        else:
            assert all(isinstance(x, FC_TYPES) for x in mods), f"{name} FC layer {i}: {[type(x) for x in mods]}"
            assert any(isinstance(x, nn.Linear) for x in mods)
    # the CONV part ends with the last pooling after the last convolution
    last = [x for x in _aux_free_modules(m.layers[s - 1]) if not isinstance(x, (nn.Sequential, nn.ModuleList))]
    convs = [i for i, x in enumerate(last) if isinstance(x, nn.Conv2d)]
    pools = [i for i, x in enumerate(last) if isinstance(x, POOLS)]
    assert pools and pools[-1] > convs[-1], f"{name}: CONV part does not end with a pooling"


def test_split_of_the_mlps_and_the_seq2seq(meta_models):
    assert meta_models["digits_mlp"].split_index is None
    assert meta_models["mnist_mlp"].split_index is None
    assert meta_models["sockeye_lstm"].split_index is None
    m = meta_models["stanza_mlp"]  # Stanza Table 7: separated after the second hidden layer
    assert m.split_index == 2
    assert [
        layer[0].out_features if isinstance(layer, nn.Sequential) else layer.out_features for layer in m.layers
    ] == [1024, 1024, 4096, 10]


def test_paper_facts(meta_models):
    # Stanza §3: AlexNet's last pooling layer gives 9,216 activations per sample
    a = meta_models["alexnet"]
    x = a.example_input(2)
    for layer in a.layers[: a.split_index]:
        x = layer(x)
    assert x[0].numel() == 9216
    # P3 §3: VGG-19's fc6 holds 71.5% of the parameters
    v = meta_models["vgg19"]
    assert round(v.layer_numels()[v.split_index] / v.num_params(), 3) == 0.715
    # iBatch: VGG19-22K is VGG-19 with a classifier over ImageNet22K's 21,841 categories
    w = meta_models["vgg19_22k"]
    assert w.layer_numels()[:-1] == v.layer_numels()[:-1] and w.layer_numels()[-1] == 4096 * 21841 + 21841
    # P3 §5: Sockeye's heaviest layer is the first one
    s = meta_models["sockeye_lstm"].layer_numels()
    assert s.index(max(s)) == 0
    # Stanza Table 5: VGG-16 on CIFAR-10 sends 512 activations per sample to the FC worker
    c = meta_models["vgg16_cifar10"]
    assert c.layers[c.split_index][1].in_features == 512


@pytest.mark.parametrize("name", [n for n in PAPER_PARAMS if n not in SMALL])
def test_big_models_forward_on_meta(name, meta_models):
    m = meta_models[name].train()
    x = m.example_input(2)
    assert x.device.type == "meta" and x.shape == (2, *model_info(name)["input_shape"])
    assert m(x).shape == (2, m.num_classes)


@pytest.mark.parametrize("name", SMALL)
def test_small_models_forward_and_backward_for_real(name):
    m = build_model(name, 0)
    x = m.example_input(2)
    y = m.example_target(2)
    out = m(x)
    assert out.shape == (2, *model_output_shape(name))
    loss = m.loss(out, y)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None for p in m.parameters())
    h = x
    for layer in m.layers:  # forward is the layers in order
        h = layer(h)
    if name != "vgg16_cifar10":  # the others have no dropout: same values
        torch.testing.assert_close(h, out)


def test_resnet18_forward_for_real_at_batch_1():
    m = build_model("resnet18", 1).eval()
    with torch.no_grad():
        assert m(m.example_input(1)).shape == (1, 1000)


def test_inception_aux_head_trains_and_keeps_every_layer_on_the_gradient_path():
    m = build_model("inception_v3", 0, num_classes=10)
    x, y = m.example_input(2), m.example_target(2)
    out = m(x)
    assert out.shape == (2, 10) and len(m._aux) == 1 and m._aux[0].shape == (2, 10)
    # a plain cross-entropy (as the trainer computes it) reaches every parameter
    F.cross_entropy(out, y).backward()
    aux = m.layers[12].aux
    assert all(p.grad is not None for p in m.parameters())
    assert all(float(p.grad.abs().sum()) == 0 for p in aux.parameters())
    m.zero_grad()
    out = m(x)
    loss = m.loss(out, y)
    torch.testing.assert_close(loss, F.cross_entropy(out, y) + 0.4 * F.cross_entropy(m._aux[0], y))
    loss.backward()
    assert float(aux.fc.weight.grad.abs().sum()) > 0
    m.eval()
    with torch.no_grad():
        assert m(x[:1]).shape == (1, 10) and m._aux == []


def test_example_input_shapes_dtypes_and_determinism():
    rng = torch.get_rng_state()
    m = build_model("mnist_mlp", 0)
    x = m.example_input(3)
    assert x.shape == (3, 784) and x.dtype == torch.float32 and x.device.type == "cpu"
    assert torch.equal(x, m.example_input(3))
    assert m.example_target(3).shape == (3,) and m.example_target(3).dtype == torch.long
    s = build_model("sockeye_lstm", 0, device="meta")
    info = model_info("sockeye_lstm")
    assert info["input_dtype"] == torch.long and info["input_high"] == 50_000
    assert model_output_shape("sockeye_lstm") == (50, 30_000)
    t = s.example_input(4)
    assert t.shape == (4, 50) and t.dtype == torch.long and t.device.type == "meta"
    tc = s.example_input(4, device="cpu")
    assert tc.device.type == "cpu" and 0 <= int(tc.min()) and int(tc.max()) < 50_000
    assert s.example_target(4).shape == (4, 50)
    assert torch.equal(torch.get_rng_state(), rng), "example inputs must not touch the global RNG"
    with pytest.raises(ValueError, match="input_shape"):
        LayeredModel([nn.Linear(2, 2)]).example_input(1)


def test_seq2seq_loss_is_cross_entropy_over_flattened_tokens():
    m = LayeredModel([nn.Embedding(7, 4), nn.Linear(4, 5)])
    x = torch.randint(0, 7, (2, 3))
    y = torch.randint(0, 5, (2, 3))
    out = m(x)
    assert out.shape == (2, 3, 5)
    torch.testing.assert_close(m.loss(out, y), F.cross_entropy(out.reshape(6, 5), y.reshape(6)))


def test_build_model_defaults_overrides_and_compatibility():
    info = model_info("vgg16_cifar10")
    assert info["input_shape"] == (3, 32, 32) and info["num_classes"] == 10 and info["split_index"] == 13
    assert info["input_dtype"] == torch.float32 and info["input_high"] is None
    # explicit shapes win over the native ones
    m = build_model("vgg16_cifar10", 0, num_classes=100, device="meta")
    assert m(m.example_input(2)).shape == (2, 100)
    m = build_model("mnist_mlp", 0, (1, 28, 28))
    assert m.input_shape == (1, 28, 28) and m(m.example_input(2)).shape == (2, 10)
    # the positional call (name, seed, input shape, classes) gives the defaults' model, deterministically
    a, b = build_model("cifar100_alexnet", 5, (3, 32, 32), 100), build_model("cifar100_alexnet", 5)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    with pytest.raises(KeyError, match="unknown model"):
        model_info("no_such_model")

    @register_model("_no_native")
    def _no_native(input_shape, num_classes):
        """A model without native shapes."""
        return LayeredModel([nn.Linear(input_shape[0], num_classes)])

    try:
        with pytest.raises(ValueError, match="native"):
            build_model("_no_native", 0)
        assert build_model("_no_native", 0, (3,), 2).num_params() == 8
    finally:
        _MODELS.pop("_no_native")
