"""The native entry points are safe on their own.

Every ``bertfast._C.cpu.*`` entry point is called directly (no op boundary in
front of it) with arguments whose sizes, dtypes, devices or layouts disagree; each
call must end in a clean Python exception naming the op and the argument, never in
an out-of-bounds access. ``.ci/sanitize.sh`` runs this file under AddressSanitizer
and UBSan, where any stray read or write fails the run.
"""

import pytest
import torch

_C = pytest.importorskip("bertfast._C", reason="bertfast._C is not built")
cpu = _C.cpu

F32 = torch.float32


def _embed_args(**over):
    args = dict(
        input_ids=torch.tensor([[1, 2, 3]]),
        position_ids=torch.tensor([[0, 1, 2]]),
        token_type_ids=torch.tensor([[0, 1, 0]]),
        word=torch.randn(10, 8),
        pos=torch.randn(6, 8),
        types=torch.randn(2, 8),
        weight=torch.ones(8),
        bias=torch.zeros(8),
        eps=1e-12,
    )
    args.update(over)
    return args


def _ln_args(**over):
    args = dict(
        x=torch.randn(3, 8),
        residual=torch.randn(3, 8),
        bias=torch.randn(8),
        weight=torch.ones(8),
        ln_bias=torch.zeros(8),
        eps=1e-5,
    )
    args.update(over)
    return args


def _call(fn, kwargs):
    return fn(*kwargs.values())


def _varlen(qkv, cu, max_seqlen=6):
    """attention_varlen's (and attention_varlen_bf16's) arguments: one head, scale 0.1."""
    cu = torch.tensor(cu, dtype=torch.int32)
    return dict(qkv=qkv, cu=cu, max_seqlen=max_seqlen, heads=1, scale=0.1)


