"""Every route of the CPU GEMM (bertfast/ops/cpu/weights.py) against float64.

Routes: a weight packed for oneDNN (fp32, and bf16), a weight packed in the C++
GEMM's panels (fp32), and a plain weight (torch's GEMM + the C++ epilogue, or packed
for one call from ``PACK_MIN_ROWS`` rows); with and without bias, every activation,
row counts around the C++ GEMM's 64-row blocks and its 8-row micro-tiles, odd
widths. Each result is held to the parity rule of ``harness.py`` (float64 gold,
2x the reference's own error in the same dtype + the per-op atol). Then what
``BERTFAST_CPU_GEMM`` selects, and a loaded model on each route (one copy of the
weights, transformers' answer). Non-finite inputs: tests/ops/test_nonfinite.py.
"""

from __future__ import annotations

import pickle

import pytest
import torch

import bertfast
import bertfast.ops as ops
from bertfast.ops import reference
from bertfast.ops.cpu import weights as cpu_weights
from bertfast.ops.dispatch import get_backend

from .harness import assert_within_rule

pytestmark = pytest.mark.skipif(
    get_backend("cpu").unavailable("cpu") is not None,
    reason="bertfast._C CPU kernels are not built",
)

ONEDNN_BF16 = cpu_weights.ONEDNN and torch.ops.mkldnn._is_mkldnn_bf16_supported()

#: (storage, dtype) of every packed form.
PACKED = [
    pytest.param("own", torch.float32, id="own-fp32"),
    pytest.param(
        "onednn",
        torch.float32,
        id="onednn-fp32",
        marks=pytest.mark.skipif(not cpu_weights.ONEDNN, reason="torch has no oneDNN"),
    ),
    pytest.param(
        "onednn",
        torch.bfloat16,
        id="onednn-bf16",
        marks=pytest.mark.skipif(not ONEDNN_BF16, reason="oneDNN has no bf16 on this CPU"),
    ),
]
ACTS = [None, "gelu", "gelu_tanh", "relu"]
SHAPES = [(1, 48, 70), (8, 48, 70), (63, 37, 33), (64, 64, 64), (65, 96, 1000), (130, 1, 5)]


