"""torch.library.opcheck on every bertfast custom op (schema, fake impl, dispatch).

Run for every backend that executes natively: ``torch`` and ``cpu`` everywhere,
``cuda`` on a GPU with a CUDA build (marked ``gpu``; skips cleanly otherwise). The
triton interpreter is too slow for opcheck's repeated runs and is covered by the
parity tests (on a GPU, by the same parity tests on CUDA tensors).
"""
import pytest
import torch

import bertfast
import bertfast.ops  # registers torch.ops.bertfast.*

BACKENDS = [
    pytest.param("torch", id="torch"),
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
]


def _cases():
    H, heads = 96, 3
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    ids = torch.tensor([[1, 2, 3, 0], [4, 5, 6, 7]])
    x = torch.randn(8, H)
    yield "embed_layernorm", (ids, torch.arange(4).expand(2, 4).contiguous(), torch.zeros_like(ids),
                              torch.randn(10, H), torch.randn(6, H), torch.randn(2, H),
                              torch.ones(H), torch.zeros(H), 1e-12)
    yield "add_layernorm", (x, torch.randn(8, H), torch.randn(H), torch.ones(H), torch.zeros(H),
                            1e-12)
    yield "bias_gelu", (x, torch.randn(H), "gelu")
    yield "bias_gelu_", (x.clone(), torch.randn(H), "gelu_tanh")
    yield "linear", (x, torch.randn(200, H), torch.randn(200))
    yield "linear_gelu", (x, torch.randn(200, H), torch.randn(200), "gelu")
    yield "attention", (torch.randn(2, 4, 3 * H), mask, heads, 0.2)
    yield "attention_varlen", (torch.randn(7, 3 * H), torch.tensor([0, 3, 7], dtype=torch.int32),
                               4, heads, 0.2)
    yield "pack_tokens", (x, torch.tensor([0, 2, 5]))
    yield "unpack_tokens", (torch.randn(3, H), torch.tensor([0, 2, 5]), 8)


CASES = list(_cases())


def _on(device, args):
    return tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,args", CASES, ids=[c[0] for c in CASES])
def test_opcheck(name, args, backend):
    if backend == "cuda":
        if not bertfast.build_info().get("cuda"):
            pytest.skip("this build has no CUDA kernels (nvcc absent or BERTFAST_SKIP_CUDA)")
        args = _on("cuda", args)
    op = getattr(torch.ops.bertfast, name).default
    torch.library.opcheck(op, args + (backend,))