# (entry point, arguments, exception, text the message must contain)
CASES = {
    # embed_layernorm
    "embed/pos width": (
        cpu.embed_layernorm,
        _embed_args(pos=torch.randn(6, 7)),
        ValueError,
        "position_embeddings has size 7 in dim 1",
    ),
    "embed/types width": (
        cpu.embed_layernorm,
        _embed_args(types=torch.randn(2, 9)),
        ValueError,
        "token_type_embeddings has size 9",
    ),
    "embed/weight size": (
        cpu.embed_layernorm,
        _embed_args(weight=torch.ones(7)),
        ValueError,
        "weight has size 7",
    ),
    "embed/bias size": (
        cpu.embed_layernorm,
        _embed_args(bias=torch.zeros(9)),
        ValueError,
        "bias has size 9",
    ),
    "embed/types without ids": (
        cpu.embed_layernorm,
        _embed_args(token_type_ids=None),
        ValueError,
        "given together",
    ),
    "embed/position_ids shape": (
        cpu.embed_layernorm,
        _embed_args(position_ids=torch.tensor([[0, 1]])),
        ValueError,
        "position_ids has shape (1, 2)",
    ),
    "embed/token_type_ids shape": (
        cpu.embed_layernorm,
        _embed_args(token_type_ids=torch.tensor([0, 1, 0, 1])),
        ValueError,
        "token_type_ids has shape (4,)",
    ),
    "embed/int32 ids": (
        cpu.embed_layernorm,
        _embed_args(input_ids=torch.tensor([[1, 2, 3]], dtype=torch.int32)),
        TypeError,
        "input_ids has dtype Int",
    ),
    "embed/1-D word": (
        cpu.embed_layernorm,
        _embed_args(word=torch.randn(80)),
        ValueError,
        "word_embeddings must have 2 dimension(s)",
    ),
    "embed/mixed dtypes": (
        cpu.embed_layernorm,
        _embed_args(pos=torch.randn(6, 8).half()),
        TypeError,
        "position_embeddings has dtype Half",
    ),
    "embed/float64": (
        cpu.embed_layernorm,
        _embed_args(word=torch.randn(10, 8, dtype=torch.float64)),
        TypeError,
        "expected float32, float16 or bfloat16",
    ),
    "embed/non-contiguous": (
        cpu.embed_layernorm,
        _embed_args(word=torch.randn(8, 10).t()),
        ValueError,
        "word_embeddings must be contiguous",
    ),
    "embed/eps": (cpu.embed_layernorm, _embed_args(eps=0.0), ValueError, "eps must be positive"),
    "embed/meta device": (
        cpu.embed_layernorm,
        _embed_args(weight=torch.ones(8, device="meta")),
        ValueError,
        "weight is on meta",
    ),
    # add_layernorm
    "add_ln/residual shape": (
        cpu.add_layernorm,
        _ln_args(residual=torch.randn(2, 8)),
        ValueError,
        "residual has shape (2, 8)",
    ),
    "add_ln/residual rows": (
        cpu.add_layernorm,
        _ln_args(residual=torch.randn(4, 8)),
        ValueError,
        "residual has shape (4, 8)",
    ),
    "add_ln/bias size": (
        cpu.add_layernorm,
        _ln_args(bias=torch.randn(5)),
        ValueError,
        "bias has size 5",
    ),
    "add_ln/weight size": (
        cpu.add_layernorm,
        _ln_args(weight=torch.ones(9)),
        ValueError,
        "weight has size 9",
    ),
    "add_ln/ln_bias size": (
        cpu.add_layernorm,
        _ln_args(ln_bias=torch.zeros(1)),
        ValueError,
        "ln_bias has size 1",
    ),
    "add_ln/ln_bias 2-D": (
        cpu.add_layernorm,
        _ln_args(ln_bias=torch.zeros(1, 8)),
        ValueError,
        "ln_bias must have 1 dimension",
    ),
    "add_ln/0-d x": (
        cpu.add_layernorm,
        _ln_args(x=torch.tensor(1.0)),
        ValueError,
        "x must have at least 1",
    ),
    "add_ln/residual dtype": (
        cpu.add_layernorm,
        _ln_args(residual=torch.randn(3, 8).bfloat16()),
        TypeError,
        "residual has dtype BFloat16",
    ),
    "add_ln/strided x": (
        cpu.add_layernorm,
        _ln_args(x=torch.randn(3, 16)[:, ::2]),
        ValueError,
        "x must be contiguous",
    ),
    # bias_act
    "bias_act/bias size": (
        cpu.bias_act,
        dict(x=torch.randn(4, 8), bias=torch.randn(7), act="gelu", inplace=False),
        ValueError,
        "bias has size 7",
    ),
    "bias_act/activation": (
        cpu.bias_act,
        dict(x=torch.randn(4, 8), bias=None, act="swish", inplace=False),
        ValueError,
        "unknown activation 'swish'",
    ),
    "bias_act/inplace strided": (
        cpu.bias_act,
        dict(x=torch.randn(8, 4).t(), bias=None, act="relu", inplace=True),
        ValueError,
        "x must be contiguous",
    ),
    "bias_act/int x": (
        cpu.bias_act,
        dict(x=torch.ones(4, 8, dtype=torch.int32), bias=None, act="relu", inplace=False),
        TypeError,
        "x has dtype Int",
    ),
    # attention
    "attention/2-D qkv": (
        cpu.attention,
        dict(qkv=torch.randn(4, 96), mask=None, heads=1, scale=0.1),
        ValueError,
        "qkv must have 3 dimension(s)",
    ),
    "attention/not 3H": (
        cpu.attention,
        dict(qkv=torch.randn(1, 4, 95), mask=None, heads=1, scale=0.1),
        ValueError,
        "is not 3 * hidden",
    ),
    "attention/heads": (
        cpu.attention,
        dict(qkv=torch.randn(1, 4, 96), mask=None, heads=5, scale=0.1),
        ValueError,
        "not divisible by num_heads=5",
    ),
    "attention/zero heads": (
        cpu.attention,
        dict(qkv=torch.randn(1, 4, 96), mask=None, heads=0, scale=0.1),
        ValueError,
        "num_heads=0",
    ),
    "attention/mask shape": (
        cpu.attention,
        dict(
            qkv=torch.randn(2, 4, 96), mask=torch.ones(2, 3, dtype=torch.bool), heads=1, scale=0.1
        ),
        ValueError,
        "attention_mask has shape (2, 3)",
    ),
    "attention/mask batch": (
        cpu.attention,
        dict(
            qkv=torch.randn(2, 4, 96), mask=torch.ones(1, 4, dtype=torch.bool), heads=1, scale=0.1
        ),
        ValueError,
        "attention_mask has shape (1, 4)",
    ),
    "attention/mask dtype": (
        cpu.attention,
        dict(qkv=torch.randn(2, 4, 96), mask=torch.ones(2, 4), heads=1, scale=0.1),
        TypeError,
        "expected bool or uint8",
    ),
    # attention_varlen
    "varlen/cu int64": (
        cpu.attention_varlen,
        dict(qkv=torch.randn(6, 96), cu=torch.tensor([0, 6]), max_seqlen=6, heads=1, scale=0.1),
        TypeError,
        "cu_seqlens has dtype Long",
    ),
    "varlen bf16/qkv bf16": (
        cpu.attention_varlen_bf16,
        _varlen(torch.randn(6, 96).bfloat16(), [0, 6]),
        TypeError,
        "qkv has dtype BFloat16, expected Float",
    ),
    "varlen bf16/cu past the end": (
        cpu.attention_varlen_bf16,
        _varlen(torch.randn(6, 96), [0, 4, 9]),
        IndexError,
        "attention (attention_varlen): cu_seqlens",
    ),
    "varlen bf16/qkv width": (
        cpu.attention_varlen_bf16,
        _varlen(torch.randn(6, 95), [0, 6]),
        ValueError,
        "attention (attention_varlen): ",
    ),
    "varlen/cu empty": (
        cpu.attention_varlen,
        dict(
            qkv=torch.randn(6, 96),
            cu=torch.zeros(0, dtype=torch.int32),
            max_seqlen=6,
            heads=1,
            scale=0.1,
        ),
        ValueError,
        "batch + 1 >= 1",
    ),
    "varlen/cu past the end": (
        cpu.attention_varlen,
        _varlen(torch.randn(6, 96), [0, 4, 9]),
        IndexError,
        "cu_seqlens",
    ),
    "varlen/cu falls": (
        cpu.attention_varlen,
        dict(
            qkv=torch.randn(6, 96),
            cu=torch.tensor([0, 5, 2, 6], dtype=torch.int32),
            max_seqlen=6,
            heads=1,
            scale=0.1,
        ),
        IndexError,
        "cu_seqlens",
    ),
    "varlen/cu short": (
        cpu.attention_varlen,
        dict(
            qkv=torch.randn(6, 96),
            cu=torch.tensor([0, 4], dtype=torch.int32),
            max_seqlen=6,
            heads=1,
            scale=0.1,
        ),
        IndexError,
        "cu_seqlens",
    ),
    "varlen/max_seqlen": (
        cpu.attention_varlen,
        dict(
            qkv=torch.randn(6, 96),
            cu=torch.tensor([0, 6], dtype=torch.int32),
            max_seqlen=4,
            heads=1,
            scale=0.1,
        ),
        ValueError,
        "longer than max_seqlen=4",
    ),
    "varlen/negative max_seqlen": (
        cpu.attention_varlen,
        dict(
            qkv=torch.randn(6, 96),
            cu=torch.tensor([0, 6], dtype=torch.int32),
            max_seqlen=-1,
            heads=1,
            scale=0.1,
        ),
        ValueError,
        "max_seqlen must be >= 0",
    ),
    "varlen/3-D qkv": (
        cpu.attention_varlen,
        dict(
            qkv=torch.randn(1, 6, 96),
            cu=torch.tensor([0, 6], dtype=torch.int32),
            max_seqlen=6,
            heads=1,
            scale=0.1,
        ),
        ValueError,
        "qkv must have 2 dimension(s)",
    ),
    # pack_rows / unpack_rows
    "pack/index past the end": (
        cpu.pack_rows,
        dict(x=torch.randn(4, 3), idx=torch.tensor([1, 4])),
        IndexError,
        "index 4 outside [0, 4)",
    ),
    "pack/negative index": (
        cpu.pack_rows,
        dict(x=torch.randn(4, 3), idx=torch.tensor([-1])),
        IndexError,
        "index -1 outside [0, 4)",
    ),
    "pack/int32 indices": (
        cpu.pack_rows,
        dict(x=torch.randn(4, 3), idx=torch.tensor([1], dtype=torch.int32)),
        TypeError,
        "indices has dtype Int",
    ),
    "pack/2-D indices": (
        cpu.pack_rows,
        dict(x=torch.randn(4, 3), idx=torch.tensor([[1]])),
        ValueError,
        "indices must have 1 dimension",
    ),
    "pack/empty x": (
        cpu.pack_rows,
        dict(x=torch.randn(0, 3), idx=torch.tensor([0])),
        IndexError,
        "outside [0, 0)",
    ),
    "unpack/index past num_rows": (
        cpu.unpack_rows,
        dict(x=torch.randn(2, 3), idx=torch.tensor([1, 4]), rows=4),
        IndexError,
        "index 4 outside [0, 4)",
    ),
    "unpack/one index per row": (
        cpu.unpack_rows,
        dict(x=torch.randn(3, 3), idx=torch.tensor([1, 2]), rows=4),
        ValueError,
        "indices has size 2 in dim 0, expected 3",
    ),
    "unpack/negative rows": (
        cpu.unpack_rows,
        dict(x=torch.randn(2, 3), idx=torch.tensor([0, 1]), rows=-1),
        ValueError,
        "num_rows must be >= 0",
    ),
    "unpack/zero rows": (
        cpu.unpack_rows,
        dict(x=torch.randn(1, 3), idx=torch.tensor([0]), rows=0),
        IndexError,
        "outside [0, 0)",
    ),
    # GEMM
    "linear_act/weight K": (
        cpu.linear_act,
        dict(x=torch.randn(3, 8), w=torch.randn(5, 7), b=None, act=None, avx512=True),
        ValueError,
        "weight has size 7 in dim 1, expected 8",
    ),
    "linear_act/bias size": (
        cpu.linear_act,
        dict(x=torch.randn(3, 8), w=torch.randn(5, 8), b=torch.randn(4), act="gelu", avx512=False),
        ValueError,
        "bias has size 4 in dim 0, expected 5",
    ),
    "linear_act/fp16": (
        cpu.linear_act,
        dict(x=torch.randn(3, 8).half(), w=torch.randn(5, 8), b=None, act=None, avx512=True),
        TypeError,
        "x has dtype Half",
    ),
    "linear_act/activation": (
        cpu.linear_act,
        dict(x=torch.randn(3, 8), w=torch.randn(5, 8), b=None, act="tanh", avx512=True),
        ValueError,
        "unknown activation 'tanh'",
    ),
    "linear_act/1-D weight": (
        cpu.linear_act,
        dict(x=torch.randn(3, 8), w=torch.randn(8), b=None, act=None, avx512=True),
        ValueError,
        "weight must have 2 dimension(s)",
    ),
    "linear_pack/float64": (
        cpu.linear_pack,
        dict(w=torch.randn(5, 8, dtype=torch.float64), avx512=True),
        TypeError,
        "weight has dtype Double",
    ),
    "linear_pack/3-D": (
        cpu.linear_pack,
        dict(w=torch.randn(2, 5, 8), avx512=True),
        ValueError,
        "weight must have 2 dimension(s)",
    ),
}


