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
        dict(
            qkv=torch.randn(6, 96),
            cu=torch.tensor([0, 4, 9], dtype=torch.int32),
            max_seqlen=6,
            heads=1,
            scale=0.1,
        ),
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


ALL_CASES = {**CASES, **_packed_cases()}


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
    # linear_panel_width takes only a bool and reads nothing.
    assert entry_points - covered == {"linear_panel_width"}


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