def _operands(m, k, n, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(dtype)
    b = torch.randn(n, generator=g).to(dtype)
    return x, w, b


def _check(out, x, w, b, act, dtype, what):
    op = "linear" if act is None else "linear_gelu"
    if act is None:
        gold = reference.linear(x.double(), w.double(), None if b is None else b.double())
        same = reference.linear(x, w, b)
    else:
        bias64 = torch.zeros(w.shape[0], dtype=torch.float64) if b is None else b.double()
        bias = torch.zeros(w.shape[0], dtype=dtype) if b is None else b
        gold = reference.linear_gelu(x.double(), w.double(), bias64, act)
        same = reference.linear_gelu(x, w, bias, act)
    assert out.dtype == dtype, what
    assert_within_rule(op, what, out, gold, same, dtype)


def _run(x, w, b, act):
    if act is None:
        return ops.linear(x, w, b, backend="cpu")
    return ops.linear_gelu(x, w, b, act, backend="cpu")


@pytest.mark.parametrize("storage,dtype", PACKED)
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("small_rows", [cpu_weights.SMALL_ROWS, 0], ids=["default", "no_small"])
def test_packed_routes_match_float64(
    storage, dtype, act, with_bias, m, k, n, small_rows, monkeypatch
):
    """``small_rows``: up to ``SMALL_ROWS`` rows an fp32 weight oneDNN holds runs on
    the C++ GEMM reading oneDNN's panels; 0 sends every row count to oneDNN."""
    monkeypatch.setattr(cpu_weights, "SMALL_ROWS", small_rows)
    x, w, b = _operands(m, k, n, dtype, seed=m * 7 + n)
    b = b if with_bias else None
    pw = cpu_weights.PackedWeight.of(w, storage)
    assert pw.storage == storage and pw.dtype == dtype
    assert torch.equal(pw.dense(), w)  # the packed form holds exactly the weight
    _check(_run(x, pw, b, act), x, w, b, act, dtype, f"{storage} {m}x{k}x{n} {act}")
    # [B, S, K] inputs and a non-contiguous x take the same route
    x3 = x.t().contiguous().t().reshape(1, m, k)
    out3 = _run(x3, pw, b, act)
    assert out3.shape == (1, m, n)
    _check(out3[0], x, w, b, act, dtype, f"{storage} 3-D {m}x{k}x{n} {act}")


@pytest.mark.skipif(not cpu_weights.ONEDNN, reason="torch has no oneDNN")
def test_small_rows_read_onednn_panels_in_place():
    """At few rows the C++ GEMM reads the weight oneDNN holds, no second copy: its
    panels are a view of oneDNN's buffer, bit for bit the weight in 64-wide panels."""
    w = torch.randn(1000, 96)
    pw = cpu_weights.PackedWeight.of(w, "onednn")
    if pw._panels is None:
        pytest.skip("oneDNN chose a weight layout other than 64-wide panels on this CPU")
    panels = cpu_weights.packed_for_call(pw, cpu_weights.SMALL_ROWS)
    assert panels.data_ptr() == torch.ops.mkldnn.data_ptr(pw._packed)
    assert torch.equal(cpu_weights.unpack(panels, 1000, 96, panels.shape[2]), w)
    # above SMALL_ROWS: oneDNN at the row counts it is given, the panels at others
    big = cpu_weights.onednn_rows(cpu_weights.SMALL_ROWS + 1)
    assert cpu_weights.packed_for_call(pw, big) is pw._packed
    assert cpu_weights.packed_for_call(pw, big + 1).data_ptr() == panels.data_ptr()
    # a layout that is not the weight's panels is never read as such
    assert not cpu_weights._readable_panels(pw._packed, w.flip(0))


def test_onednn_row_sizes_are_few_and_cover_every_count():
    """oneDNN keeps a buffer per row count it sees, so it is given at most four row
    counts per octave above 8: each count maps to the smallest such size >= it, less
    than 25% above it, and a size maps to itself."""
    sizes = {cpu_weights.onednn_rows(m) for m in range(1, 20001)}
    above = sorted(r for r in sizes if r > 8)
    assert len(above) <= 4 * 12  # 8 .. 32768: twelve octaves
    assert len([r for r in sizes if r <= 64]) <= 8 + 4 * 3
    for m in range(1, 20001):
        r = cpu_weights.onednn_rows(m)
        assert m <= r < max(m * 1.25, m + 1) and cpu_weights.onednn_rows(r) == r
        if m <= 8:
            assert r == m


@pytest.mark.skipif(not cpu_weights.ONEDNN, reason="torch has no oneDNN")
@pytest.mark.parametrize("m", [1, 5, 9, 16, 17, 33, 64, 65, 80, 128, 129, 160])
def test_few_rows_run_on_panels_of_every_weight(m):
    """Up to SMALL_ROWS rows every fp32 weight oneDNN holds, large (3 MiB) or small,
    runs on the C++ GEMM's panels; above, oneDNN at the row counts it is given (160),
    the panels at others (129). Every route equals float64."""
    for n, k in ((64, 128), (1024, 768)):
        x, w, b = _operands(m, k, n, torch.float32, seed=m + n)
        pw = cpu_weights.PackedWeight.of(w, "onednn")
        if pw._panels is None:
            pytest.skip("oneDNN chose a weight layout other than 64-wide panels on this CPU")
        route = cpu_weights.packed_for_call(pw, m)
        want_onednn = m > cpu_weights.SMALL_ROWS and cpu_weights.onednn_rows(m) == m
        assert (route is pw._packed) == want_onednn, (m, n)
        assert route is pw._packed or route.data_ptr() == pw._panels.data_ptr()
        for act in ACTS:
            out = _run(x, pw, b, act)
            assert out.shape == (m, n)
            _check(out, x, w, b, act, torch.float32, f"rows={m} {k}x{n} {act}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_onednn_padded_rows_match_float64(dtype):
    """Row counts between oneDNN's sizes: bf16 pads to the next size, fp32 reads the
    panels (or pads where oneDNN's layout is not panels); the result has the input's
    rows, and equals float64."""
    if not (ONEDNN_BF16 if dtype == torch.bfloat16 else cpu_weights.ONEDNN):
        pytest.skip(f"no oneDNN {dtype} here")
    for m in (65, 81, 130, 3001):
        x, w, b = _operands(m, 64, 128, dtype, seed=m)
        pw = cpu_weights.PackedWeight.of(w, "onednn")
        out = _run(x, pw, b, "gelu")
        assert out.shape == (m, 128)
        _check(out, x, w, b, "gelu", dtype, f"onednn rows={m}")


@pytest.mark.parametrize("pack_rows", [None, 0], ids=["f_linear", "pack_per_call"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("m,k,n", SHAPES[:4])
def test_plain_weight_routes_match_float64(pack_rows, dtype, act, m, k, n, monkeypatch):
    monkeypatch.setattr(cpu_weights, "PACK_MIN_ROWS", pack_rows)
    x, w, b = _operands(m, k, n, dtype, seed=m + n)
    _check(_run(x, w, b, act), x, w, b, act, dtype, f"plain {m}x{k}x{n} {act}")


@pytest.mark.parametrize("storage,dtype", PACKED)
def test_packed_weight_contract(storage, dtype):
    """Read-only, its values seen by torch ops, pickled / deep-copied as the weight."""
    import copy

    _, w, _ = _operands(4, 40, 70, dtype, seed=3)
    pw = cpu_weights.PackedWeight.of(w, storage)
    assert torch.equal(pw + 0, w) and torch.equal(pw[3], w[3]) and torch.equal(pw.t(), w.t())
    with pytest.raises(RuntimeError, match="unpack_weights"):
        pw.mul_(2)
    with pytest.raises(RuntimeError, match="unpack_weights"):
        pw[0].zero_()
    assert torch.equal(pickle.loads(pickle.dumps(pw)), w)
    twin = copy.deepcopy(pw)
    assert isinstance(twin, cpu_weights.PackedWeight) and torch.equal(twin.dense(), w)
    assert pw.dense().data_ptr() != pw.dense().data_ptr()  # a new tensor each time


def test_env_route(monkeypatch):
    for raw, want in (("own", "own"), ("torch", "torch"), (" OWN ", "own"), ("", None)):
        monkeypatch.setenv("BERTFAST_CPU_GEMM", raw)
        expect = want or ("onednn" if cpu_weights.ONEDNN else "own")
        assert cpu_weights._env_route() == expect, raw
    monkeypatch.setenv("BERTFAST_CPU_GEMM", "auto")
    assert cpu_weights._env_route() == ("onednn" if cpu_weights.ONEDNN else "own")
    monkeypatch.setenv("BERTFAST_CPU_GEMM", "mkl")
    with pytest.raises(ValueError, match="BERTFAST_CPU_GEMM='mkl'.*auto, own, onednn, torch"):
        cpu_weights._env_route()
    monkeypatch.setenv("BERTFAST_CPU_GEMM", "onednn")
    if cpu_weights.ONEDNN:
        assert cpu_weights._env_route() == "onednn"
    else:
        with pytest.raises(ValueError, match="no oneDNN"):
            cpu_weights._env_route()


def test_storage_for_each_route(monkeypatch):
    f32, bf16 = torch.float32, torch.bfloat16
    assert cpu_weights.storage_for(f32, "own") == "own"
    assert cpu_weights.storage_for(bf16, "own") == "own"  # the C++ bf16 GEMM's panels
    assert cpu_weights.storage_for(f32, "torch") is None
    assert cpu_weights.storage_for(torch.float16, "onednn") is None
    if cpu_weights.ONEDNN:
        assert cpu_weights.storage_for(f32, "onednn") == "onednn"
        # bf16 on oneDNN only where the CPU has bf16 dot products; else torch's path
        want = "onednn" if cpu_weights.NATIVE_BF16 else None
        assert cpu_weights.storage_for(bf16, "onednn") == want
    # a weight whose oneDNN form would be padded past MAX_PADDING takes own panels.
    # The padding is this CPU's oneDNN's choice (64-wide blocks on the AVX-512 VMs pad a
    # 96-row weight to 128; other layouts may not pad it), asked of oneDNN itself here.
    monkeypatch.setattr(cpu_weights, "ROUTE", "onednn" if cpu_weights.ONEDNN else "own")
    weights = [torch.randn(n, k) for n, k in ((384, 384), (96, 96), (70, 40))]
    for w in weights:
        want = "own"
        if cpu_weights.ONEDNN:
            packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
            ratio = torch.ops.mkldnn._nbytes(packed) / (w.numel() * w.element_size())
            want = "onednn" if ratio <= cpu_weights.MAX_PADDING else "own"
        assert cpu_weights.pack_owned(w).storage == want, (tuple(w.shape), want)
    if cpu_weights.ONEDNN:  # both sides of the rule, whatever this CPU's layout
        for limit, want in ((0.5, "own"), (100.0, "onednn")):
            monkeypatch.setattr(cpu_weights, "MAX_PADDING", limit)
            assert [cpu_weights.pack_owned(w).storage for w in weights] == [want] * 3, limit
    assert cpu_weights.pack_owned(torch.randn(4, 0)).storage == "own"


ROUTES = ["own", "torch"] + (["onednn"] if cpu_weights.ONEDNN else [])


@pytest.fixture(scope="module")
def minilm_like(tmp_path_factory):
    from ..models import build, save

    # widths that are multiples of 64 (as every real checkpoint's), 2 layers
    hf = build(
        "bert", "base", hidden_size=128, intermediate_size=512, num_attention_heads=2,
        num_hidden_layers=2,
    )  # fmt: skip
    return hf, save(hf, str(tmp_path_factory.mktemp("minilm_like")))


@pytest.mark.parametrize("route", ROUTES)
def test_loaded_model_on_each_route(route, minilm_like, monkeypatch):
    from ..models import make_batch

    hf, folder = minilm_like
    monkeypatch.setattr(cpu_weights, "ROUTE", route)
    model = bertfast.from_pretrained(folder, backend="cpu")
    want = cpu_weights.storage_for(torch.float32)
    for name in ("qkv", "attn_out", "ffn_in", "ffn_out"):
        w = getattr(model.layers, "0")._modules[name].weight
        assert (w.storage if cpu_weights.is_packed(w) else None) == want, name
    batch = make_batch("bert")
    with torch.no_grad():
        ref = hf(**batch).last_hidden_state
    out = model(**batch).last_hidden_state
    mask = batch["attention_mask"].bool()
    assert (out[mask] - ref[mask]).abs().max().item() <= 1e-4
    # one copy of every weight: the packed forms are the weights' own size
    plain = sum(p.numel() * p.element_size() for p in hf.state_dict().values())
    assert model.weight_nbytes() <= 1.01 * plain


@pytest.mark.skipif(not cpu_weights.NATIVE_BF16, reason="no native bf16 on this CPU")
def test_loaded_bf16_model_runs_on_onednn(minilm_like, monkeypatch):
    from ..models import make_batch

    hf, folder = minilm_like
    monkeypatch.setattr(cpu_weights, "ROUTE", "onednn")
    model = bertfast.from_pretrained(folder, backend="cpu", dtype=torch.bfloat16)
    w = model.layers._modules["0"].ffn_in.weight
    assert cpu_weights.is_packed(w) and w.storage == "onednn" and w.dtype == torch.bfloat16
    batch = make_batch("bert")
    with torch.no_grad():
        ref = hf(**batch).last_hidden_state
    out = model(**batch).last_hidden_state
    assert out.dtype == torch.bfloat16
    mask = batch["attention_mask"].bool()
    cos = torch.nn.functional.cosine_similarity(out[mask].float(), ref[mask], dim=-1)
    assert cos.min().item() >= 0.999
    plain = sum(p.numel() * 2 for p in hf.state_dict().values() if p.is_floating_point())
    assert model.weight_nbytes() <= 1.01 * plain + 1024


def test_layer_rows_pads_only_weights_onednn_holds():
    """An encoder pads its token rows up to a oneDNN row size only when all its GEMM
    weights are held by oneDNN: fp32 (whose other counts run the C++ GEMM) when at
    most LAYER_PAD_FRACTION more rows, bf16 (padded at each call otherwise) always;
    never at or below SMALL_ROWS, never for own panels or plain weights."""
    w = torch.randn(128, 64)
    own = cpu_weights.PackedWeight.of(w, "own")
    for m in range(5000):
        assert cpu_weights.layer_rows(m, [own]) == m
        assert cpu_weights.layer_rows(m, [w]) == m
    if not cpu_weights.ONEDNN:
        return
    forms = [(cpu_weights.PackedWeight.of(w, "onednn"), cpu_weights.LAYER_PAD_FRACTION)]
    if ONEDNN_BF16:
        forms.append((cpu_weights.PackedWeight.of(w.bfloat16(), "onednn"), 1.0))
    for pw, fraction in forms:
        if pw.dtype == torch.float32 and pw._panels is None:
            fraction = 1.0  # oneDNN's layout is not panels here: every call pads
        padded_some = False
        for m in range(5000):
            size = cpu_weights.onednn_rows(m)
            want = size if m > cpu_weights.SMALL_ROWS and size - m <= fraction * m else m
            assert cpu_weights.layer_rows(m, [pw]) == want, (pw.dtype, m)
            assert cpu_weights.layer_rows(m, [pw, own]) == m  # one weight not oneDNN's
            padded_some |= want != m
        assert padded_some


@pytest.mark.skipif(not cpu_weights.ONEDNN, reason="torch has no oneDNN")
@pytest.mark.parametrize(
    "lengths", [(40, 40, 40, 30), (40, 40, 40, 40, 25)], ids=["150to160", "185to192"]
)
def test_loaded_model_pads_ragged_tokens_to_a_onednn_size(lengths, minilm_like, monkeypatch):
    """A ragged batch whose token count lies between oneDNN's sizes runs its layers on
    zero rows up to the size (cpu_weights.layer_rows): same answer as transformers,
    hidden states of the real tokens only, zeros at padded positions."""
    from ..models import make_batch

    hf, folder = minilm_like
    monkeypatch.setattr(cpu_weights, "ROUTE", "onednn")
    model = bertfast.from_pretrained(folder, backend="cpu")
    seen = []
    layer_rows = cpu_weights.layer_rows

    def spy(rows, weights):
        seen.append((rows, layer_rows(rows, weights)))
        return seen[-1][1]

    monkeypatch.setattr(cpu_weights, "layer_rows", spy)
    batch = make_batch("bert", lengths=lengths)
    with torch.no_grad():
        ref = hf(**batch, output_hidden_states=True)
    out = model(**batch, output_hidden_states=True)
    tokens = sum(lengths)
    assert seen == [(tokens, cpu_weights.onednn_rows(tokens))] and seen[0][1] > tokens
    mask = batch["attention_mask"].bool()
    assert len(out.hidden_states) == len(ref.hidden_states)
    for got, want in zip(out.hidden_states, ref.hidden_states):
        assert got.shape == want.shape
        assert (got[mask] - want[mask]).abs().max().item() <= 1e-4
        assert (got[~mask] == 0).all()
    assert (out.last_hidden_state[mask] - ref.last_hidden_state[mask]).abs().max() <= 1e-4


def test_row_blocks_cover_rows_in_onednn_sizes():
    """Row blocks cover every row once, in order; split only when the activation is
    over FRESH_BYTES_MAX, into blocks under it, each a oneDNN row size made of whole
    ``unit``-row sequences."""
    limit = cpu_weights.FRESH_BYTES_MAX
    cases = [(4096, 3072, 1), (4096, 2304, 128), (16384, 2304, 256), (5000, 3072, 1)]
    cases += [(4096, 768, 1), (4096, 2304, 100), (300, 9, 1)]
    for rows, width, unit in cases:
        blocks = cpu_weights.row_blocks(rows, width, 4, unit)
        assert blocks[0][0] == 0 and blocks[-1][1] == rows
        assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
        if rows * width * 4 <= limit:
            assert blocks == [(0, rows)]
        if len(blocks) > 1:
            size = blocks[0][1]
            assert size * width * 4 <= limit and size % unit == 0
            assert cpu_weights.onednn_rows(size) == size
    assert len(cpu_weights.row_blocks(4096, 3072, 4)) == 2  # BERT-base's FFN at 4096 rows


@pytest.mark.skipif(not cpu_weights.ONEDNN, reason="torch has no oneDNN")
@pytest.mark.parametrize(
    "lengths", [(40,) * 8, (40, 33, 1, 29, 20, 40, 38, 30, 39)], ids=["dense8x40", "ragged270to288"]
)
def test_loaded_model_in_row_blocks_matches_transformers(lengths, minilm_like, monkeypatch):
    """With a small FRESH_BYTES_MAX the layers run attention in blocks of whole
    sequences (a batch without padding) and the FFN in row blocks: same answer as
    transformers, hidden states included."""
    from ..models import make_batch

    hf, folder = minilm_like
    monkeypatch.setattr(cpu_weights, "ROUTE", "onednn")
    monkeypatch.setattr(cpu_weights, "FRESH_BYTES_MAX", 128 * 512 * 4)
    model = bertfast.from_pretrained(folder, backend="cpu")
    seen = []
    layer_blocks = cpu_weights.layer_blocks

    def spy(*args):
        seen.append(layer_blocks(*args))
        return seen[-1]

    monkeypatch.setattr(cpu_weights, "layer_blocks", spy)
    batch = make_batch("bert", lengths=lengths)
    with torch.no_grad():
        ref = hf(**batch, output_hidden_states=True)
    out = model(**batch, output_hidden_states=True)
    ((rows, attention, ffn),) = seen
    assert len(ffn) > 1
    assert len(attention) == (2 if len(set(lengths)) == 1 else 1)
    mask = batch["attention_mask"].bool()
    for got, want in zip(out.hidden_states, ref.hidden_states, strict=True):
        assert (got[mask] - want[mask]).abs().max().item() <= 1e-4
        assert (got[~mask] == 0).all()


@pytest.mark.skipif(not cpu_weights.ONEDNN, reason="torch has no oneDNN")
@pytest.mark.parametrize(
    "lengths", [(40,) * 8, (40, 33, 1, 29, 20, 40, 38, 30, 39)], ids=["dense8x40", "ragged270"]
)
def test_nan_stays_in_its_sequence_through_padding_and_blocks(lengths, minilm_like, monkeypatch):
    """A NaN embedding row (one token of row 1) poisons its own sequence only, as in
    transformers: the zero rows added up to a oneDNN size and the row blocks never
    mix rows across sequences."""
    from ..models import make_batch

    hf, folder = minilm_like
    monkeypatch.setattr(cpu_weights, "ROUTE", "onednn")
    monkeypatch.setattr(cpu_weights, "FRESH_BYTES_MAX", 128 * 512 * 4)
    model = bertfast.from_pretrained(folder, backend="cpu")
    batch = make_batch("bert", lengths=lengths)
    token = int(batch["input_ids"][1, 0])
    batch["input_ids"][batch["input_ids"] == token] = 1  # only row 1 holds the token
    batch["input_ids"][1, 0] = token
    table = hf.get_input_embeddings().weight
    saved = table[token].detach().clone()
    with torch.no_grad():
        model.embeddings.word.data[token] = float("nan")
        table[token] = float("nan")
        try:
            ref = hf(**batch).last_hidden_state
        finally:
            table[token] = saved  # the transformers model is shared by this module's tests
    out = model(**batch).last_hidden_state
    mask = batch["attention_mask"].bool()
    assert torch.equal(out[mask].isnan(), ref[mask].isnan())
    assert out[1, : lengths[1]].isnan().all()
    keep = mask.clone()
    keep[1] = False
    assert (out[keep] - ref[keep]).abs().max().item() <= 1e-4


@pytest.mark.skipif(not cpu_weights.ONEDNN, reason="torch has no oneDNN")
def test_loaded_model_runs_few_rows_on_panels(minilm_like):
    """A loaded model runs up to SMALL_ROWS rows of every linear weight on the C++
    GEMM's panels and more on oneDNN; the handles torch hands out (``detach``) keep
    the route; outputs equal transformers."""
    from ..models import make_batch

    hf, folder = minilm_like
    model = bertfast.from_pretrained(folder, backend="cpu")
    w = getattr(model.layers, "0")._modules["ffn_in"].weight
    if w._panels is None:
        pytest.skip("oneDNN chose a weight layout other than 64-wide panels on this CPU")
    for handle in (w, w.detach()):
        for rows in (1, cpu_weights.SMALL_ROWS):
            route = cpu_weights.packed_for_call(handle, rows)
            assert not route.is_mkldnn and route.data_ptr() == w._panels.data_ptr()
        assert cpu_weights.packed_for_call(handle, 2 * cpu_weights.SMALL_ROWS) is w._packed
    batch = make_batch("bert")
    with torch.no_grad():
        ref = hf(**batch).last_hidden_state
    out = model(**batch).last_hidden_state
    mask = batch["attention_mask"].bool()
    assert (out[mask] - ref[mask]).abs().max().item() <= 1e-4


def _hand_panels(w, pw):
    """``w`` [N, K] in panels of ``pw`` columns, ``[N / pw][K][pw]`` (zero-padded),
    built with torch alone: the layout the C++ GEMM reads."""
    n, k = w.shape
    padded = w.new_zeros(-(-n // pw) * pw, k)
    padded[:n] = w
    return padded.view(-1, pw, k).transpose(1, 2).contiguous()


@pytest.mark.parametrize("allow_avx512", [True, False], ids=["auto-isa", "avx2"])
@pytest.mark.parametrize("pw", [16, 32, 64, 128])
@pytest.mark.parametrize("act", [None, "gelu_tanh"])
def test_few_row_kernel_every_panel_width_and_isa(allow_avx512, pw, act):
    """Every ISA's few-rows kernel (AVX-512: whole 32/64-wide panels up to 128 rows;
    AVX2: 4-6 x 16 register tiles over each 16-column slice of a 16/32/64-wide panel, up
    to 64 rows) against the
    row-block kernel of a 129-row call, bit for bit, and float64 within the rule; a
    width it does not take (128) runs the row-block kernel. Panels built by hand, so
    each width is reached whatever layout oneDNN picks on this CPU."""
    from bertfast import _C

    nr = _C.cpu.linear_pack(torch.ones(1, 1), allow_avx512).shape[2]  # this ISA's width
    if pw % nr:
        pytest.skip(f"panels of {pw} are not a multiple of this ISA's {nr} columns")
    x, w, b = _operands(129, 200, 150, torch.float32, seed=11)
    panels = _hand_panels(w, pw)
    full = _C.cpu.linear_packed(x, panels, b, 150, act, allow_avx512)
    _check(full, x, w, b, act, torch.float32, f"row block pw={pw}")
    for m in (*range(1, 21), 31, 32, 33, 62, 63, 64, 65, 128):
        out = _C.cpu.linear_packed(x[:m], panels, b, 150, act, allow_avx512)
        assert torch.equal(out, full[:m]), (pw, m, allow_avx512)
        _check(out, x[:m], w, b, act, torch.float32, f"few rows pw={pw} m={m}")


@pytest.mark.parametrize("storage", ["own", "onednn"])
@pytest.mark.parametrize("act", [None, "gelu"])
def test_few_row_kernel_equals_row_block_kernel(storage, act):
    """Up to 128 rows the C++ GEMM runs whole panels chunk-outer, in blocks of 64 rows
    (gemm.cpp ``gemm_tile_few_rows``, which prefetches the next chunk); its sums are
    formed as the row-block kernel's, so every row equals, bit for bit, the same row
    of a 129-row call (the row-block kernel), and float64 within the rule. K = 200
    ends in a partial chunk. A NaN row stays in its row."""
    if storage == "onednn" and not cpu_weights.ONEDNN:
        pytest.skip("torch has no oneDNN")
    x, w, b = _operands(129, 200, 150, torch.float32, seed=5)
    pw = cpu_weights.PackedWeight.of(w, storage)
    if pw._panels is None:
        pytest.skip("oneDNN chose a weight layout other than 64-wide panels on this CPU")
    assert not cpu_weights.packed_for_call(pw, 129).is_mkldnn
    full = _run(x, pw, b, act)
    for m in (1, 3, 4, 5, 8, 9, 17, 31, 32, 33, 63, 64, 65, 100, 127, 128):
        out = _run(x[:m], pw, b, act)
        assert torch.equal(out, full[:m]), (storage, m)
        _check(out, x[:m], w, b, act, torch.float32, f"few rows {storage} m={m} {act}")
    xn = x[:6].clone()
    xn[2, 7] = float("nan")
    out = _run(xn, pw, b, act)
    assert out[2].isnan().all() and not out[[0, 1, 3, 4, 5]].isnan().any()
