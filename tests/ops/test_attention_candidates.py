"""Every candidate of ``attention`` / ``attention_varlen`` (and ``linear_gelu``) that
``dispatch.candidates`` lists, run and held to the parity rule; forced launch configs and
the errors for bad ones.

On this machine (no GPU) the candidates on CPU tensors are the ``cpu`` backend, the
``torch`` reference, ``torch:sdpa`` (bertfast/ops/sdpa.py) and, under the Triton
interpreter (tests/conftest.py), ``triton`` with the autotuner and with each config
its ``configs`` lists forced; more Triton configs are forced directly to cross tile
edges. On a GPU the same tests run on CUDA tensors, with every config of the GPU's
list. Shapes stay small: the interpreter runs every program in Python.
"""

from __future__ import annotations

import pytest
import torch

from bertfast.ops import dispatch, reference, sdpa

from .harness import DOT_OPS, DTYPES, HAS_CUDA, INTERPRETED, assert_within_rule

DEV = torch.device("cuda" if HAS_CUDA else "cpu")
SCALE_OF = {32: 32**-0.5, 64: 0.125, 80: 80**-0.5}

#: Triton configs forced on top of the listed ones: tiles of 16 (one below every
#: listed tile), a tall and a wide one, so sequence lengths 1, 16, 17, 32, 33 cross
#: BLOCK_M and BLOCK_N edges both ways.
EXTRA_ATTENTION_CONFIGS = [
    {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 1, "num_stages": 1},
    {"BLOCK_M": 64, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2},
    {"BLOCK_M": 16, "BLOCK_N": 64, "num_warps": 2, "num_stages": 2},
]
EXTRA_LINEAR_CONFIGS = [
    {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 2, "num_warps": 2, "num_stages": 1},
    {"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 32, "GROUP_M": 1, "num_warps": 4, "num_stages": 2},
]


def _known_gap(op: str, backend: str, dtype: torch.dtype) -> bool:
    """The interpreter's bf16 tl.dot (harness.skip_known_gaps: checked on a GPU)."""
    return backend == "triton" and INTERPRETED and dtype == torch.bfloat16 and op in DOT_OPS


def _cast(args, dtype):
    return tuple(
        a.to(device=DEV, dtype=dtype) if isinstance(a, torch.Tensor) and a.is_floating_point()
        else a.to(DEV) if isinstance(a, torch.Tensor)
        else a
        for a in args
    )  # fmt: skip


def _run_all(op, args, dtype, extra=()):
    """Run every candidate (and ``extra`` forced Triton configs) on ``args`` in ``dtype``,
    each held to the parity rule; returns {label: output}."""
    gold = getattr(reference, op)(*_cast(args, torch.float64))
    same = getattr(reference, op)(*_cast(args, dtype))
    typed = _cast(args, dtype)
    found = dispatch.candidates(op, DEV.type, dtype, typed, with_configs=True)
    labels = [c.label for c in found]
    assert "torch" in labels, labels
    if op.startswith("attention"):
        assert "torch:sdpa" in labels, labels
    if INTERPRETED and not HAS_CUDA and "triton" in labels:
        # the interpreter's list: one config, forced as a candidate of its own
        assert sum(c.backend == "triton" and bool(c.config) for c in found) == 1, labels
    if any(c.backend == "triton" for c in found):
        found += [dispatch.Candidate.make(op, "triton", config=cfg) for cfg in extra]
    outs = {}
    for cand in found:
        if _known_gap(op, cand.backend, dtype):
            continue
        out = dispatch.implementation(cand)(*typed)
        assert out.dtype == dtype, f"{cand.label}: {out.dtype}"
        assert_within_rule(op, f"{op}[{cand.label}]", out, gold, same, dtype)
        outs[cand.label] = out
    return outs


# ---------------------------------------------------------------------- padded
def _padded_case(head_dim, S=40, heads=2):
    mask = torch.ones(5, S, dtype=torch.int64)
    mask[0, 23:] = 0  # right padding
    mask[1, :30] = 0  # left padding
    mask[2, 5:9] = 0  # holes
    mask[2, 33:] = 0
    mask[3, :] = 0  # an all-masked row
    mask[4, 1:] = 0  # one real token
    qkv = torch.randn(5, S, 3 * heads * head_dim)
    return qkv, mask, heads


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [32, 64, 80])
def test_padded_every_candidate(dtype, head_dim):
    qkv, mask, heads = _padded_case(head_dim)
    extra = EXTRA_ATTENTION_CONFIGS if head_dim == 80 else ()
    outs = _run_all("attention", (qkv, mask, heads, SCALE_OF[head_dim]), dtype, extra)
    pad = ~mask.bool().to(DEV)
    for label, out in outs.items():
        # padded query rows, and every row of the all-masked sequence, are exactly zero
        assert (out[pad] == 0).all(), label


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_padded_no_mask_every_candidate(dtype):
    qkv = torch.randn(2, 24, 3 * 2 * 64)
    _run_all("attention", (qkv, None, 2, 0.125), dtype, EXTRA_ATTENTION_CONFIGS[:1])


