"""Shared numpy references for the layer tests: written from the math, not from pax_eqx."""

import numpy as np
import pytest


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    x = x - x.max(axis=axis, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def reference_attention(
    x, w_q, w_k, w_v, w_o, *, mask=None, scale=None, logit_cap=0.0, q_scale=None, bias=None, biases=None
):
    """softmax(Q K^T / sqrt(d) [+ bias], masked) V, one head at a time, in float64 numpy.

    x: [B, T, D]; w_q: [D, N, H]; w_k, w_v: [D, K, H] with K dividing N (query head n uses
    kv head n // (N // K)); w_o: [N, H, D]; mask: [B, T, T] booleans (True = may attend);
    q_scale: replaces 1/sqrt(H) by a per-dimension scale on q; biases: (b_q, b_k, b_v, b_o).
    """
    x = np.asarray(x, np.float64)
    w_q, w_k, w_v, w_o = (np.asarray(w, np.float64) for w in (w_q, w_k, w_v, w_o))
    b, t, _ = x.shape
    n, h, kv = w_q.shape[1], w_q.shape[2], w_k.shape[1]
    q = np.einsum("btd,dnh->btnh", x, w_q)
    k = np.einsum("btd,dkh->btkh", x, w_k)
    v = np.einsum("btd,dkh->btkh", x, w_v)
    if biases is not None:
        q, k, v = q + biases[0], k + biases[1], v + biases[2]
    if q_scale is not None:
        q = q * np.asarray(q_scale, np.float64)
        scale = 1.0
    elif scale is None:
        scale = 1.0 / np.sqrt(h)
    out = np.zeros((b, t, n, h))
    for bi in range(b):
        for head in range(n):
            kh = head // (n // kv)
            logits = q[bi, :, head] @ k[bi, :, kh].T * scale  # [T, T]
            if logit_cap:
                logits = logit_cap * np.tanh(logits / logit_cap)
            if bias is not None:
                logits = logits + np.asarray(bias)[bi % bias.shape[0], head % bias.shape[1]]
            if mask is not None:
                logits = np.where(mask[bi], logits, -1e30)
            out[bi, :, head] = softmax(logits) @ v[bi, :, kh]
    y = np.einsum("btnh,nhd->btd", out, w_o)
    if biases is not None:
        y = y + biases[3]
    return y


def causal_mask(b: int, t: int) -> np.ndarray:
    return np.broadcast_to(np.tril(np.ones((t, t), bool)), (b, t, t))


@pytest.fixture
def np_attention():
    return reference_attention


@pytest.fixture
def np_causal_mask():
    return causal_mask
