"""``quantize="int8"``: models, the Embedder, optimize() and the CLI.

References: the same checkpoint in fp32 through bertfast and through transformers
(sentence vectors: mean of the real tokens' last hidden states; int8 must keep a
cosine >= 0.99 to both, issue 15's contract); the kernels themselves are tested
bit-exactly in tests/ops/test_int8_gemm.py.
"""

from __future__ import annotations

import copy
import io

import pytest
import torch
import torch.nn.functional as F

import bertfast
from bertfast.ops.cpu import int8 as quant
from bertfast.ops.cpu import weights as cpu_weights

from .models import build, make_batch, save

pytestmark = pytest.mark.skipif(
    quant.unsupported_reason("cpu", torch.float32) is not None,
    reason="bertfast._C int8 kernels are not built",
)

MIN_COSINE = 0.99
FAMILIES = ["bert", "roberta", "albert", "electra", "distilbert"]


def _sentence_vectors(hidden, mask):
    m = mask.bool()[..., None].to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1)


@pytest.fixture(scope="module", params=FAMILIES)
def family_folder(request, tmp_path_factory):
    hf = build(request.param, "base")
    return request.param, hf, save(hf, str(tmp_path_factory.mktemp(request.param)))


def test_int8_model_matches_fp32_and_transformers(family_folder):
    family, hf, folder = family_folder
    m32 = bertfast.from_pretrained(folder)
    m8 = bertfast.from_pretrained(folder, quantize="int8")
    batch = make_batch(family, lengths=(11, 7, 1, 9, 16))
    with torch.no_grad():
        ref = hf(**batch).last_hidden_state
    h32 = m32(**batch).last_hidden_state
    h8 = m8(**batch).last_hidden_state
    mask = batch["attention_mask"]
    v8 = _sentence_vectors(h8, mask)
    for other in (h32, ref):
        cos = F.cosine_similarity(v8.double(), _sentence_vectors(other, mask).double(), dim=-1)
        assert cos.min().item() >= MIN_COSINE, cos
    # not silently fp32: int8 differs from fp32 by more than fp32 rounding
    assert (h8 - h32).abs().max().item() > 1e-4
    # padded positions stay zero
    assert torch.equal(h8[~mask.bool()], torch.zeros_like(h8[~mask.bool()]))
    # what is quantized: the encoder layers' four linear layers, nothing else
    kinds = {n: quant.is_quantized(p) for n, p in m8.named_parameters(remove_duplicate=False)}
    for name, q in kinds.items():
        expect = name.startswith("layers.") and name.endswith(
            ("qkv.weight", "attn_out.weight", "ffn_in.weight", "ffn_out.weight")
        )
        assert q == expect, name
        if q:  # two-part activations for QKV only
            assert m8._w(name)._split == name.endswith("qkv.weight"), name
    assert m8.weight_nbytes() < 0.6 * m32.weight_nbytes()


def test_int8_heads_and_pooler(tmp_path):
    hf = build("bert", "sequence_classification")
    folder = save(hf, str(tmp_path / "cls"))
    m8 = bertfast.from_pretrained(folder, quantize="int8")
    batch = make_batch("bert")
    with torch.no_grad():
        ref = hf(**batch).logits
    got = m8(**batch).logits
    assert F.cosine_similarity(got.flatten(), ref.flatten(), dim=0) > MIN_COSINE
    assert not quant.is_quantized(m8._w("pooler.weight"))


def test_nonfinite_inputs_propagate(family_folder):
    family, _, folder = family_folder
    m8 = bertfast.from_pretrained(folder, quantize="int8")
    w = m8.embeddings.word
    with torch.no_grad():
        w.data[5] = float("nan")  # the embedding table is a plain fp32 tensor
    batch = make_batch(family, lengths=(4, 3))
    batch["input_ids"][0, 1] = 5
    batch["input_ids"][1] = torch.where(batch["input_ids"][1] == 5, 6, batch["input_ids"][1])
    h = m8(**batch).last_hidden_state
    assert torch.isnan(h[0, :4]).any()  # attention spreads the NaN within the row
    assert torch.isfinite(h[1]).all()


