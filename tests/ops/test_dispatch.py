"""Backend dispatch: choice, forcing, BERTFAST_BACKEND, and errors that list reasons."""

import pytest
import torch

import bertfast
import bertfast.ops as ops
from bertfast.ops import dispatch


def _args():
    x = torch.randn(4, 8)
    return x, torch.randn(4, 8), None, torch.ones(8), torch.zeros(8)


def test_forced_torch_backend_runs_reference():
    x, r, b, w, lb = _args()
    out = ops.add_layernorm(x, r, b, w, lb, backend="torch")
    torch.testing.assert_close(out, torch.nn.functional.layer_norm(x + r, (8,), w, lb, 1e-12))


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown backend 'fast'.*choose one of"):
        ops.add_layernorm(*_args(), backend="fast")


def test_env_overrides_auto(monkeypatch):
    monkeypatch.setenv("BERTFAST_BACKEND", "nonsense")
    with pytest.raises(ValueError, match="BERTFAST_BACKEND='nonsense'"):
        ops.add_layernorm(*_args())
    monkeypatch.setenv("BERTFAST_BACKEND", "torch")
    impl = dispatch.select("add_layernorm", "auto", "cpu", torch.float32, _args() + (1e-12,))
    assert impl is dispatch.get_backend("torch").ops["add_layernorm"]


def test_forced_backend_that_cannot_run_says_why():
    # The cuda backend cannot take CPU tensors, whatever this build contains.
    with pytest.raises(ops.BackendError, match="backend 'cuda' cannot run this input"):
        ops.add_layernorm(*_args(), backend="cuda")


def test_no_backend_lists_every_reason():
    class Fussy:
        name = "x"

        def why_not(self, *a):
            return "refuses everything"

    saved = dict(dispatch._backends)
    try:
        for name in ("cpu", "torch"):
            dispatch._backends[name] = Fussy()
        with pytest.raises(ops.BackendError) as err:
            ops.add_layernorm(*_args())
        assert "cpu: refuses everything" in str(err.value)
        assert "torch: refuses everything" in str(err.value)
    finally:
        dispatch._backends.clear()
        dispatch._backends.update(saved)


def test_backends_report():
    status = bertfast.backends()
    assert set(status) == {"cpu", "cuda"}
    assert status["cpu"]["torch"] is None
    if not torch.cuda.is_available():
        assert all(reason for reason in status["cuda"].values())
