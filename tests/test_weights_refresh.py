"""Weights are never stale, and a loaded model keeps one copy of them.

- ``from_pretrained`` on CPU fp32 (backends ``cpu`` and ``auto``) keeps its linear
  weights only packed (bertfast/ops/cpu/weights.py): the model's tensor bytes stay
  within 1.15x of the checkpoint's, every write to a packed weight raises instead of
  being lost, and the documented route (``unpack_weights()``, edit, ``refresh()``)
  gives the new weights' answer.
- ``optimize()`` reads the user's own parameters at every call: every way of writing
  them is seen by the next call, with no refresh.
- ``torch.inference_mode()`` around loading, running, or both.

Reference: transformers computing with the same (edited) weights, fp32; tolerance
1e-4 (END_TO_END_ATOL) on real tokens (see tests/test_optimize.py for why).
"""

from __future__ import annotations

import copy
import io
import os

import pytest
import torch

import bertfast
from bertfast.ops.cpu import weights as cpu_weights
from bertfast.ops.parity import END_TO_END_ATOL

from .models import build, make_batch, save

ATOL = END_TO_END_ATOL
BACKENDS = ["cpu", "auto"]
WAYS = ["data_setitem", "no_grad_copy_on_view", "numpy_shared_memory", "in_place_op"]


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    hf = build("bert", "base")
    folder = save(hf, str(tmp_path_factory.mktemp("bert")))
    return hf, folder


def _layer(model, i):
    return getattr(model.layers, str(i))


def _ref(hf, batch):
    with torch.no_grad():
        return hf(**batch).last_hidden_state


def _check(out, ref, batch, what):
    mask = batch["attention_mask"].bool()
    diff = (out[mask] - ref[mask]).abs().max().item()
    assert diff <= ATOL, f"{what}: max abs diff {diff:.3g} > {ATOL}"


def _write(way, w, rows, value):
    """Write ``value`` into rows ``rows`` of the weight tensor ``w`` one way."""
    if way == "data_setitem":
        w.data[rows] = value
    elif way == "no_grad_copy_on_view":
        with torch.no_grad():
            w[rows].copy_(value)
    elif way == "numpy_shared_memory":
        arr = w.detach().numpy()  # shares memory with w
        arr[rows] = value.numpy()
    elif way == "in_place_op":
        with torch.no_grad():
            w[rows].mul_(0).add_(value)
    else:
        raise ValueError(way)


def _edits(H):
    g = torch.Generator().manual_seed(5)
    q_rows, ffn_rows = slice(2, 9), slice(10, 40)
    return (
        q_rows,
        torch.randn(7, H, generator=g) * 0.3,
        ffn_rows,
        torch.randn(30, H, generator=g) * 0.3,
    )


def _edit_hf(hf, way):
    """The same edits on the transformers model (query rows of layer 0, FFN-in rows
    of layer 1), always through plain in-place writes on its own parameters."""
    H = hf.config.hidden_size
    q_rows, q_val, f_rows, f_val = _edits(H)
    with torch.no_grad():
        hf.encoder.layer[0].attention.self.query.weight[q_rows] = q_val
        hf.encoder.layer[1].intermediate.dense.weight[f_rows] = f_val


# ------------------------------------------------------------ from_pretrained
def _checkpoint_bytes(folder):
    from safetensors import safe_open

    total = 0
    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
        for key in f.keys():
            t = f.get_tensor(key)
            total += t.numel() * t.element_size()
    return total


@pytest.mark.parametrize("backend", BACKENDS)
def test_loaded_model_keeps_one_packed_copy(bert, backend):
    hf, folder = bert
    model = bertfast.from_pretrained(folder, backend=backend)
    batch = make_batch("bert")
    _check(model(**batch).last_hidden_state, _ref(hf, batch), batch, backend)
    L = _layer(model, 0)
    for name in ("qkv", "attn_out", "ffn_in", "ffn_out"):
        assert cpu_weights.is_packed(getattr(L, name).weight), name
    # after the first forward: nothing cached anywhere, one copy of every weight
    assert model.weight_nbytes() <= 1.15 * _checkpoint_bytes(folder)
    assert not any(
        isinstance(v, dict) and v for k, v in vars(cpu_weights).items() if "cache" in k.lower()
    )