@pytest.mark.parametrize("bad", ["int4", "INT8", "fp8", True, 8])
def test_bad_quantize_values(family_folder, bad):
    _, _, folder = family_folder
    with pytest.raises(ValueError, match=r"quantize must be one of None, 'int8'"):
        bertfast.from_pretrained(folder, quantize=bad)


def test_unsupported_targets_are_refused(family_folder):
    _, _, folder = family_folder
    with pytest.raises(ValueError, match=r"quantize='int8' needs dtype=torch.float32"):
        bertfast.from_pretrained(folder, dtype=torch.bfloat16, quantize="int8")
    with pytest.raises(ValueError, match=r"backend 'torch' has no int8 kernels"):
        bertfast.from_pretrained(folder, backend="torch", quantize="int8")
    assert "runs on CPU only" in quant.unsupported_reason("cuda", torch.float32)
    assert "has no int8 kernels" in quant.unsupported_reason("cpu", torch.float32, "triton")


def test_env_backend_is_refused(family_folder, monkeypatch):
    _, _, folder = family_folder
    monkeypatch.setenv("BERTFAST_BACKEND", "torch")
    with pytest.raises(ValueError, match="no int8 kernels"):
        bertfast.from_pretrained(folder, quantize="int8")


def test_int8_model_cannot_be_moved_or_cast(family_folder):
    _, _, folder = family_folder
    m8 = bertfast.from_pretrained(folder, quantize="int8")
    with pytest.raises(ValueError, match="int8 model .* runs on CPU in float32 only"):
        m8.to(torch.float16)
    m8.to("cpu").float()  # no-ops are fine
    assert quant.is_quantized(m8.layers._modules["0"].qkv.weight)


def test_quantized_weight_is_read_only_and_reads_as_dequantized():
    w = torch.randn(70, 37)
    qw = quant.QuantizedWeight.of(w)
    q, scale = quant.quantize_weight(w)
    assert torch.equal(qw.int8(), q)
    dense = qw.dense()
    torch.testing.assert_close(dense, q.float() * scale[:, None], rtol=0, atol=0)
    # int8 error per element within half a quantization step of its row
    assert ((dense - w).abs() <= scale[:, None] * 0.5 + 1e-7).all()
    # torch ops see the dequantized values
    torch.testing.assert_close(qw.sum(), dense.sum())
    torch.testing.assert_close(qw @ torch.ones(37), dense @ torch.ones(37))
    for write in (
        lambda: qw.add_(1),
        lambda: qw.zero_(),
        lambda: qw[0].fill_(2.0),
        lambda: qw.t().mul_(2),
        lambda: qw.detach().copy_(dense),
    ):
        with pytest.raises(RuntimeError, match="quantized to int8 and owned by the model"):
            write()
    assert torch.equal(qw.int8(), q)  # nothing was written
    # copies and saving give the dequantized values
    assert torch.equal(copy.deepcopy(qw).int8(), q)
    buf = io.BytesIO()
    torch.save(qw, buf)
    buf.seek(0)
    assert torch.equal(torch.load(buf), dense)


def test_quantize_weight_edge_rows():
    w = torch.randn(4, 9)
    w[1] = 0.0
    w[2, 3] = float("nan")
    w[3, 0] = float("inf")
    q, scale = quant.quantize_weight(w)
    assert scale[1] == 1.0 and (q[1] == 0).all()
    assert torch.isnan(scale[2:]).all()
    out = quant.linear(torch.randn(3, 9), quant.QuantizedWeight.of(w), None, None)
    assert torch.isnan(out[:, 2:]).all() and torch.isfinite(out[:, :2]).all()