# ---------------------------------------------------------------------- varlen
#: Ragged lengths: 1, an empty sequence, and either side of 16 / 32 (BLOCK_M and
#: BLOCK_N of the listed and forced configs).
VARLEN_LENGTHS = [1, 17, 0, 33, 16, 32, 5]


def _cu(lengths):
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths).cumsum(0)
    return cu


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [32, 64, 80])
def test_varlen_every_candidate(dtype, head_dim):
    heads = 2
    qkv = torch.randn(sum(VARLEN_LENGTHS), 3 * heads * head_dim)
    args = (qkv, _cu(VARLEN_LENGTHS), max(VARLEN_LENGTHS), heads, SCALE_OF[head_dim])
    extra = EXTRA_ATTENTION_CONFIGS if head_dim == 80 else ()
    _run_all("attention_varlen", args, dtype, extra)


def test_varlen_sdpa_matches_padded_sdpa():
    """The padded emulation of torch:sdpa varlen (fp32: never torch's varlen kernel)
    gives exactly what torch:sdpa gives on the same batch padded: the same SDPA call,
    rows scattered and gathered by index, masked keys weigh an exact 0."""
    lengths, heads, d = [9, 3, 14], 2, 32
    S, B = 14, 3
    qkv = torch.randn(B, S, 3 * heads * d, device=DEV)
    mask = (torch.arange(S)[None, :] < torch.tensor(lengths)[:, None]).to(DEV)
    packed = qkv[mask]
    out_var = sdpa.attention_varlen(packed, _cu(lengths).to(DEV), S, heads, d**-0.5)
    out_pad = sdpa.attention(qkv, mask, heads, d**-0.5)
    assert torch.equal(out_var, out_pad[mask])


# ---------------------------------------------------------------------- SDPA contract
def test_sdpa_all_masked_and_non_finite():
    """Zeros for a sequence with no real key (SDPA alone may give NaN); a NaN in a real
    query propagates to its row only, as in the reference."""
    qkv = torch.randn(2, 6, 3 * 2 * 16, device=DEV)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [0] * 6], device=DEV)
    qkv[0, 1, 0] = float("nan")  # query 1, head 0
    out = sdpa.attention(qkv, mask, 2, 0.25)
    ref = reference.attention(qkv, mask, 2, 0.25)
    assert (out[1] == 0).all() and (out[0, 3:] == 0).all()
    assert torch.equal(out.isnan(), ref.isnan())
    assert out[0, 1, :16].isnan().all() and not out[0, 1, 16:].isnan().any()
    assert not out[0, [0, 2]].isnan().any()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sdpa_keeps_dtype_and_layout(dtype):
    qkv = torch.randn(2, 5, 3 * 3 * 16, device=DEV, dtype=dtype)
    out = sdpa.attention(qkv, None, 3, 0.25)
    assert out.dtype == dtype and out.shape == (2, 5, 48)
    cu = torch.tensor([0, 2, 7], dtype=torch.int32, device=DEV)
    out = sdpa.attention_varlen(qkv.view(10, -1)[:7], cu, 5, 3, 0.25)
    assert out.dtype == dtype and out.shape == (7, 48)
    assert sdpa.attention_varlen(qkv.view(10, -1)[:0], cu[:1], 0, 3, 0.25).shape == (0, 48)