def test_torch_backend_keeps_plain_weights(bert):
    hf, folder = bert
    model = bertfast.from_pretrained(folder, backend="torch")
    assert not cpu_weights.is_packed(_layer(model, 0).qkv.weight)
    assert model.weight_nbytes() <= 1.15 * _checkpoint_bytes(folder)


@pytest.mark.parametrize("way", WAYS)
def test_writes_to_packed_weights_raise(bert, way):
    hf, folder = bert
    model = bertfast.from_pretrained(folder, backend="cpu")
    batch = make_batch("bert")
    before = model(**batch).last_hidden_state
    w = _layer(model, 0).qkv.weight
    with pytest.raises(RuntimeError, match="unpack_weights|subclass"):
        _write(way, w, slice(0, 3), torch.ones(3, w.shape[1]))
    torch.testing.assert_close(model(**batch).last_hidden_state, before, rtol=0, atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("way", WAYS)
def test_loaded_model_documented_edit_route(bert, way, backend):
    hf, folder = bert
    model = bertfast.from_pretrained(folder, backend=backend)
    batch = make_batch("bert")
    model(**batch)  # packed and used once before the edit
    ref_hf = copy.deepcopy(hf)
    _edit_hf(ref_hf, way)
    expected = _ref(ref_hf, batch)

    model.unpack_weights()
    q_rows, q_val, f_rows, f_val = _edits(hf.config.hidden_size)
    _write(way, _layer(model, 0).qkv.weight, q_rows, q_val)  # Q rows of the fused QKV
    _write(way, _layer(model, 1).ffn_in.weight, f_rows, f_val)
    # unpacked: the weights are read as they are at every call
    _check(model(**batch).last_hidden_state, expected, batch, f"{way}, unpacked")
    model.refresh()
    assert cpu_weights.is_packed(_layer(model, 0).qkv.weight)
    _check(model(**batch).last_hidden_state, expected, batch, f"{way}, refreshed")
    assert model.weight_nbytes() <= 1.15 * _checkpoint_bytes(folder)


def test_edit_weights_context_and_load_state_dict(bert):
    hf, folder = bert
    model = bertfast.from_pretrained(folder, backend="cpu")
    batch = make_batch("bert")
    ref_hf = copy.deepcopy(hf)
    _edit_hf(ref_hf, "data_setitem")
    q_rows, q_val, f_rows, f_val = _edits(hf.config.hidden_size)
    with model.edit_weights():
        sd = model.state_dict()
        qkv = sd["layers.0.qkv.weight"].clone()
        qkv[q_rows] = q_val
        ffn = sd["layers.1.ffn_in.weight"].clone()
        ffn[f_rows] = f_val
        model.load_state_dict(
            {"layers.0.qkv.weight": qkv, "layers.1.ffn_in.weight": ffn}, strict=False
        )
    assert cpu_weights.is_packed(_layer(model, 1).ffn_in.weight)
    _check(model(**batch).last_hidden_state, _ref(ref_hf, batch), batch, "edit_weights")


def test_packed_model_reads_copies_and_converts(bert):
    hf, folder = bert
    model = bertfast.from_pretrained(folder, backend="auto")  # auto: fp64 runs on torch
    batch = make_batch("bert")
    expected = _ref(hf, batch)
    # the packed weight reads as the checkpoint's values
    w = _layer(model, 0).attn_out.weight
    torch.testing.assert_close(
        w + 0, hf.encoder.layer[0].attention.output.dense.weight, rtol=0, atol=0
    )
    _check(copy.deepcopy(model)(**batch).last_hidden_state, expected, batch, "deepcopy")
    buf = io.BytesIO()  # saved as the plain weights
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    saved = torch.load(buf)["layers.0.attn_out.weight"]
    assert type(saved) is torch.Tensor and torch.equal(saved, w + 0)
    model.to(torch.float64)  # converted plain (no C++ GEMM in fp64), still right
    assert not cpu_weights.is_packed(_layer(model, 0).qkv.weight)
    _check(model(**batch).last_hidden_state.float(), expected, batch, "float64")
    model.to(torch.float32)
    assert cpu_weights.is_packed(_layer(model, 0).qkv.weight)
    _check(model(**batch).last_hidden_state, expected, batch, "back to fp32")


def test_albert_shared_layers_stay_shared(tmp_path):
    hf = build("albert", "base")
    folder = save(hf, str(tmp_path))
    model = bertfast.from_pretrained(folder, backend="cpu")
    batch = make_batch("albert")
    _check(model(**batch).last_hidden_state, _ref(hf, batch), batch, "albert")
    assert model.weight_nbytes() <= 1.15 * _checkpoint_bytes(folder)


# -------------------------------------------------------------------- optimize
def _optimized(backend):
    hf = build("bert", "base")
    ref = copy.deepcopy(hf)
    return bertfast.optimize(hf, backend=backend, fallback=False), ref


def _write_hf_param(way, model, which, rows, value):
    layer = model.encoder.layer[0 if which == "q" else 1]
    w = layer.attention.self.query.weight if which == "q" else layer.intermediate.dense.weight
    _write(way, w, rows, value)


@pytest.mark.parametrize("pack_rows", [None, 0], ids=["f_linear", "pack_per_call"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("way", WAYS)
def test_optimize_sees_every_write(way, backend, pack_rows, monkeypatch):
    monkeypatch.setattr(cpu_weights, "PACK_MIN_ROWS", pack_rows)
    model, ref = _optimized(backend)
    batch = make_batch("bert")
    _check(_ref(model, batch), _ref(ref, batch), batch, "before")
    q_rows, q_val, f_rows, f_val = _edits(model.config.hidden_size)
    _write_hf_param(way, model, "q", q_rows, q_val)
    _write_hf_param(way, model, "ffn", f_rows, f_val)
    _edit_hf(ref, way)
    _check(_ref(model, batch), _ref(ref, batch), batch, f"optimize {way}")
    # the user's parameters were not copied: no second copy of the linear weights
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert model.base_model._bertfast_state.fast.weight_nbytes() <= 1.15 * params


# --------------------------------------------------------------- inference_mode
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("load_inside,run_inside", [(True, True), (False, True), (True, False)])
def test_inference_mode(bert, backend, load_inside, run_inside):
    hf, folder = bert
    batch = make_batch("bert")
    expected = _ref(hf, batch)
    if load_inside:
        with torch.inference_mode():
            model = bertfast.from_pretrained(folder, backend=backend)
    else:
        model = bertfast.from_pretrained(folder, backend=backend)
    for _ in range(2):  # the second call is where a version-keyed cache failed
        if run_inside:
            with torch.inference_mode():
                out = model(**batch).last_hidden_state
        else:
            out = model(**batch).last_hidden_state
        _check(out, expected, batch, f"inference_mode load={load_inside} run={run_inside}")
    if load_inside:  # the documented edit route works on inference tensors too
        with torch.inference_mode():
            model.unpack_weights()
            model.refresh()
            _check(model(**batch).last_hidden_state, expected, batch, "refresh")


@pytest.mark.parametrize("backend", BACKENDS)
def test_optimize_under_inference_mode(backend):
    model, ref = _optimized(backend)
    batch = make_batch("bert")
    with torch.inference_mode():
        for _ in range(2):
            _check(_ref(model, batch), _ref(ref, batch), batch, "optimize inference_mode")


@pytest.mark.parametrize("way", ["data_rebind", "new_parameter"])
def test_optimize_sees_replaced_parameters(way):
    model, ref = _optimized("auto")
    batch = make_batch("bert")
    _ref(model, batch)
    q_rows, q_val, f_rows, f_val = _edits(model.config.hidden_size)
    for m in (model, ref):
        for layer_idx, mod_name, rows, val in ((0, "q", q_rows, q_val), (1, "f", f_rows, f_val)):
            layer = m.encoder.layer[layer_idx]
            mod = layer.attention.self.query if mod_name == "q" else layer.intermediate.dense
            new = mod.weight.detach().clone()
            new[rows] = val
            if way == "data_rebind" or m is ref:
                mod.weight.data = new
            else:
                mod.weight = torch.nn.Parameter(new, requires_grad=False)
    _check(_ref(model, batch), _ref(ref, batch), batch, f"optimize {way}")