def test_optimize_int8_keeps_user_weights(tmp_path):
    hf = build("bert")
    batch = make_batch("bert")
    with torch.no_grad():
        expect = hf(**batch).last_hidden_state
    before = {n: p.detach().clone() for n, p in hf.named_parameters()}
    bertfast.optimize(hf, quantize="int8", fallback=False)
    for n, p in hf.named_parameters():
        assert type(p) is torch.nn.Parameter and torch.equal(p, before[n]), n
    with torch.no_grad():
        got = hf(**batch).last_hidden_state
    mask = batch["attention_mask"]
    cos = F.cosine_similarity(
        _sentence_vectors(got, mask).double(), _sentence_vectors(expect, mask).double(), dim=-1
    )
    assert cos.min() >= MIN_COSINE
    assert (got - expect)[mask.bool()].abs().max() > 1e-4  # int8, not fp32
    fast = hf.base_model._bertfast_state.fast
    assert quant.is_quantized(fast.layers._modules["0"].ffn_in.weight)
    with pytest.raises(ValueError, match=r"quantize must be one of None, 'int8'"):
        bertfast.optimize(build("bert"), quantize="int16")
    with pytest.raises(ValueError, match="no int8 kernels"):
        bertfast.optimize(build("bert"), backend="torch", quantize="int8")


def test_embedder_int8(tmp_path):
    from bertfast import Embedder

    from .tiny_embedder import make_checkpoint

    folder = make_checkpoint(tmp_path / "tiny")
    e32 = Embedder.from_pretrained(folder)
    e8 = Embedder.from_pretrained(folder, quantize="int8")
    texts = ["the cat sat on the mat", "hello world", "quick brown fox jump over lazy dog"]
    v32 = e32.encode(texts, convert_to="torch")
    v8 = e8.encode(texts, convert_to="torch")
    cos = F.cosine_similarity(v32.double(), v8.double(), dim=-1)
    assert cos.min() >= MIN_COSINE
    assert not torch.equal(v32, v8)
    with pytest.raises(ValueError, match=r"quantize must be one of None, 'int8'"):
        Embedder.from_pretrained(folder, quantize="int4")
    with pytest.raises(ValueError, match="needs dtype=torch.float32"):
        Embedder.from_pretrained(folder, dtype=torch.float16, quantize="int8")


