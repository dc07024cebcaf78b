"""The baselines' building blocks equal their textbook definitions, written out in NumPy."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from training.models import DLinearConfig, NLinearConfig, build_model
from training.models.layers.attention import (
    ProbSparseSelfAttention,
    SequenceSelfAttention,
    TokenSelfAttention,
)
from training.models.layers.core import device_elu
from training.models.layers.time_axis import moving_average_matrix, patch_matrix, sinusoidal_table


def _randomise(layer_or_model: keras.layers.Layer, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for weight in layer_or_model.weights:
        weight.assign(rng.normal(0.0, 0.4, weight.shape).astype("float32"))


@pytest.mark.parametrize(("length", "kernel"), [(30, 25), (10, 25), (7, 3), (5, 1)])
def test_moving_average_pads_by_repeating_the_edges(length: int, kernel: int) -> None:
    x = np.random.default_rng(0).normal(size=length)
    half = (kernel - 1) // 2
    padded = np.concatenate([np.full(half, x[0]), x, np.full(half, x[-1])])
    expected = np.array([padded[t : t + kernel].mean() for t in range(length)])
    np.testing.assert_allclose(x @ moving_average_matrix(length, kernel), expected, atol=1e-5)


def test_moving_average_kernel_must_be_odd() -> None:
    with pytest.raises(ValueError, match="odd"):
        moving_average_matrix(10, 4)


@pytest.mark.parametrize(("length", "patch", "stride", "count"), [(360, 16, 8, 45), (32, 16, 8, 4)])
def test_patches_follow_patchtst(length: int, patch: int, stride: int, count: int) -> None:
    x = np.arange(length, dtype=np.float32)
    matrix, patches = patch_matrix(length, patch, stride)
    assert patches == count
    padded = np.concatenate([x, np.full(stride, x[-1])])
    expected = np.stack([padded[i * stride : i * stride + patch] for i in range(count)])
    np.testing.assert_array_equal((x @ matrix).reshape(count, patch), expected)


def test_sinusoidal_table_matches_the_formula() -> None:
    table = sinusoidal_table(50, 8)
    position, pair = 17, 2
    angle = position / 10000 ** (2 * pair / 8)
    assert table[position, 2 * pair] == pytest.approx(np.sin(angle), abs=1e-6)
    assert table[position, 2 * pair + 1] == pytest.approx(np.cos(angle), abs=1e-6)


def test_device_elu_is_elu() -> None:
    x = np.linspace(-12.0, 6.0, 401).astype("float32")
    np.testing.assert_allclose(
        np.asarray(device_elu(x)), np.where(x > 0, x, np.expm1(x)), atol=2e-6
    )


def test_dlinear_equals_its_literal_decomposition() -> None:
    model = build_model(DLinearConfig(moving_average=5), 20, 2, input_scale=10.0)
    _randomise(model, 1)
    layer = model.get_layer("decomposed_linear")
    x = np.random.default_rng(2).normal(10.0, 4.0, size=(6, 20, 2)).astype("float32")
    scaled = x / 10.0
    trend = np.einsum("bnc,nm->bmc", scaled, moving_average_matrix(20, 5))
    remainder = scaled - trend
    expected = (
        np.einsum("bnc,nc->b", remainder, layer.seasonal.numpy())
        + np.einsum("bnc,nc->b", trend, layer.trend.numpy())
        + layer.bias.numpy()[0]
    ) * 10.0
    np.testing.assert_allclose(np.asarray(model(x))[:, 0], expected, rtol=1e-5, atol=1e-4)


def test_nlinear_sees_only_shapes_and_adds_the_newest_reading_back() -> None:
    model = build_model(NLinearConfig(), 12, 1, input_scale=10.0)
    _randomise(model, 3)
    x = np.random.default_rng(4).normal(20.0, 3.0, size=(5, 12)).astype("float32")
    shifted = x + 7.0  # same shape, higher level: the output moves by exactly the shift
    np.testing.assert_allclose(
        np.asarray(model(shifted)), np.asarray(model(x)) + 7.0, rtol=1e-5, atol=1e-4
    )


def test_sequence_attention_equals_token_attention() -> None:
    tokens = np.random.default_rng(5).normal(size=(3, 30, 8)).astype("float32")
    token, sequence = TokenSelfAttention(8, 2), SequenceSelfAttention(8, 2)
    token.build((None, 30, 8))
    sequence.build((None, 30, 8))
    _randomise(token, 6)
    sequence.set_weights(token.get_weights())
    np.testing.assert_allclose(
        np.asarray(sequence(tokens)), np.asarray(token(tokens)), rtol=1e-5, atol=1e-5
    )


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def informer_reference(layer: ProbSparseSelfAttention, tokens: np.ndarray) -> np.ndarray:
    """ProbSparse attention as in the Informer paper, with M over all keys and exact top-u."""

    def project(dense: keras.layers.Layer, v: np.ndarray) -> np.ndarray:
        return v @ dense.kernel.numpy() + dense.bias.numpy()

    q, k, v = (project(dense, tokens) for dense in (layer.query, layer.key, layer.value))
    length, heads = tokens.shape[1], layer.heads
    width = layer.d_model // heads
    active = min(length, layer.factor * int(np.ceil(np.log(length))))
    mixed = np.empty_like(q)
    for b in range(tokens.shape[0]):
        for h in range(heads):
            part = slice(h * width, (h + 1) * width)
            scores = q[b, :, part] @ k[b, :, part].T / np.sqrt(width)  # [L_q, L_k]
            sparsity = scores.max(axis=1) - scores.mean(axis=1)
            top = np.argsort(-sparsity)[:active]
            mixed[b, :, part] = v[b, :, part].mean(axis=0)
            mixed[b, top, part] = _softmax(scores[top]) @ v[b, :, part]
    return project(layer.output_dense, mixed)


@pytest.mark.parametrize("length", [40, 12])
def test_probsparse_attention_equals_informer(length: int) -> None:
    layer = ProbSparseSelfAttention(8, 2, factor=2, selection="exact")
    layer.build((None, length, 8))
    _randomise(layer, 7)
    tokens = np.random.default_rng(8).normal(size=(3, length, 8)).astype("float32")
    expected = informer_reference(layer, tokens.astype(np.float64))
    np.testing.assert_allclose(np.asarray(layer(tokens)), expected, rtol=1e-4, atol=1e-4)
    if length == 40:  # u = 2·ceil(ln 40) = 8 of 40: lazy queries really get mean(V)
        assert layer.active_queries == 8


def test_probsparse_ramp_equals_exact_when_queries_are_well_separated() -> None:
    exact = ProbSparseSelfAttention(8, 2, factor=1, selection="exact")
    ramp = ProbSparseSelfAttention(8, 2, factor=1, selection="ramp")
    for layer in (exact, ramp):
        layer.build((None, 16, 8))
    _randomise(exact, 9)
    ramp.set_weights(exact.get_weights())
    tokens = np.random.default_rng(10).normal(size=(4, 16, 8)).astype("float32")
    np.testing.assert_allclose(
        np.asarray(ramp(tokens)), np.asarray(exact(tokens)), rtol=1e-4, atol=1e-4
    )


@pytest.mark.parametrize(
    "layer",
    [
        SequenceSelfAttention(8, 2),
        ProbSparseSelfAttention(8, 2, factor=2, selection="exact"),
        ProbSparseSelfAttention(8, 2, factor=1, selection="ramp"),
    ],
    ids=["sequence", "probsparse-exact", "probsparse-ramp"],
)
def test_batched_form_equals_portable_form(layer: keras.layers.Layer) -> None:
    # Only the batch-1 device graph takes the portable form; everything else batched matmuls.
    layer.build((None, 40, 8))
    _randomise(layer, 11)
    tokens = np.random.default_rng(12).normal(size=(3, 40, 8)).astype("float32")
    batched = np.asarray(layer(tokens))
    portable = np.concatenate([np.asarray(layer(tokens[i : i + 1])) for i in range(3)])
    np.testing.assert_allclose(batched, portable, rtol=1e-4, atol=1e-4)
    assert layer.portable


def test_every_layer_family_registers_its_layers_for_loading() -> None:
    """A saved run names its layers as tesla>Class: each family module must register them."""
    import importlib
    import inspect

    families = ("attention", "binning", "core", "encoder", "norm", "time_axis")
    seen: set[str] = set()
    for family in families:
        module = importlib.import_module(f"training.models.layers.{family}")
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isclass(value) and issubclass(value, keras.layers.Layer):
                assert keras.saving.get_registered_object(f"tesla>{name}") is value
                seen.add(name)
    assert {"BinnedEmbedding", "TokenSelfAttention", "EncoderBlock", "TimeMix"} <= seen