def test_sdpa_forced_backends():
    """A forced SDPA kernel runs (math everywhere; on CUDA every listed one) and is held
    to the parity rule; on CPU nothing is listed (SDPA's own pick is the candidate)."""
    qkv, mask, heads = _padded_case(32, S=20)
    args = (qkv, mask, heads, SCALE_OF[32])
    varlen = (torch.randn(sum(VARLEN_LENGTHS), 3 * 64), _cu(VARLEN_LENGTHS), 33, 2, 0.2)
    for op, op_args, fn, listed in (
        ("attention", args, sdpa.attention, sdpa.attention_configs),
        ("attention_varlen", varlen, sdpa.attention_varlen, sdpa.attention_varlen_configs),
    ):
        for dtype in [torch.float16, torch.float32] if HAS_CUDA else [torch.float32]:
            typed = _cast(op_args, dtype)
            configs = listed(*typed)
            if DEV.type == "cpu":
                assert configs == []
                configs = [{"sdpa_backend": "math"}]
            else:
                assert {"sdpa_backend": "math"} in configs
            gold = getattr(reference, op)(*_cast(op_args, torch.float64))
            same = getattr(reference, op)(*typed)
            for cfg in configs:
                out = fn(*typed, config=cfg)
                assert_within_rule(op, f"{op}[torch:sdpa {cfg}]", out, gold, same, dtype)


def test_sdpa_varlen_reasons():
    """torch's varlen kernel is refused with a reason where it cannot run; the variant
    itself runs everything (the padded emulation)."""
    assert sdpa.varlen_reason(torch.zeros(4, 96, dtype=torch.float16), 16)
    assert sdpa.varlen_reason(torch.zeros(4, 96, device=DEV), 16)  # fp32
    assert sdpa.supports_attention_varlen(torch.zeros(4, 96), None, 4, 2, 0.1) is None
    assert sdpa.supports_attention(torch.zeros(1, 4, 96), None, 2, 0.1) is None


# ---------------------------------------------------------------------- linear_gelu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("K", [48, 64])  # 48: a K tail for BLOCK_K 32 (EVEN_K false)
def test_linear_gelu_every_candidate(dtype, K):
    args = (torch.randn(37, K), torch.randn(80, K) / K**0.5, torch.randn(80), "gelu")
    _run_all("linear_gelu", args, dtype, EXTRA_LINEAR_CONFIGS)


# ---------------------------------------------------------------------- configs
needs_triton = pytest.mark.skipif(
    not (HAS_CUDA or INTERPRETED), reason="the triton backend needs a GPU or the interpreter"
)