def test_cli_quantize(tmp_path, capsys):
    from bertfast.cli import main

    from .tiny_embedder import make_checkpoint

    folder = str(make_checkpoint(tmp_path / "tiny"))
    src = tmp_path / "in.txt"
    src.write_text("the cat sat\nhello world\n")
    out = tmp_path / "out.npy"
    assert (
        main(["encode", folder, "--input", str(src), "--output", str(out), "--quantize", "int8"])
        == 0
    )
    capsys.readouterr()
    rc = main(["encode", folder, "--input", str(src), "--output", str(out), "--quantize", "int8",
               "--backend", "torch"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "no int8 kernels" in err[0]
    rc = main(["encode", folder, "--input", str(src), "--output", str(out), "--quantize", "int8",
               "--dtype", "bfloat16"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "float32" in err[0]
    with pytest.raises(SystemExit) as exc:
        main(["encode", folder, "--input", str(src), "--output", str(out), "--quantize", "int4"])
    assert exc.value.code == 2
    assert "invalid choice: 'int4'" in capsys.readouterr().err


def test_int8_model_under_torch_compile(tmp_path):
    hf = build("bert")
    m8 = bertfast.from_pretrained(save(hf, str(tmp_path / "bert")), quantize="int8")
    batch = make_batch("bert")
    eager = m8(**batch).last_hidden_state
    compiled = torch.compile(m8, fullgraph=True)(**batch).last_hidden_state
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)


def test_bench_provider_is_an_int8_row(tmp_path):
    from bertfast.bench.registry import provider_by_name
    from bertfast.bench.workload import make_batch as bench_batch

    hf = build("bert")
    folder = save(hf, str(tmp_path / "bert"))
    pr = provider_by_name("bertfast-cpu-int8", "cpu")
    assert pr.int8 and not pr.is_bertfast and pr.unavailable("cpu", torch.float32) is None
    assert "float32" in pr.unavailable("cpu", torch.bfloat16)
    run = pr.load(folder, "cpu", torch.float32)
    batch = bench_batch([5, 3], 90, device="cpu")
    got = run(batch)
    with torch.no_grad():
        ref = hf(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            token_type_ids=batch.token_type_ids,
        ).last_hidden_state
    mask = batch.attention_mask
    cos = F.cosine_similarity(_sentence_vectors(got, mask), _sentence_vectors(ref, mask), dim=-1)
    assert cos.min() >= MIN_COSINE


def test_split_activations_for_qkv():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(50, 96, generator=g) * 2
    x[:, 5] = 40.0  # an outlier channel: coarse uint8 steps for the rest of the row
    x[7, 2] = float("nan")
    w = torch.randn(70, 96, generator=g) / 10
    b = torch.randn(70, generator=g)
    plain, split = quant.QuantizedWeight.of(w), quant.QuantizedWeight.of(w, split=True)
    ref = F.linear(x.double(), plain.dense().double(), b.double())  # exact activations
    ok = torch.ones(50, dtype=torch.bool)
    ok[7] = False
    e_plain = (quant.linear(x, plain, b)[ok] - ref[ok]).abs().max()
    out = quant.linear(x, split, b, "gelu")
    e_split = (out[ok] - F.gelu(ref[ok])).abs().max()
    assert e_split < e_plain / 20, (e_split, e_plain)
    assert torch.isnan(out[7]).all() and torch.isfinite(out[ok]).all()


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_int8_attention_dtype(family, tmp_path, monkeypatch):
    """``BERTFAST_CPU_INT8_ATTENTION``: bf16 runs attention on bf16 copies of the QKV
    output, fp32 on fp32; auto picks bf16 exactly where the CPU has native bf16 dot
    products. Both stay within the int8 contract against transformers fp32, bf16
    differs from fp32 (it is really taken) by less than int8 differs from fp32, and
    the eager fast path equals the op-by-op path (``torch.compile``) bit for bit."""
    hf = build(family, "base")
    folder = save(hf, str(tmp_path / family))
    batch = make_batch(family, lengths=(11, 7, 1, 9, 16))
    mask = batch["attention_mask"]
    with torch.no_grad():
        ref = _sentence_vectors(hf(**batch).last_hidden_state, mask)
    m32 = bertfast.from_pretrained(folder)
    h32 = m32(**batch).last_hidden_state
    out = {}
    for mode in ("fp32", "bf16", "auto"):
        monkeypatch.setenv("BERTFAST_CPU_INT8_ATTENTION", mode)
        m8 = bertfast.from_pretrained(folder, quantize="int8")
        want = {"fp32": None, "bf16": torch.bfloat16}.get(
            mode, torch.bfloat16 if cpu_weights.NATIVE_BF16 else None
        )
        assert m8._attention_dtype == want, mode
        out[mode] = h = m8(**batch).last_hidden_state
        cos = F.cosine_similarity(_sentence_vectors(h, mask).double(), ref.double(), dim=-1)
        assert cos.min().item() >= MIN_COSINE, (mode, cos)
        assert torch.equal(h[~mask.bool()], torch.zeros_like(h[~mask.bool()]))
        if mode == "bf16":
            compiled = torch.compile(m8, fullgraph=True)(**batch).last_hidden_state
            torch.testing.assert_close(compiled, h, rtol=0, atol=0)
    real = mask.bool()
    bf_vs_fp = (out["bf16"] - out["fp32"])[real].abs().max().item()
    int8_vs_fp32 = (out["fp32"] - h32)[real].abs().max().item()
    assert 0 < bf_vs_fp < int8_vs_fp32, (bf_vs_fp, int8_vs_fp32)


def test_int8_attention_env_is_checked(family_folder, monkeypatch):
    _, _, folder = family_folder
    monkeypatch.setenv("BERTFAST_CPU_INT8_ATTENTION", "fp16")
    with pytest.raises(ValueError, match="BERTFAST_CPU_INT8_ATTENTION='fp16': choose one of"):
        bertfast.from_pretrained(folder, quantize="int8")
