"""One native call per encoder layer on the CPU (``bertfast.ops.cpu.encoder_layer``,
``_C.cpu.encoder_layer``): where every GEMM of a layer runs on the C++ GEMM (a
model's packed weights at up to ``cpu_weights.SMALL_ROWS`` rows), the model runs
each layer in one call instead of seven.

References: the same model op by op (``cpu.FUSED_LAYER = False``: the same kernels,
so equal bit for bit) and transformers (parity), for every architecture the
encoder loop handles differently, in fp32 and with int8 weights (``quantize="int8"``,
``_C.cpu.encoder_layer_int8``, at any row count, attention in fp32 or bf16); then
bf16 weights in the C++ bf16 GEMM's panels; then where the call must not be taken
(rows on oneDNN, bf16 without those panels), and the binding's checks on what it is
given.
"""

from __future__ import annotations

import pytest
import torch

import bertfast
from bertfast.ops import cpu as cpu_ops
from bertfast.ops.cpu import weights as cpu_weights
from bertfast.ops.dispatch import get_backend

from ..models import build, save
from ..test_parity_transformers import ATOL

pytestmark = pytest.mark.skipif(
    get_backend("cpu").unavailable("cpu") is not None,
    reason="bertfast._C CPU kernels are not built",
)

FAMILIES = ["bert", "roberta", "albert", "electra", "distilbert"]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    out = {}
    for family in FAMILIES:
        hf = build(family)
        out[family] = (hf, save(hf, str(tmp_path_factory.mktemp(family))))
    # widths that are multiples of 64 (oneDNN holds the weights: 64-wide panels)
    hf = build(
        "bert", hidden_size=128, intermediate_size=512, num_attention_heads=2,
        num_hidden_layers=2, max_position_embeddings=256,
    )  # fmt: skip
    out["onednn"] = (hf, save(hf, str(tmp_path_factory.mktemp("onednn"))))
    return out


class Count:
    """Counts calls of ``owner.name`` (default ``cpu.encoder_layer``) that ran
    (returned a tensor) and that declined (returned None)."""

    def __init__(self, monkeypatch, owner=cpu_ops, name="encoder_layer"):
        self.ran = self.declined = 0
        real = getattr(owner, name)

        def spy(*a, **k):
            out = real(*a, **k)
            if out is None:
                self.declined += 1
            else:
                self.ran += 1
            return out

        monkeypatch.setattr(owner, name, spy)


def _on_panels(folder, family, monkeypatch):
    """``folder`` loaded on the cpu backend with its GEMM weights in the C++ GEMM's
    panels. Where this CPU's oneDNN keeps fp32 weights in a layout other than 64-wide
    panels (seen on the host of an H100: no panels, every GEMM on oneDNN, the
    layer call never considered), the weights are packed for the C++ GEMM itself
    (``ROUTE`` "own"), except for the "onednn" case, which is about oneDNN's panels."""
    model = bertfast.from_pretrained(folder, backend="cpu")
    if model.layers._modules["0"].qkv.weight._panels is None:
        if family == "onednn":
            pytest.skip("oneDNN does not hold fp32 weights in 64-wide panels on this CPU")
        monkeypatch.setattr(cpu_weights, "ROUTE", "own")
        model = bertfast.from_pretrained(folder, backend="cpu")
        assert model.layers._modules["0"].qkv.weight._panels is not None
    return model


def _bf16_model(folder, route, monkeypatch):
    """``folder`` in bf16 with its GEMM weights in the C++ bf16 GEMM's panels:
    oneDNN's buffer read in place (``route`` "onednn": where that GEMM runs on AMX
    and oneDNN's layout is its panels) or its own packing ("own": every machine; the
    portable kernel where the CPU has no AMX)."""
    if route == "onednn" and not cpu_weights.BF16_PANELS:
        pytest.skip("the C++ bf16 GEMM runs on AMX only, and this CPU (or OS) has none")
    if route == "own":
        monkeypatch.setattr(cpu_weights, "ROUTE", "own")
    model = bertfast.from_pretrained(folder, backend="cpu", dtype=torch.bfloat16)
    w = model.layers._modules["0"].qkv.weight
    if w._panels is None:
        pytest.skip("oneDNN does not hold this bf16 weight in the bf16 GEMM's panels here")
    assert w.storage == route
    return model