@needs_triton
def test_triton_configs_registered():
    backend = dispatch.get_backend("triton")
    assert set(backend.configs) == {"attention", "attention_varlen", "linear_gelu"}
    qkv, mask, heads = _padded_case(64, S=8)
    qkv, mask = qkv.to(DEV), mask.to(DEV)
    listed = backend.configs["attention"](qkv, mask, heads, 0.125)
    assert listed and all(
        set(c) == {"BLOCK_M", "BLOCK_N", "num_warps", "num_stages"} for c in listed
    )
    if not HAS_CUDA:
        assert listed == [{"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1}]
    # short sequences: no query tile taller than twice the sequence (pruned as autotuned)
    assert all(c["BLOCK_M"] <= 16 for c in listed) or not HAS_CUDA


class _Stand:
    """A stand-in for a CUDA tensor where only the device and element size are read."""

    def __init__(self, element_size):
        self.device = torch.device("cuda", 0)
        self._es = element_size

    def element_size(self):
        return self._es


@pytest.fixture
def fake_gpu(monkeypatch):
    """Pretend device 0 is a GPU of a given capability and shared memory."""
    pytest.importorskip("triton")
    from bertfast.ops.triton import attention, linear_act

    def make(capability, shared):
        monkeypatch.setattr(attention, "_capability", lambda index: capability)
        monkeypatch.setattr(attention, "max_shared_memory", lambda device: shared)
        monkeypatch.setattr(linear_act, "max_shared_memory", lambda device: shared)
        return attention

    return make


@needs_triton
def test_attention_config_lists_per_gpu(fake_gpu):
    attention = fake_gpu((9, 0), 232448)
    sm90 = attention._configs_for(_Stand(2), 64, 512)
    tall = [c for c in sm90 if c["BLOCK_M"] == 128 and c["num_warps"] == 8]
    assert {c["num_stages"] for c in tall} == {2, 3, 4}
    assert len(sm90) == len(attention._SM90_CONFIGS)  # nothing pruned at 512, fp16, d64
    # pruned: short sequences, wide heads
    assert all(c["BLOCK_M"] <= 32 for c in attention._configs_for(_Stand(2), 64, 16))
    assert all(
        c["BLOCK_M"] * c["BLOCK_N"] <= 8192 for c in attention._configs_for(_Stand(2), 128, 512)
    )
    attention = fake_gpu((8, 0), 166912)
    sm80 = attention._configs_for(_Stand(2), 64, 512)
    assert [(c["BLOCK_M"], c["BLOCK_N"], c["num_warps"], c["num_stages"]) for c in sm80] == [
        (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)
        for c in attention._SM80_CONFIGS
    ]
    # fp32, head_dim 128 on a 99 KB part (sm_86): only tiles whose K / V stages fit
    attention = fake_gpu((8, 6), 101376)
    small = attention._configs_for(_Stand(4), 128, 512)
    assert small and all(
        attention.shared_memory_estimate(c["BLOCK_M"], c["BLOCK_N"], 128, c["num_stages"], 4)
        <= 101376
        for c in small
    )


@needs_triton
def test_forced_config_over_shared_memory_is_refused(fake_gpu):
    attention = fake_gpu((8, 0), 166912)
    big = {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 4}
    with pytest.raises(ValueError, match="shared memory"):
        attention.check_config(big, _Stand(4), 128)
    assert attention.check_config(big, _Stand(2), 64) == big


# ---------------------------------------------------------------------- bad configs
BAD_ATTENTION_CONFIGS = [
    ([("BLOCK_M", 32)], "must be a dict"),
    ({"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4}, "missing key.*num_stages"),
    (
        {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1, "BLOCK_D": 64},
        "unknown key.*BLOCK_D",
    ),
    ({"BLOCK_M": 48, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1}, "BLOCK_M=48 is not a power"),
    ({"BLOCK_M": 8, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1}, "BLOCK_M=8 is not a power"),
    ({"BLOCK_M": 32, "BLOCK_N": 512, "num_warps": 4, "num_stages": 1}, "BLOCK_N=512"),
    ({"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 3, "num_stages": 1}, "num_warps=3"),
    ({"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 0}, "num_stages=0"),
    ({"BLOCK_M": 32.0, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1}, "BLOCK_M must be an int"),
    ({"BLOCK_M": True, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1}, "BLOCK_M must be an int"),
    (
        {"BLOCK_M": 256, "BLOCK_N": 256, "num_warps": 4, "num_stages": 1},
        "fp32 values per thread",
    ),
]


@needs_triton
@pytest.mark.parametrize("config,match", BAD_ATTENTION_CONFIGS)
def test_bad_attention_config(config, match):
    qkv = torch.randn(1, 4, 3 * 64, device=DEV)
    cu = torch.tensor([0, 4], dtype=torch.int32, device=DEV)
    for cand, args in (
        (dispatch.Candidate("attention", "triton", config=()), (qkv, None, 2, 0.1)),
        (dispatch.Candidate("attention_varlen", "triton", config=()), (qkv[0], cu, 4, 2, 0.1)),
        # refused before the early return of an empty batch too
        (dispatch.Candidate("attention", "triton", config=()), (qkv[:0], None, 2, 0.1)),
    ):
        fn = dispatch.implementation(cand)
        with pytest.raises(ValueError, match=match) as err:
            fn(*args, config=config)
        assert "\n" not in str(err.value)


_LINEAR = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4}
BAD_LINEAR_CONFIGS = [
    (_LINEAR, "missing key.*num_stages"),
    ({**_LINEAR, "num_stages": 1, "BLOCK_K": 8}, "BLOCK_K=8"),
    ({**_LINEAR, "num_stages": 1, "GROUP_M": 0}, "GROUP_M=0"),
    ({**_LINEAR, "num_stages": 1, "BLOCK_M": 256, "BLOCK_N": 256}, "fp32 values per thread"),
]


@needs_triton
@pytest.mark.parametrize("config,match", BAD_LINEAR_CONFIGS)
def test_bad_linear_gelu_config(config, match):
    fn = dispatch.implementation(dispatch.Candidate("linear_gelu", "triton"))
    x, w = torch.randn(4, 32, device=DEV), torch.randn(8, 32, device=DEV)
    for rows in (x, x[:0]):
        with pytest.raises(ValueError, match=match) as err:
            fn(rows, w, None, "gelu", config=config)
        assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "op,config,match",
    [
        ("attention", "math", "expected"),
        ("attention", {"backend": "math"}, "expected"),
        ("attention", {"sdpa_backend": "fast"}, "must be one of flash, efficient, math, cudnn"),
        ("attention", {"sdpa_backend": "varlen"}, "must be one of"),
        ("attention_varlen", {"sdpa_backend": "fast"}, "must be one of varlen, flash"),
    ],
)
def test_bad_sdpa_config(op, config, match):
    qkv = torch.randn(1, 4, 3 * 32)
    args = (
        (qkv, None, 2, 0.1)
        if op == "attention"
        else (qkv[0], torch.tensor([0, 4], dtype=torch.int32), 4, 2, 0.1)
    )
    with pytest.raises(ValueError, match=match) as err:
        getattr(sdpa, op)(*args, config=config)
    assert "\n" not in str(err.value)


@pytest.mark.skipif(HAS_CUDA, reason="torch's varlen kernel may run on this GPU")
def test_sdpa_varlen_forced_where_it_cannot_run():
    with pytest.raises(ValueError, match="varlen_attn runs on CUDA tensors"):
        sdpa.attention_varlen(
            torch.randn(4, 96), torch.tensor([0, 4], dtype=torch.int32), 4, 2, 0.1,
            config={"sdpa_backend": "varlen"},
        )  # fmt: skip


@needs_triton
def test_forced_config_bypasses_the_autotuner(monkeypatch):
    """config= launches the jit function itself with exactly that config."""
    from bertfast.ops.triton import attention, linear_act

    launched = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launched.append(kwargs)

    cfg = {"BLOCK_M": 16, "BLOCK_N": 64, "num_warps": 2, "num_stages": 3}
    monkeypatch.setattr(attention, "_attention_kernel", Recorder())
    monkeypatch.setattr(attention, "_autotuned", lambda arch: pytest.fail("autotuner used"))
    qkv = torch.randn(2, 5, 3 * 64, device=DEV)
    attention.attention(qkv, None, 2, 0.1, config=cfg)
    attention.attention_varlen(qkv[0], torch.tensor([0, 5], device=DEV).int(), 5, 2, 0.1, cfg)
    assert len(launched) == 2 and all(cfg.items() <= k.items() for k in launched)

    lin = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 2, "num_warps": 2}
    lin["num_stages"] = 2
    launched.clear()
    monkeypatch.setattr(linear_act._linear_act_kernel, "fn", Recorder())
    linear_act.linear_gelu(qkv, torch.randn(8, 3 * 64, device=DEV), None, "relu", config=lin)
    assert len(launched) == 1 and lin.items() <= launched[0].items()