def _packed_cases():
    w = torch.randn(40, 8)
    nr = cpu.linear_panel_width(True)
    packed = cpu.linear_pack(w, True)
    x = torch.randn(3, 8)
    return {
        "linear_packed/K": (
            cpu.linear_packed,
            dict(x=torch.randn(3, 9), p=packed, b=None, n=40, act=None, a=True),
            ValueError,
            "packed has size 8 in dim 1, expected 9",
        ),
        "linear_packed/out_features": (
            cpu.linear_packed,
            dict(x=x, p=packed, b=None, n=40 + nr, act=None, a=True),
            ValueError,
            "panels for out_features",
        ),
        "linear_packed/panel width": (
            cpu.linear_packed,
            # panels of a multiple of nr are read (oneDNN's 64-wide ones); others refused
            dict(x=x, p=torch.randn(2, 8, nr + nr // 2), b=None, n=40, act=None, a=True),
            ValueError,
            "panel width",
        ),
        "linear_packed/flat": (
            cpu.linear_packed,
            dict(x=x, p=packed.flatten(), b=None, n=40, act=None, a=True),
            ValueError,
            "packed must have 3 dimension(s)",
        ),
        "linear_packed/bias": (
            cpu.linear_packed,
            dict(x=x, p=packed, b=torch.randn(41), n=40, act="relu", a=True),
            ValueError,
            "bias has size 41",
        ),
        "linear_packed/negative N": (
            cpu.linear_packed,
            dict(x=x, p=packed, b=None, n=-1, act=None, a=True),
            ValueError,
            "out_features must be >= 0",
        ),
    }


def _layer_args(**over):
    """encoder_layer's arguments: 3 tokens (sequences of 2 and 1), H 8, 2 heads, FFN 16."""
    H, I = 8, 16
    args = dict(
        h=torch.randn(3, H), cu=torch.tensor([0, 2, 3], dtype=torch.int32), max_len=2, heads=2,
        scale=0.5, qkv=cpu.linear_pack(torch.randn(3 * H, H), True), qkv_b=torch.randn(3 * H),
        proj=cpu.linear_pack(torch.randn(H, H), True), proj_b=torch.randn(H),
        ln1_w=torch.ones(H), ln1_b=torch.zeros(H),
        ffn_in=cpu.linear_pack(torch.randn(I, H), True), ffn_in_b=torch.randn(I),
        inter=I, act="gelu", ffn_out=cpu.linear_pack(torch.randn(H, I), True),
        ffn_out_b=torch.randn(H), ln2_w=torch.ones(H), ln2_b=torch.zeros(H), eps=1e-12, a=True,
    )  # fmt: skip
    args.update(over)
    return args


def _layer_cases():
    """encoder_layer (csrc/cpu_ops.cpp): its own checks, then each step's, named."""
    L = _layer_args
    panels_16 = cpu.linear_pack(torch.randn(16, 16), True)
    return {
        "layer/h dtype": (cpu.encoder_layer, L(h=torch.randn(3, 8).double()), TypeError, "h has"),
        "layer/h 3-d": (cpu.encoder_layer, L(h=torch.randn(1, 3, 8)), ValueError, "h must have 2"),
        "layer/intermediate": (cpu.encoder_layer, L(inter=-1), ValueError, "intermediate"),
        "layer/qkv K": (
            cpu.encoder_layer,
            L(qkv=cpu.linear_pack(torch.randn(24, 9), True)),
            ValueError,
            "QKV projection (linear_packed): packed has size 9 in dim 1, expected 8",
        ),
        "layer/cu_seqlens": (
            cpu.encoder_layer,
            L(cu=torch.tensor([0, 2, 5], dtype=torch.int32)),
            IndexError,
            "attention (attention_varlen): cu_seqlens must rise",
        ),
        "layer/heads": (cpu.encoder_layer, L(heads=3), ValueError, "attention (attention_varlen)"),
        "layer/proj panels": (
            cpu.encoder_layer,
            L(proj=panels_16),
            ValueError,
            "attention output projection (linear_packed)",
        ),
        "layer/ln1 bias": (
            cpu.encoder_layer,
            L(proj_b=torch.randn(9)),
            ValueError,
            "attention LayerNorm (add_layernorm): bias",
        ),
        "layer/intermediate vs panels": (
            cpu.encoder_layer,
            L(inter=16 + cpu.linear_panel_width(True)),
            ValueError,
            "FFN in (linear_packed)",
        ),
        "layer/activation": (
            cpu.encoder_layer,
            L(act="swish"),
            ValueError,
            "FFN in (linear_packed)",
        ),
        "layer/ffn_out K": (
            cpu.encoder_layer,
            L(ffn_out=cpu.linear_pack(torch.randn(8, 12), True)),
            ValueError,
            "FFN out (linear_packed)",
        ),
        "layer/ln2 weight": (
            cpu.encoder_layer,
            L(ln2_w=torch.ones(7)),
            ValueError,
            "FFN LayerNorm (add_layernorm): weight",
        ),
    }


def _int8_cases():
    """The int8 entry points (kernels/cpu/qgemm.cpp, csrc/cpu_int8_ops.cpp)."""
    if not hasattr(cpu, "qlinear"):  # pragma: no cover - a build without them
        return {}
    w = torch.randint(-127, 128, (40, 12), dtype=torch.int32).to(torch.int8)
    packed, colsum = cpu.qgemm_pack(w)
    sw = torch.ones(40)
    x = torch.randn(3, 12)
    q = torch.randint(0, 256, (3, 12), dtype=torch.int32).to(torch.uint8)
    return {
        "quantize_rows/dtype": (
            cpu.quantize_rows,
            dict(x=x.double()),
            TypeError,
            "x has dtype Double",
        ),
        "quantize_rows/0-D": (cpu.quantize_rows, dict(x=torch.tensor(1.0)), ValueError, "x must"),
        "qgemm_pack/1-D": (
            cpu.qgemm_pack,
            dict(w=w.flatten()),
            ValueError,
            "weight must have 2 dimension(s)",
        ),
        "qgemm_pack/K": (
            cpu.qgemm_pack,
            dict(w=torch.zeros(1, 70000, dtype=torch.int8)),
            ValueError,
            "K=70000",
        ),
        "qgemm_s32/K": (
            cpu.qgemm_s32,
            dict(q=q[:, :8].contiguous(), p=packed, n=40, isa=None),
            ValueError,
            "packed has size 3 in dim 1, expected 2",
        ),
        "qgemm_s32/N": (
            cpu.qgemm_s32,
            dict(q=q, p=packed, n=65, isa=None),
            ValueError,
            "packed has size 1 in dim 0, expected 2",
        ),
        "qgemm_s32/dtype": (
            cpu.qgemm_s32,
            dict(q=x, p=packed, n=40, isa=None),
            TypeError,
            "q has dtype Float",
        ),
        "qlinear/K": (
            cpu.qlinear,
            dict(x=torch.randn(3, 16), p=packed, c=colsum, s=sw, b=None, a=None, i=None),
            ValueError,
            "packed has size 3 in dim 1, expected 4",
        ),
        "qlinear/scales": (
            cpu.qlinear,
            dict(x=x, p=packed, c=colsum, s=torch.ones(70), b=None, a=None, i=None),
            ValueError,
            "packed has size 1 in dim 0, expected 2",
        ),
        "qlinear/colsum": (
            cpu.qlinear,
            dict(x=x, p=packed, c=colsum[:40], s=sw, b=None, a=None, i=None),
            ValueError,
            "colsum has size 40",
        ),
        "qlinear/bias": (
            cpu.qlinear,
            dict(x=x, p=packed, c=colsum, s=sw, b=torch.ones(41), a="gelu", i=None),
            ValueError,
            "bias has size 41",
        ),
        "qlinear/packed layout": (
            cpu.qlinear,
            dict(x=x, p=packed.flatten(), c=colsum, s=sw, b=None, a=None, i=None),
            ValueError,
            "packed must have 4 dimension(s)",
        ),
        "qlinear/isa": (
            cpu.qlinear,
            dict(x=x, p=packed, c=colsum, s=sw, b=None, a=None, i="sse"),
            ValueError,
            "isa='sse' is not one of",
        ),
    }


def _int8_weight(n, k):
    """An int8 [n, k] weight as qlinear takes it: (packed, colsum, w_scale)."""
    w = torch.randint(-127, 128, (n, k), dtype=torch.int32).to(torch.int8)
    packed, colsum = cpu.qgemm_pack(w)
    return packed, colsum, torch.rand(n) * 0.02 + 1e-3


def _layer_int8_args(**over):
    """encoder_layer_int8's arguments: 3 tokens (sequences of 2 and 1), H 8, 2 heads,
    FFN 16; the QKV GEMM split (bit 0), the others not."""
    H, I = 8, 16
    qkv, proj, ffn_in, ffn_out = (_int8_weight(*nk) for nk in ((3 * H, H), (H, H), (I, H), (H, I)))
    args = dict(
        h=torch.randn(3, H), cu=torch.tensor([0, 2, 3], dtype=torch.int32), max_len=2, heads=2,
        scale=0.5, qkv=qkv[0], qkv_c=qkv[1], qkv_s=qkv[2], qkv_b=torch.randn(3 * H),
        proj=proj[0], proj_c=proj[1], proj_s=proj[2], proj_b=torch.randn(H),
        ln1_w=torch.ones(H), ln1_b=torch.zeros(H),
        ffn_in=ffn_in[0], ffn_in_c=ffn_in[1], ffn_in_s=ffn_in[2], ffn_in_b=torch.randn(I),
        act="gelu", ffn_out=ffn_out[0], ffn_out_c=ffn_out[1], ffn_out_s=ffn_out[2],
        ffn_out_b=torch.randn(H), ln2_w=torch.ones(H), ln2_b=torch.zeros(H), eps=1e-12, split=1,
        attention_bf16=False,
    )  # fmt: skip
    args.update(over)
    return args


def _layer_int8_cases():
    """encoder_layer_int8 (csrc/cpu_ops.cpp): its own checks, then each step's, named."""
    if not hasattr(cpu, "encoder_layer_int8"):  # pragma: no cover - a build without int8
        return {}
    L, fn = _layer_int8_args, cpu.encoder_layer_int8
    k9, k12 = _int8_weight(24, 9), _int8_weight(8, 12)
    return {
        "layer8/h dtype": (fn, L(h=torch.randn(3, 8).double()), TypeError, "h has"),
        "layer8/h 3-d": (fn, L(h=torch.randn(1, 3, 8)), ValueError, "h must have 2"),
        "layer8/split": (fn, L(split=16), ValueError, "split must be a 4-bit mask"),
        "layer8/qkv K": (
            fn,
            L(qkv=k9[0], qkv_c=k9[1]),
            ValueError,
            "QKV projection (qlinear): packed has size 3 in dim 1, expected 2",
        ),
        "layer8/qkv colsum": (
            fn,
            L(qkv_c=torch.zeros(8, dtype=torch.int32)),
            ValueError,
            "QKV projection (qlinear): colsum has size 8",
        ),
        "layer8/cu_seqlens": (
            fn,
            L(cu=torch.tensor([0, 2, 5], dtype=torch.int32)),
            IndexError,
            "attention (attention_varlen): cu_seqlens must rise",
        ),
        "layer8/heads": (fn, L(heads=3), ValueError, "attention (attention_varlen)"),
        "layer8/proj scales": (
            fn,
            L(proj_s=torch.ones(70)),
            ValueError,
            "attention output projection (qlinear)",
        ),
        "layer8/ln1 bias": (
            fn,
            L(proj_b=torch.randn(9)),
            ValueError,
            "attention LayerNorm (add_layernorm): bias",
        ),
        "layer8/activation": (fn, L(act="swish"), ValueError, "FFN in (qlinear)"),
        "layer8/ffn_out K": (
            fn,
            L(ffn_out=k12[0], ffn_out_c=k12[1], ffn_out_s=k12[2]),
            ValueError,
            "FFN out (qlinear)",
        ),
        "layer8/ln2 weight": (
            fn,
            L(ln2_w=torch.ones(7)),
            ValueError,
            "FFN LayerNorm (add_layernorm): weight",
        ),
    }


_LAYER_KEYS = ("qkv", "proj", "ffn_in", "ffn_out")


def _forward_args(project=False, int8=False, **over):
    """encoder_forward's (``int8``: encoder_forward_int8's) arguments: 3 packed tokens
    (sequences of 2 and 1), embeddings 8 wide (``project``: 6 wide, projected to 8),
    two layers as ``_layer_args`` / ``_layer_int8_args`` make them."""
    E = 6 if project else 8
    args = dict(
        input_ids=torch.tensor([1, 2, 3]), position_ids=torch.tensor([0, 1, 0]),
        token_type_ids=torch.tensor([0, 1, 0]), word=torch.randn(10, E), pos=torch.randn(6, E),
        types=torch.randn(2, E), emb_ln_w=torch.ones(E), emb_ln_b=torch.zeros(E),
        project=cpu.linear_pack(torch.randn(8, E), True) if project else None,
        project_b=torch.randn(8) if project else None, hidden=8,
        cu=torch.tensor([0, 2, 3], dtype=torch.int32), max_len=2, heads=2, scale=0.5,
    )  # fmt: skip
    layers = [(_layer_int8_args if int8 else _layer_args)() for _ in range(2)]
    parts = ("", "_c", "_s") if int8 else ("",)
    args["gemms"] = [L[k + p] for L in layers for k in _LAYER_KEYS for p in parts]
    args["biases"] = [L[k + "_b"] for L in layers for k in _LAYER_KEYS]
    args["norms"] = [L[k] for L in layers for k in ("ln1_w", "ln1_b", "ln2_w", "ln2_b")]
    if int8:
        args.update(splits=[L["split"] for L in layers], act="gelu", eps=1e-12)
    else:
        args.update(inter=16, act="gelu", eps=1e-12, a=True)
    args.update(over)
    return args


def _forward_cases():
    """encoder_forward / encoder_forward_int8 (csrc/cpu_ops.cpp): their own checks,
    then each step's, named by the layer and the step."""
    out = {}
    kinds = [("forward", cpu.encoder_forward, False)]
    if hasattr(cpu, "encoder_forward_int8"):
        kinds.append(("forward8", cpu.encoder_forward_int8, True))
    for tag, fn, int8 in kinds:
        per = 12 if int8 else 4

        def F(int8=int8, **over):
            return _forward_args(int8=int8, **over)

        a = F()
        bad_qkv = (
            (_int8_weight(24, 9)[0],) if int8 else (cpu.linear_pack(torch.randn(24, 9), True),)
        )
        out |= {
            f"{tag}/ids 2-d": (
                fn,
                F(input_ids=torch.tensor([[1, 2, 3]]), position_ids=torch.tensor([[0, 1, 0]])),
                ValueError,
                "input_ids must have 1 dimension",
            ),
            f"{tag}/embeddings": (
                fn,
                F(emb_ln_w=torch.ones(7)),
                ValueError,
                "embeddings (embed_layernorm)",
            ),
            f"{tag}/hidden without project": (
                fn,
                F(hidden=16),
                ValueError,
                "the embeddings are 8 wide, hidden is 16",
            ),
            f"{tag}/hidden negative": (fn, F(hidden=-1), ValueError, "hidden must be >= 0"),
            f"{tag}/project_bias alone": (
                fn,
                F(project_b=torch.randn(8)),
                ValueError,
                "project_bias given without project",
            ),
            f"{tag}/project panels": (
                fn,
                F(
                    project=True,
                    word=torch.randn(10, 5),
                    pos=torch.randn(6, 5),
                    types=torch.randn(2, 5),
                    emb_ln_w=torch.ones(5),
                    emb_ln_b=torch.zeros(5),
                ),
                ValueError,
                "embedding projection (linear_packed)",
            ),  # fmt: skip
            f"{tag}/gemms count": (
                fn,
                F(gemms=a["gemms"][:-1]),
                ValueError,
                f"gemms must hold {per} tensors a layer, got {2 * per - 1}",
            ),
            f"{tag}/biases count": (
                fn,
                F(biases=a["biases"][:4]),
                ValueError,
                "biases must hold 4 tensors a layer (8 for the 2 layers of gemms), got 4",
            ),
            f"{tag}/norms count": (
                fn,
                F(norms=a["norms"] + a["norms"]),
                ValueError,
                "norms must hold 4 tensors a layer (8 for the 2 layers of gemms), got 16",
            ),
            f"{tag}/layer 1 QKV": (
                fn,
                F(gemms=a["gemms"][:per] + list(bad_qkv) + a["gemms"][per + 1 :]),
                ValueError,
                "layer 1 (encoder_layer" + ("_int8" if int8 else "") + "): QKV projection",
            ),
            f"{tag}/layer 0 LayerNorm": (
                fn,
                F(norms=[torch.ones(7)] + a["norms"][1:]),
                ValueError,
                "layer 0 (encoder_layer" + ("_int8" if int8 else "") + "): attention LayerNorm",
            ),
            f"{tag}/cu_seqlens": (
                fn,
                F(cu=torch.tensor([0, 2, 5], dtype=torch.int32)),
                IndexError,
                "layer 0 (encoder_layer" + ("_int8" if int8 else "") + "): attention",
            ),
        }
        if int8:
            out[f"{tag}/splits count"] = (
                fn,
                F(splits=[0]),
                ValueError,
                "splits must hold one mask a layer (2), got 1",
            )
            out[f"{tag}/split mask"] = (fn, F(splits=[0, 16]), ValueError, "layer 1")
    return out


def _pool_args(**over):
    """pool_packed's arguments: 5 rows of width 8 in sequences of 2 and 3, mean."""
    return dict(
        h=torch.randn(5, 8), cu=torch.tensor([0, 2, 5], dtype=torch.int32), mode="mean",
        normalize=True,
    ) | over  # fmt: skip


def _pool_cases():
    """pool_packed (csrc/cpu_ops.cpp): every size and value the kernel relies on."""
    P, fn = _pool_args, cpu.pool_packed
    return {
        "pool/h dtype": (fn, P(h=torch.randn(5, 8).double()), TypeError, "h has dtype"),
        "pool/h 3-d": (fn, P(h=torch.randn(1, 5, 8)), ValueError, "h must have 2"),
        "pool/h strided": (fn, P(h=torch.randn(8, 5).t()), ValueError, "h must be contiguous"),
        "pool/cu dtype": (fn, P(cu=torch.tensor([0, 2, 5])), TypeError, "cu_seqlens has dtype"),
        "pool/cu 2-d": (
            fn,
            P(cu=torch.tensor([[0, 2, 5]], dtype=torch.int32)),
            ValueError,
            "cu_seqlens must have 1",
        ),
        "pool/no sequence": (
            fn,
            P(cu=torch.tensor([0], dtype=torch.int32)),
            ValueError,
            "at least 2 entries",
        ),
        "pool/cu past the rows": (
            fn,
            P(cu=torch.tensor([0, 2, 6], dtype=torch.int32)),
            IndexError,
            "rise from 0 to the row count 5",
        ),
        "pool/cu from 1": (
            fn,
            P(cu=torch.tensor([1, 2, 5], dtype=torch.int32)),
            IndexError,
            "rise from 0",
        ),
        "pool/empty sequence": (
            fn,
            P(cu=torch.tensor([0, 2, 2, 5], dtype=torch.int32)),
            ValueError,
            "sequence 1 has no row",
        ),
        "pool/falling": (
            fn,
            P(cu=torch.tensor([0, 4, 2, 5], dtype=torch.int32)),
            ValueError,
            "sequence 1 has no row",
        ),
        "pool/mode": (fn, P(mode="max"), ValueError, "unknown pooling mode 'max'"),
    }


def _bf16_args(**over):
    """blinear's arguments: x [3, 70] bf16, a [40, 70] weight packed ([2, 48, 32, 2])."""
    B = torch.bfloat16
    args = dict(
        x=torch.randn(3, 70).to(B), p=cpu.bgemm_pack(torch.randn(40, 70).to(B)),
        b=torch.randn(40).to(B), n=40, act="gelu", isa=None,
    )  # fmt: skip
    args.update(over)
    return args


def _bf16_cases():
    """The bf16 GEMM entry points (kernels/cpu/bgemm.cpp, csrc/cpu_bf16_ops.cpp)."""
    if not hasattr(cpu, "blinear"):  # pragma: no cover - a build without them
        return {}
    A, fn, B = _bf16_args, cpu.blinear, torch.bfloat16
    packed = A()["p"]
    out = {
        "blinear/x dtype": (
            fn,
            A(x=torch.randn(3, 70)),
            TypeError,
            "x has dtype Float, expected BFloat16",
        ),
        "blinear/0-D x": (fn, A(x=torch.tensor(1.0, dtype=B)), ValueError, "x must have at least"),
        "blinear/x strided": (
            fn,
            A(x=torch.randn(70, 3).to(B).t()),
            ValueError,
            "x must be contiguous",
        ),
        "blinear/packed dtype": (
            fn,
            A(p=packed.float()),
            TypeError,
            "packed has dtype Float, expected BFloat16",
        ),
        "blinear/packed 3-D": (
            fn,
            A(p=packed.flatten(2)),
            ValueError,
            "packed must have 4 dimension(s), got shape (2, 48, 64)",
        ),
        "blinear/packed meta": (
            fn,
            A(p=torch.empty(2, 48, 32, 2, dtype=B, device="meta")),
            ValueError,
            "packed is on meta",
        ),
        "blinear/out_features above the panels": (
            fn,
            A(n=65, b=None),
            ValueError,
            "packed has size 2 in dim 0, expected 3 (32-column panels for out_features)",
        ),
        "blinear/out_features below the panels": (
            fn,
            A(n=32, b=None),
            ValueError,
            "packed has size 2 in dim 0, expected 1",
        ),
        "blinear/K above": (
            fn,
            A(x=torch.randn(3, 100).to(B)),
            ValueError,
            "packed has size 48 in dim 1, expected 64 (x's last dimension rounded up to 32",
        ),
        "blinear/K below": (
            fn,
            A(x=torch.randn(3, 64).to(B)),
            ValueError,
            "packed has size 48 in dim 1, expected 32",
        ),
        "blinear/panel width": (
            fn,
            A(p=torch.zeros(2, 48, 16, 4, dtype=B)),
            ValueError,
            "packed has size 16 in dim 2, expected 32 (panel width)",
        ),
        "blinear/k pair": (
            fn,
            A(p=torch.zeros(2, 48, 32, 1, dtype=B)),
            ValueError,
            "packed has size 1 in dim 3, expected 2 (bf16 per k pair)",
        ),
        "blinear/bias size": (
            fn,
            A(b=torch.randn(41).to(B)),
            ValueError,
            "bias has size 41 in dim 0, expected 40 (out_features)",
        ),
        "blinear/bias dtype": (
            fn,
            A(b=torch.randn(40)),
            TypeError,
            "bias has dtype Float, expected BFloat16",
        ),
        "blinear/bias 2-D": (
            fn,
            A(b=torch.randn(1, 40).to(B)),
            ValueError,
            "bias must have 1 dimension(s)",
        ),
        "blinear/negative out_features": (
            fn,
            A(n=-1, b=None),
            ValueError,
            "out_features must be >= 0, got -1",
        ),
        "blinear/activation": (
            fn,
            A(act="swish"),
            ValueError,
            "unknown activation 'swish'; expected gelu, gelu_tanh or relu (or None)",
        ),
        "blinear/isa": (fn, A(isa="avx9"), ValueError, "isa='avx9' is not one of auto, amx"),
        "bgemm_pack/1-D": (
            cpu.bgemm_pack,
            dict(w=torch.randn(40).to(B)),
            ValueError,
            "weight must have 2 dimension(s), got shape (40,)",
        ),
        "bgemm_pack/3-D": (
            cpu.bgemm_pack,
            dict(w=torch.randn(2, 40, 70).to(B)),
            ValueError,
            "weight must have 2 dimension(s)",
        ),
        "bgemm_pack/float32": (
            cpu.bgemm_pack,
            dict(w=torch.randn(40, 70)),
            TypeError,
            "weight has dtype Float, expected BFloat16",
        ),
        "bgemm_pack/float16": (
            cpu.bgemm_pack,
            dict(w=torch.randn(40, 70).half()),
            TypeError,
            "weight has dtype Half",
        ),
        "bgemm_pack/strided": (
            cpu.bgemm_pack,
            dict(w=torch.randn(70, 40).to(B).t()),
            ValueError,
            "weight must be contiguous",
        ),
        "bf16_gemm_isa/isa": (
            cpu.bf16_gemm_isa,
            dict(isa="avx9"),
            ValueError,
            "isa='avx9' is not one of auto, amx, portable",
        ),
    }
    if cpu.bf16_gemm_isa("auto") != "amx":  # pragma: no cover - CPUs without AMX-BF16
        out["blinear/amx unavailable"] = (fn, A(isa="amx"), ValueError, "no AMX-BF16")
    return out


def _scan_args(**over):
    """scan_inputs' arguments: ids [2, 3], an int64 mask, types and positions."""
    return dict(
        ids=torch.tensor([[5, 6, 7], [8, 9, 1]]), mask=torch.tensor([[1, 1, 0], [1, 0, 0]]),
        types=torch.zeros(2, 3, dtype=torch.long), pos=torch.arange(3).expand(2, 3).contiguous(),
    ) | over  # fmt: skip


def _scan_cases():
    """scan_inputs (csrc/cpu_ops.cpp): every dtype and shape the kernel relies on."""
    A, fn = _scan_args, cpu.scan_inputs
    return {
        "scan/ids dtype": (fn, A(ids=torch.ones(2, 3, dtype=torch.int32)), TypeError, "input_ids"),
        "scan/ids 1-d": (fn, A(ids=torch.ones(3, dtype=torch.long)), ValueError, "must have 2"),
        "scan/ids strided": (
            fn,
            A(ids=torch.ones(3, 2, dtype=torch.long).t()),
            ValueError,
            "input_ids must be contiguous",
        ),
        "scan/mask shape": (
            fn,
            A(mask=torch.ones(2, 4, dtype=torch.long)),
            ValueError,
            "attention_mask has shape (2, 4), expected (2, 3)",
        ),
        "scan/mask dtype": (
            fn,
            A(mask=torch.ones(2, 3)),
            TypeError,
            "expected int64, int32 or bool",
        ),
        "scan/mask strided": (
            fn,
            A(mask=torch.ones(3, 2, dtype=torch.long).t()),
            ValueError,
            "attention_mask must be contiguous",
        ),
        "scan/types shape": (
            fn,
            A(types=torch.zeros(2, 2, dtype=torch.long)),
            ValueError,
            "token_type_ids has shape",
        ),
        "scan/types dtype": (
            fn,
            A(types=torch.zeros(2, 3, dtype=torch.int32)),
            TypeError,
            "token_type_ids has dtype",
        ),
        "scan/positions shape": (
            fn,
            A(pos=torch.zeros(3, 2, dtype=torch.long)),
            ValueError,
            "position_ids has shape",
        ),
        "scan/positions device": (
            fn,
            A(pos=torch.zeros(2, 3, dtype=torch.long, device="meta")),
            ValueError,
            "position_ids is on meta",
        ),
    }


def _held_cases():
    """encoder_hold / encoder_forward_held (csrc/cpu_ops.cpp): the lists' counts at
    hold, an unknown handle and bf16 attention on fp32 operands at the call."""
    out = {}
    if not hasattr(cpu, "encoder_hold"):  # pragma: no cover - every build has it
        return out

    def hold_args(int8=False, **over):
        a = _forward_args(int8=int8)
        args = {k: a[k] for k in ("word", "pos", "types", "emb_ln_w", "emb_ln_b", "project")}
        args |= dict(project_b=a["project_b"], gemms=a["gemms"], biases=a["biases"])
        args |= dict(norms=a["norms"], splits=a.get("splits"))
        args.update(over)
        return args

    def call_args(handle, **over):
        a = _forward_args()
        args = {k: a[k] for k in ("input_ids", "position_ids", "token_type_ids")}
        args |= dict(handle=handle, hidden=8, cu=a["cu"], max_len=2, heads=2, scale=0.5)
        args |= dict(inter=16, act="gelu", eps=1e-12, bf16=False, a=True)
        args.update(over)
        return args

    fp32 = cpu.encoder_hold(*hold_args().values())  # held for the process: a few KB
    gemms = hold_args()["gemms"]
    out["held/hold gemms count"] = (
        cpu.encoder_hold,
        hold_args(gemms=gemms[:-1]),
        ValueError,
        "gemms must hold 4 tensors a layer, got 7",
    )
    if hasattr(cpu, "encoder_forward_int8"):
        out["held/hold splits count"] = (
            cpu.encoder_hold,
            hold_args(int8=True, splits=[0]),
            ValueError,
            "splits must hold one mask a layer (2), got 1",
        )
    out["held/unknown handle"] = (
        cpu.encoder_forward_held,
        call_args(-1),
        ValueError,
        "no operands are held under handle -1",
    )
    out["held/bf16 attention on fp32"] = (
        cpu.encoder_forward_held,
        call_args(fp32, bf16=True),
        ValueError,
        "attention in bfloat16 is for int8 operands only",
    )
    return out


ALL_CASES = {
    **CASES,
    **_packed_cases(),
    **_layer_cases(),
    **_int8_cases(),
    **_layer_int8_cases(),
    **_forward_cases(),
    **_pool_cases(),
    **_scan_cases(),
    **_held_cases(),
    **_bf16_cases(),
}


@pytest.mark.parametrize("case", sorted(ALL_CASES))
def test_inconsistent_arguments_raise(case):
    fn, kwargs, exc, text = ALL_CASES[case]
    with pytest.raises(exc) as info:
        _call(fn, kwargs)
    msg = str(info.value)
    assert msg.startswith(f"bertfast._C.cpu.{fn.__name__}: "), msg
    assert text in msg, msg


def test_every_entry_point_is_covered():
    entry_points = {
        name for name in dir(cpu) if not name.startswith("_") and callable(getattr(cpu, name))
    }
    covered = {fn.__name__ for fn, *_ in ALL_CASES.values()}
    # linear_panel_width takes only a bool, int8_isa only a name: they read nothing.
    # The step profile's two functions take no argument.
    # encoder_release takes only a handle (an unknown one gives False).
    exempt = {"linear_panel_width", "step_profile_start", "step_profile_stop", "encoder_release"}
    exempt |= {"int8_isa"} if hasattr(cpu, "int8_isa") else set()
    assert entry_points - covered == exempt


@pytest.mark.parametrize(
    "fn,args",
    [
        ("add_layernorm", ([1.0], torch.randn(2), None, torch.ones(2), torch.zeros(2), 1e-5)),
        ("pack_rows", (torch.randn(2, 2), [0, 1])),
        ("bias_act", (torch.randn(2, 2), None, 3, False)),
    ],
)
def test_non_tensors_are_type_errors(fn, args):
    with pytest.raises(TypeError, match=fn):
        getattr(cpu, fn)(*args)


def test_out_of_range_ids_give_nan_rows_not_reads():
    # Bounds-safe kernel: each id is held against its own table (word, position, type).
    a = _embed_args(
        input_ids=torch.tensor([[1, 10, 2, 3]]),
        position_ids=torch.tensor([[0, 1, 6, 2]]),
        token_type_ids=torch.tensor([[0, 0, 0, 2]]),
    )
    out = _call(cpu.embed_layernorm, a)
    assert out.shape == (1, 4, 8)
    assert torch.isfinite(out[0, 0]).all()
    assert out[0, 1:].isnan().all()


def test_valid_calls_match_torch():
    # The same entry points with consistent arguments: the checks let them through.
    x = torch.randn(3, 8)
    a = _ln_args(x=x)
    ours = _call(cpu.add_layernorm, a)
    gold = torch.nn.functional.layer_norm(
        a["x"] + a["bias"] + a["residual"], (8,), a["weight"], a["ln_bias"], 1e-5
    )
    torch.testing.assert_close(ours, gold, atol=1e-5, rtol=1e-5)
    y = cpu.bias_act(x.clone(), None, "relu", True)
    assert torch.equal(y, torch.relu(x))
    idx = torch.tensor([2, 0])
    assert torch.equal(cpu.pack_rows(x, idx), x[idx])
    back = cpu.unpack_rows(x[idx], idx, 4)
    assert torch.equal(back[idx], x[idx]) and (back[[1, 3]] == 0).all()
    w, b = torch.randn(40, 8), torch.randn(40)
    out = cpu.linear_packed(x, cpu.linear_pack(w, True), b, 40, None, True)
    torch.testing.assert_close(out, torch.nn.functional.linear(x, w, b), atol=1e-5, rtol=1e-5)


def _layer_args_bf16(**over):
    """``_layer_args`` for a bf16 layer: bf16 tokens, weights packed for blinear
    (``bgemm_pack``), bf16 biases and LayerNorms."""
    a = _layer_args()
    B = torch.bfloat16
    bf = {k: v.to(B) for k, v in a.items() if isinstance(v, torch.Tensor) and v.is_floating_point()}
    a.update(bf)
    for k, (n, kk) in zip(_LAYER_KEYS, ((24, 8), (8, 8), (16, 8), (8, 16)), strict=True):
        a[k] = cpu.bgemm_pack(torch.randn(n, kk).to(B))
    a.update(over)
    return a


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_encoder_layer_is_its_steps(dtype):
    """A valid encoder_layer call (run under the sanitizers too) equals its steps: on
    fp32 tokens linear_packed, on bf16 tokens blinear for each GEMM."""
    if dtype == "bf16" and not hasattr(cpu, "blinear"):  # pragma: no cover
        pytest.skip("a build without the bf16 GEMM")
    a = _layer_args() if dtype == "fp32" else _layer_args_bf16()
    got = _call(cpu.encoder_layer, a)
    assert got.dtype == a["h"].dtype

    def gemm(x, w, b, n, act):
        if dtype == "bf16":
            return cpu.blinear(x, w, b, n, act, None)
        return cpu.linear_packed(x, w, b, n, act, True)

    y = gemm(a["h"], a["qkv"], a["qkv_b"], 24, None)
    ctx = cpu.attention_varlen(y, a["cu"], a["max_len"], a["heads"], a["scale"])
    x = gemm(ctx, a["proj"], None, 8, None)
    h1 = cpu.add_layernorm(x, a["h"], a["proj_b"], a["ln1_w"], a["ln1_b"], a["eps"])
    f = gemm(h1, a["ffn_in"], a["ffn_in_b"], 16, "gelu")
    o = gemm(f, a["ffn_out"], None, 8, None)
    want = cpu.add_layernorm(o, h1, a["ffn_out_b"], a["ln2_w"], a["ln2_b"], a["eps"])
    assert torch.equal(got, want)


def test_encoder_layer_bf16_takes_bf16_panels_only():
    """bf16 tokens with the fp32 GEMM's panels (or fp32 tokens with bf16 panels): the
    step that reads them names the mismatch, nothing is computed on the wrong layout."""
    if not hasattr(cpu, "blinear"):  # pragma: no cover
        pytest.skip("a build without the bf16 GEMM")
    fp32 = _layer_args()
    with pytest.raises(TypeError, match=r"QKV projection \(blinear\): packed has dtype Float"):
        _call(cpu.encoder_layer, _layer_args_bf16(qkv=fp32["qkv"]))
    with pytest.raises(TypeError, match=r"QKV projection \(linear_packed\): packed has dtype"):
        _call(cpu.encoder_layer, dict(fp32, qkv=_layer_args_bf16()["qkv"]))
    with pytest.raises(TypeError, match="attention LayerNorm"):
        _call(cpu.encoder_layer, _layer_args_bf16(ln1_w=fp32["ln1_w"]))


def _attend(y, a, bf16):
    """attention_varlen on fp32 QKV ``y``, or (``bf16``) on ``y.to(bfloat16)`` with
    the output cast back to fp32, as the int8 layer's op-by-op path runs it."""
    if not bf16:
        return cpu.attention_varlen(y, a["cu"], a["max_len"], a["heads"], a["scale"])
    ctx = cpu.attention_varlen(y.to(torch.bfloat16), a["cu"], a["max_len"], a["heads"], a["scale"])
    return ctx.to(torch.float32)


@pytest.mark.skipif(not hasattr(cpu, "encoder_layer_int8"), reason="a build without int8")
@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("split", [0, 1, 0b1010, 15])
def test_encoder_layer_int8_is_its_steps(split, bf16):
    """A valid encoder_layer_int8 call (run under the sanitizers too) equals its steps:
    qlinear (each GEMM's split flag from its bit), attention_varlen (on bf16 casts of
    Q, K, V when attention_bf16), add_layernorm."""
    a = _layer_int8_args(split=split, attention_bf16=bf16)
    got = _call(cpu.encoder_layer_int8, a)
    bit = [bool(split >> g & 1) for g in range(4)]
    y = cpu.qlinear(a["h"], a["qkv"], a["qkv_c"], a["qkv_s"], a["qkv_b"], None, None, bit[0])
    ctx = _attend(y, a, bf16)
    x = cpu.qlinear(ctx, a["proj"], a["proj_c"], a["proj_s"], None, None, None, bit[1])
    h1 = cpu.add_layernorm(x, a["h"], a["proj_b"], a["ln1_w"], a["ln1_b"], a["eps"])
    f = cpu.qlinear(
        h1, a["ffn_in"], a["ffn_in_c"], a["ffn_in_s"], a["ffn_in_b"], "gelu", None, bit[2]
    )
    o = cpu.qlinear(f, a["ffn_out"], a["ffn_out_c"], a["ffn_out_s"], None, None, None, bit[3])
    want = cpu.add_layernorm(o, h1, a["ffn_out_b"], a["ln2_w"], a["ln2_b"], a["eps"])
    assert torch.equal(got, want)
    if split:  # the mask reaches the GEMMs: a split GEMM's activations carry more bits
        assert not torch.equal(got, _call(cpu.encoder_layer_int8, dict(a, split=0)))
    # the flag reaches attention: bf16 casts of Q, K, V change the result
    assert not torch.equal(got, _call(cpu.encoder_layer_int8, dict(a, attention_bf16=not bf16)))


def _forward_steps(a, int8):
    """encoder_forward's steps called one by one: embed_layernorm (+ linear_packed for
    the projection), then each layer's entry point."""
    h = cpu.embed_layernorm(
        a["input_ids"], a["position_ids"], a["token_type_ids"], a["word"], a["pos"],
        a["types"], a["emb_ln_w"], a["emb_ln_b"], a["eps"],
    )  # fmt: skip
    if a["project"] is not None:
        h = cpu.linear_packed(h, a["project"], a["project_b"], 8, None, True)
    per = 12 if int8 else 4
    for i in range(2):
        g, b, n = a["gemms"][per * i :], a["biases"][4 * i :], a["norms"][4 * i :]
        common = (h, a["cu"], a["max_len"], a["heads"], a["scale"])
        if int8:
            h = cpu.encoder_layer_int8(
                *common, *g[0:3], b[0], *g[3:6], b[1], n[0], n[1], *g[6:9], b[2], a["act"],
                *g[9:12], b[3], n[2], n[3], a["eps"], a["splits"][i], a["attention_bf16"],
            )  # fmt: skip
        else:
            h = cpu.encoder_layer(
                *common, g[0], b[0], g[1], b[1], n[0], n[1], g[2], b[2], a["inter"], a["act"],
                g[3], b[3], n[2], n[3], a["eps"], True,
            )  # fmt: skip
    return h


@pytest.mark.parametrize("project", [False, True])
@pytest.mark.parametrize("int8", [False, True, "bf16 attention"])
def test_encoder_forward_is_its_steps(project, int8):
    """A valid encoder_forward / encoder_forward_int8 call (run under the sanitizers
    too) equals its steps called one by one, bit for bit; the layers are applied in
    the order given (two layers swapped give another result)."""
    if int8 and not hasattr(cpu, "encoder_forward_int8"):  # pragma: no cover
        pytest.skip("a build without int8")
    fn = cpu.encoder_forward_int8 if int8 else cpu.encoder_forward
    a = _forward_args(project=project, int8=bool(int8))
    if int8:
        a["attention_bf16"] = int8 == "bf16 attention"
    got = _call(fn, a)
    assert got.shape == (3, 8)
    assert torch.equal(got, _forward_steps(a, int8))
    per = 12 if int8 else 4
    swapped = dict(
        a,
        gemms=a["gemms"][per:] + a["gemms"][:per],
        biases=a["biases"][4:] + a["biases"][:4],
        norms=a["norms"][4:] + a["norms"][:4],
    )
    if int8:
        swapped["splits"] = a["splits"][::-1]
    assert not torch.equal(got, _call(fn, swapped))


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("mode", ["cls", "mean", "mean_sqrt_len", "lasttoken"])
def test_pool_packed_matches_torch(mode, normalize):
    """pool_packed against torch on the same rows (run under the sanitizers too):
    ragged sequences, one of a single row; NaN in a row stays in its sequence."""
    g = torch.Generator().manual_seed(0)
    lengths = [3, 1, 6, 2]
    h = torch.randn(sum(lengths), 16, generator=g)
    cu = torch.tensor([0, 3, 4, 10, 12], dtype=torch.int32)
    rows = list(torch.split(h, lengths))
    want = torch.stack(
        [
            r[0] if mode == "cls" else r[-1] if mode == "lasttoken"
            else r.sum(0) / (len(r) if mode == "mean" else len(r) ** 0.5)
            for r in rows
        ]
    )  # fmt: skip
    if normalize:
        want = torch.nn.functional.normalize(want, p=2.0, dim=-1)
    got = cpu.pool_packed(h, cu, mode, normalize)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    h[5, 3] = float("nan")  # a row of the third sequence
    got = cpu.pool_packed(h, cu, mode, normalize)
    assert got[[0, 1, 3]].isfinite().all()
    if mode in ("mean", "mean_sqrt_len"):  # the NaN row is summed: NaN where it was,
        assert got[2, 3].isnan()  # and everywhere once normalised (its norm is NaN)
        assert got[2].isnan().all() == normalize
    else:  # cls / lasttoken take rows 4 and 9
        assert got[2].isfinite().all()
    zero = cpu.pool_packed(torch.zeros(2, 4), cu[:2].clamp(max=2), mode, normalize)
    assert torch.equal(zero, torch.zeros(1, 4))  # a zero vector stays zero (no 0 / 0)


@pytest.mark.parametrize("mask_dtype", [None, torch.int64, torch.int32, torch.bool])
def test_scan_inputs_matches_torch(mask_dtype):
    """scan_inputs against torch on the same inputs (run under the sanitizers too): a
    mask with right and left padding, a hole, a row with no real token and a full row;
    the ids' extremes at the first and last positions; no mask: every position real."""
    g = torch.Generator().manual_seed(0)
    B, S = 5, 7
    ids = torch.randint(100, 200, (B, S), generator=g)
    ids[0, 0], ids[-1, -1] = 3, 999
    types = torch.randint(0, 2, (B, S), generator=g)
    pos = torch.randint(0, 50, (B, S), generator=g)
    mask = torch.tensor(
        [
            [1, 1, 1, 0, 0, 0, 0],
            [0, 0, 1, 1, 1, 1, 1],
            [1, 0, 1, 0, 1, 0, 1],
            [0, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, 1, 1, 1],
        ]
    )
    given = None if mask_dtype is None else mask.to(mask_dtype)
    stats, cu, indices = cpu.scan_inputs(ids, given, types, pos)
    keep = mask.flatten() != 0 if mask_dtype is not None else torch.ones(B * S, dtype=torch.bool)
    lengths = keep.view(B, S).sum(1)
    want = [ids.min(), ids.max(), types.min(), types.max(), pos.min(), pos.max()]
    want += [lengths.sum(), lengths.max()]
    assert stats.tolist() == [int(v) for v in want]
    assert cu.dtype == torch.int32 and cu.tolist() == [0, *lengths.cumsum(0).tolist()]
    assert indices.tolist() == keep.nonzero().squeeze(1).tolist()
    # without token types and positions their pairs are zeros
    stats, _, _ = cpu.scan_inputs(ids, given, None, None)
    assert stats.tolist()[2:6] == [0, 0, 0, 0]


@pytest.mark.parametrize("int8", [False, True])
def test_held_operands_run_as_the_lists(int8):
    """encoder_forward_held on operands held by encoder_hold gives the list call's
    result bit for bit; a step's error names the layer and step as there; after
    encoder_release the handle is unknown (ValueError), and a second release is False."""
    if int8 and not hasattr(cpu, "encoder_forward_int8"):  # pragma: no cover
        pytest.skip("no int8 kernels in this build")
    a = _forward_args(int8=int8)
    lists = cpu.encoder_forward_int8 if int8 else cpu.encoder_forward
    want = _call(lists, a)
    handle = cpu.encoder_hold(
        a["word"], a["pos"], a["types"], a["emb_ln_w"], a["emb_ln_b"], a["project"],
        a["project_b"], a["gemms"], a["biases"], a["norms"], a["splits"] if int8 else None,
    )  # fmt: skip

    def held(max_len=2):
        args = [a["input_ids"], a["position_ids"], a["token_type_ids"], handle, 8, a["cu"]]
        args += [max_len, 2, 0.5, 16, "gelu", 1e-12, False, True]
        return cpu.encoder_forward_held(*args)

    assert torch.equal(held(), want)
    with pytest.raises(ValueError, match=r"layer 0 \(encoder_layer(_int8)?\): attention"):
        held(max_len=1)  # a step's error, as the list call names it
    assert cpu.encoder_release(handle) is True
    with pytest.raises(ValueError, match=f"no operands are held under handle {handle}"):
        held()
    assert cpu.encoder_release(handle) is False