def _batch(lengths, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    S = max(lengths)
    ids = torch.randint(5, vocab, (len(lengths), S), generator=g)
    mask = torch.zeros(len(lengths), S, dtype=torch.int64)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    return ids, mask


def _run(model, ids, mask):
    out = model(ids, attention_mask=mask, output_hidden_states=True)
    return [out.last_hidden_state, *out.hidden_states]


def _layer_call_equals_op_by_op(model, hf, lengths, monkeypatch):
    """Runs ``model`` on a batch of ``lengths`` with the layer call (taken for every
    layer) and op by op (``FUSED_LAYER = False``, not taken), asserts every hidden
    state equal bit for bit, and returns (last hidden state, transformers' last hidden
    state, the real-token mask) for the parity check."""
    ids, mask = _batch(lengths, hf.config.vocab_size)
    count = Count(monkeypatch)
    fused = _run(model, ids, mask)
    layers = len(model.config.layer_schedule())
    assert count.ran == layers and count.declined == 0
    monkeypatch.setattr(cpu_ops, "FUSED_LAYER", False)
    op_by_op = _run(model, ids, mask)
    assert count.ran == layers  # not taken when switched off
    for a, b in zip(fused, op_by_op, strict=True):
        assert torch.equal(a, b)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    return fused[0], ref, mask.bool()


@pytest.mark.parametrize("family", FAMILIES + ["onednn"])
@pytest.mark.parametrize(
    "lengths", [[1], [7, 3], [10, 10, 10], [14, 1, 9, 5], [16, 16, 16], [30, 1, 17, 9]]
)
def test_native_layer_equals_op_by_op_and_transformers(family, lengths, zoo, monkeypatch):
    if sum(lengths) > cpu_weights.SMALL_ROWS:
        pytest.skip(f"above {cpu_weights.SMALL_ROWS} rows this CPU runs the GEMMs on oneDNN")
    hf, folder = zoo[family]
    model = _on_panels(folder, family, monkeypatch)
    fused, ref, real = _layer_call_equals_op_by_op(model, hf, lengths, monkeypatch)
    assert (fused[real] - ref[real]).abs().max().item() <= ATOL


@pytest.mark.skipif(not cpu_weights.ONEDNN, reason="torch has no oneDNN")
def test_not_taken_where_a_gemm_runs_on_onednn(zoo, monkeypatch):
    """Above SMALL_ROWS rows oneDNN runs the GEMMs: the layer goes op by op."""
    hf, folder = zoo["onednn"]
    model = bertfast.from_pretrained(folder, backend="cpu")
    w = model.layers._modules["0"].ffn_in.weight
    if w._panels is None or not w._packed.is_mkldnn:
        pytest.skip("oneDNN does not hold this weight in 64-wide panels on this CPU")
    rows = cpu_weights.SMALL_ROWS + 32
    assert cpu_weights.layer_panels([w], rows) is None
    ids, mask = _batch([rows // 2, rows // 2], hf.config.vocab_size)
    count = Count(monkeypatch)
    out = model(ids, attention_mask=mask).last_hidden_state
    assert count.ran == 0
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    assert (out - ref).abs().max().item() <= ATOL


@pytest.mark.parametrize("attention", ["fp32", "bf16"])
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("lengths", [[1], [7, 3], [14, 1, 9, 5], [30, 1, 17, 9]])
def test_int8_native_layer_equals_op_by_op(family, lengths, attention, zoo, monkeypatch):
    """int8 weights (``quantize="int8"``) with attention in fp32 or bf16
    (``BERTFAST_CPU_INT8_ATTENTION``): one native call per layer
    (``quant.encoder_layer``, ``_C.cpu.encoder_layer_int8``) at every row count, equal
    bit for bit to the same model op by op, and within the int8 contract of
    transformers (the accuracy contract itself is tests/test_accuracy_contract.py)."""
    monkeypatch.setenv("BERTFAST_CPU_INT8_ATTENTION", attention)
    hf, folder = zoo[family]
    model = bertfast.from_pretrained(folder, backend="cpu", quantize="int8")
    fused, ref, real = _layer_call_equals_op_by_op(model, hf, lengths, monkeypatch)
    cos = torch.nn.functional.cosine_similarity(fused[real], ref[real], dim=-1)
    assert cos.min().item() > 0.95


def test_int8_layer_call_runs_attention_in_bf16(zoo, monkeypatch):
    """int8 attention in bf16 (``BERTFAST_CPU_INT8_ATTENTION``; the default where the
    CPU has native bf16) runs inside the int8 layer call: the result is not the one
    fp32 attention gives, and is the one the op-by-op bf16 path gives."""
    monkeypatch.setattr(cpu_ops, "FUSED_FORWARD", False)  # a call per layer, not one in all
    hf, folder = zoo["bert"]
    ids, mask = _batch([5, 3], hf.config.vocab_size)
    out = {}
    for attention in ("bf16", "fp32"):
        monkeypatch.setenv("BERTFAST_CPU_INT8_ATTENTION", attention)  # read at load
        model = bertfast.from_pretrained(folder, backend="cpu", quantize="int8")
        count = Count(monkeypatch)
        out[attention] = model(input_ids=ids, attention_mask=mask).last_hidden_state
        assert count.ran == hf.config.num_hidden_layers and count.declined == 0
    assert not torch.equal(out["bf16"], out["fp32"])  # bf16 attention did run


@pytest.mark.parametrize("route", ["onednn", "own"])
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("lengths", [[7, 3], [30, 1, 17, 9]])
def test_bf16_native_layer_equals_op_by_op(family, lengths, route, zoo, monkeypatch):
    """bf16 weights in the C++ bf16 GEMM's panels: one native call per layer on bf16
    tokens (``blinear`` for each GEMM), equal bit for bit to the same model op by op,
    and near transformers in fp32 (every token's cosine similarity above 0.999)."""
    hf, folder = zoo[family]
    model = _bf16_model(folder, route, monkeypatch)
    fused, ref, real = _layer_call_equals_op_by_op(model, hf, lengths, monkeypatch)
    cos = torch.nn.functional.cosine_similarity(fused[real].float(), ref[real], dim=-1)
    assert cos.min().item() > 0.999


@pytest.mark.parametrize("kind", ["bf16 without panels", "plain"])
def test_not_taken_for_weights_off_the_cpp_gemm(kind, zoo, monkeypatch):
    """bf16 weights without the bf16 GEMM's panels (oneDNN's other layouts, or no
    AMX) and weights a model does not own packed (plain tensors: ``optimize()``'s)
    never reach the C++ GEMMs' layer call: it is considered for every layer and
    declined."""
    hf, folder = zoo["bert"]
    if kind == "bf16 without panels":
        monkeypatch.setattr(cpu_weights, "BF16_PANELS", False)  # read at load
        model = bertfast.from_pretrained(folder, backend="cpu", dtype=torch.bfloat16)
        # oneDNN's form without panels, or (no native bf16) a plain weight
        assert getattr(model.layers._modules["0"].qkv.weight, "_panels", None) is None
    else:
        model = bertfast.optimize(hf, backend="cpu")
    ids, mask = _batch([5, 3], hf.config.vocab_size)
    count = Count(monkeypatch)
    model(input_ids=ids, attention_mask=mask)
    assert count.ran == 0 and count.declined == hf.config.num_hidden_layers


def _layer_args(model, rows=6, seed=0):
    """The binding's arguments for layer 0 of ``model`` on ``rows`` tokens."""
    cfg = model.config
    L = model.layers._modules["0"]._modules
    names = ("qkv", "attn_out", "ffn_in", "ffn_out")
    panels = cpu_weights.layer_panels([L[n].weight for n in names], rows)
    assert panels is not None
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, cfg.hidden_size, generator=g)
    cu = torch.tensor([0, 2, rows], dtype=torch.int32)
    return dict(
        h=h, cu_seqlens=cu, max_seqlen=rows - 2, num_heads=cfg.num_heads,
        scale=cfg.head_dim**-0.5, qkv=panels[0], qkv_bias=L["qkv"].bias,
        attn_out=panels[1], attn_out_bias=L["attn_out"].bias,
        attn_ln_weight=L["attn_ln"].weight, attn_ln_bias=L["attn_ln"].bias,
        ffn_in=panels[2], ffn_in_bias=L["ffn_in"].bias,
        intermediate=L["ffn_in"].weight.shape[0], activation=cfg.hidden_act,
        ffn_out=panels[3], ffn_out_bias=L["ffn_out"].bias,
        ffn_ln_weight=L["ffn_ln"].weight, ffn_ln_bias=L["ffn_ln"].bias,
        eps=cfg.layer_norm_eps,
    )  # fmt: skip


def test_binding_equals_the_ops_in_order(zoo, monkeypatch):
    """The binding is the layer's ops in their order (the ops' public entry points)."""
    from bertfast import ops

    model = _on_panels(zoo["bert"][1], "bert", monkeypatch)
    a = _layer_args(model)
    got = cpu_ops._kernels.encoder_layer(**a)
    L = model.layers._modules["0"]._modules
    be = "cpu"
    y = ops.linear(a["h"], L["qkv"].weight, L["qkv"].bias, backend=be)
    ctx = ops.attention_varlen(
        y, a["cu_seqlens"], a["max_seqlen"], a["num_heads"], a["scale"], backend=be
    )
    x = ops.linear(ctx, L["attn_out"].weight, None, backend=be)
    h1 = ops.add_layernorm(
        x, a["h"], L["attn_out"].bias, L["attn_ln"].weight, L["attn_ln"].bias, a["eps"], backend=be
    )
    f = ops.linear_gelu(h1, L["ffn_in"].weight, L["ffn_in"].bias, a["activation"], backend=be)
    o = ops.linear(f, L["ffn_out"].weight, None, backend=be)
    want = ops.add_layernorm(
        o, h1, L["ffn_out"].bias, L["ffn_ln"].weight, L["ffn_ln"].bias, a["eps"], backend=be
    )
    assert torch.equal(got, want)


BAD = {
    "h of another dtype": ("h", lambda a: a["h"].double(), TypeError),
    "h not 2-d": ("h", lambda a: a["h"][None], ValueError),
    "h of another width": ("h", lambda a: a["h"][:, :-1].contiguous(), ValueError),
    "h not contiguous": ("h", lambda a: a["h"].t().contiguous().t(), ValueError),
    "qkv panels of another K": ("qkv", lambda a: a["attn_out"][:, :-1].contiguous(), ValueError),
    "ffn_in panels too few": ("ffn_in", lambda a: a["ffn_in"][:1].contiguous(), ValueError),
    "intermediate too large": ("intermediate", lambda a: a["intermediate"] + 64, ValueError),
    "intermediate negative": ("intermediate", lambda a: -1, ValueError),
    "qkv bias short": ("qkv_bias", lambda a: a["qkv_bias"][:-1], ValueError),
    "ffn_out bias short": ("ffn_out_bias", lambda a: a["ffn_out_bias"][:-1], ValueError),
    "LayerNorm weight short": ("ffn_ln_weight", lambda a: a["ffn_ln_weight"][:-1], ValueError),
    "cu_seqlens past the tokens": (
        "cu_seqlens",
        lambda a: torch.tensor([0, 2, 99], dtype=torch.int32),
        IndexError,
    ),
    "max_seqlen too small": ("max_seqlen", lambda a: 1, ValueError),
    "heads not dividing": ("num_heads", lambda a: 7, ValueError),
    "unknown activation": ("activation", lambda a: "swish", ValueError),
}


@pytest.mark.parametrize("case", list(BAD))
def test_binding_checks_what_it_is_given(case, zoo, monkeypatch):
    """Every size the kernels rely on is checked: a clear error, never a crash or an
    out-of-bounds read (tests/ops/test_native_safety.py runs the others)."""
    model = _on_panels(zoo["bert"][1], "bert", monkeypatch)
    a = _layer_args(model)
    name, bad, error = BAD[case]
    a[name] = bad(a)
    with pytest.raises(error):
        cpu_ops._kernels.encoder_layer(**a)
