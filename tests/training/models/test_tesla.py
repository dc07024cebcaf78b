"""TESLA's folded Keras graph equals the paper's equations written out directly."""

from __future__ import annotations

import numpy as np
import pytest

from training.export import gateway_graph
from training.models import TeslaConfig, build_model
from training.models.bins import membership_matrix
from training.models.layers.attention import TokenSelfAttention


def _layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-6) * gamma + beta


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def paper_forward(model, x: np.ndarray, config: TeslaConfig, scale: float) -> np.ndarray:
    """Eq. 1-5 of the paper, unfolded: per-position embeddings, weighted bins, standard MHA."""
    emb = model.get_layer("binned_embedding")
    w_local = emb.w_local.numpy()[0]  # [d]
    w_global = emb.w_global.numpy()  # [N, d]
    position_w = emb.position_weight.numpy()  # [N]
    bias = emb.bin_bias.numpy()  # [z, d]
    n = x.shape[1]
    s = x / scale
    e = s[:, :, None] * w_local[None, None, :] + (s @ w_global)[:, None, :]  # [B, N, d]
    membership = membership_matrix(n, config.bins)
    binned = np.einsum("bnd,nz->bzd", e * position_w[None, :, None], membership) + bias
    att = model.get_layer("attention")
    h, d = config.heads, config.d_model
    dk = d // h

    def project(layer, v):
        return v @ layer.kernel.numpy() + layer.bias.numpy()

    q, k, v = (project(layer, binned) for layer in (att.query, att.key, att.value))
    heads = []
    for head in range(h):
        sl = slice(head * dk, (head + 1) * dk)
        scores = np.einsum("bid,bjd->bij", q[..., sl], k[..., sl]) / np.sqrt(dk)
        heads.append(np.einsum("bij,bjd->bid", _softmax(scores), v[..., sl]))
    attended = project(att.output_dense, np.concatenate(heads, -1))
    norm = model.get_layer("layer_norm")
    y = _layer_norm(binned + attended, norm.gamma.numpy(), norm.beta.numpy())
    agg = model.get_layer("aggregator")
    per_token = project(agg.per_token, y)[..., 0]  # [B, z]
    return project(agg.across_tokens, per_token) * scale  # [B, 1]


@pytest.mark.parametrize("n", [12, 64, 360])
def test_folded_graph_equals_paper_formulation(n: int) -> None:
    config = TeslaConfig(d_model=8, heads=4)
    model = build_model(config, n, 1, input_scale=50.0)
    # Random (not initial) weights so every term matters.
    rng = np.random.default_rng(1)
    for weight in model.weights:
        weight.assign(rng.normal(0, 0.3, weight.shape).astype("float32"))
    x = rng.gamma(2.0, 15.0, size=(16, n)).astype("float32")
    folded = np.asarray(model(x))
    reference = paper_forward(model, x.astype(np.float64), config, 50.0)
    np.testing.assert_allclose(folded, reference, rtol=1e-4, atol=1e-4 * np.abs(reference).max())


def test_parameter_count_for_paper_setting() -> None:
    model = build_model(TeslaConfig(d_model=8, heads=4), 360, 1, 100.0)
    # w_local 8 + w_global 360*8 + position 360 + bin bias 9*8 + attention 4*(8*8+8)
    # + layer norm 16 + aggregator (8+1) + (9+1)
    assert model.count_params() == 8 + 2880 + 360 + 72 + 288 + 16 + 9 + 10


def test_ablation_variants_build_and_differ() -> None:
    x = np.random.default_rng(0).gamma(2.0, 15.0, size=(4, 60)).astype("float32")
    outputs = {}
    for name, config in {
        "tesla": TeslaConfig(d_model=8, heads=2),
        "uniform": TeslaConfig(d_model=8, heads=2, bins="uniform"),
        "local_only": TeslaConfig(d_model=8, heads=2, use_global=False),
        "ffn": TeslaConfig(d_model=8, heads=2, aggregator="ffn"),
        "mlp": TeslaConfig(d_model=8, heads=2, aggregator="mlp", ffn_width=4),
    }.items():
        model = build_model(config, 60, 1, 50.0)
        outputs[name] = np.asarray(model(x))
        assert outputs[name].shape == (4, 1)
    assert (
        build_model(TeslaConfig(use_global=False), 60, 1, 1.0).count_params()
        < build_model(TeslaConfig(), 60, 1, 1.0).count_params()
    )


def test_heads_must_divide_width() -> None:
    with pytest.raises(ValueError, match="divisible"):
        build_model(TeslaConfig(d_model=10, heads=4), 12, 1, 1.0)


def test_portable_and_gateway_attention_are_the_same_function() -> None:
    model = build_model(TeslaConfig(d_model=16, heads=4), 360, 1, 80.0)
    rng = np.random.default_rng(4)
    for weight in model.weights:
        weight.assign(rng.normal(0, 0.3, weight.shape).astype("float32"))
    x = rng.gamma(2.0, 15.0, size=(8, 360)).astype("float32")
    portable = np.asarray(model(x))
    with gateway_graph(model):  # attention, LayerNorm and aggregator with the batch axis last
        assert not model.get_layer("layer_norm").portable
        gateway = np.asarray(model(x))
    np.testing.assert_allclose(gateway, portable, rtol=1e-5, atol=1e-4)
    assert model.get_layer("aggregator").portable  # restored for training and the device graph


def test_gateway_attention_is_standard_multi_head_attention() -> None:
    # The gateway form against the textbook batched-matmul form, including scores large
    # enough that exp() would overflow without the max subtracted along the keys.
    layer = TokenSelfAttention(16, 4)
    layer.build((None, 9, 16))
    rng = np.random.default_rng(7)
    for weight in layer.weights:
        weight.assign(rng.normal(0, 0.5, weight.shape).astype("float32"))
    for scale in (1.0, 40.0):
        tokens = (scale * rng.normal(size=(5, 9, 16))).astype("float32")
        q, k, v = layer.query(tokens), layer.key(tokens), layer.value(tokens)
        gateway = np.asarray(layer._gateway_mix(q, k, v))
        textbook = np.asarray(layer._batched_mix(q, k, v))
        assert np.isfinite(gateway).all()
        np.testing.assert_allclose(gateway, textbook, rtol=1e-4, atol=1e-4 * scale**2)
