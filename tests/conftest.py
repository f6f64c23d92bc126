"""Test-session setup shared by every test file.

- Without a GPU, Triton kernels run on CPU tensors through the interpreter; the
  variable must be set before any Triton kernel is defined, hence here.
- fp32 comparisons run with TF32 off (docs/design.md, numerics).
- Tests marked ``gpu`` skip cleanly without a CUDA device.
"""

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none visible to torch)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="session")
def micro(tmp_path_factory):
    """A 1-layer, hidden-32 random BERT checkpoint with a word-level vocab.txt
    (tests/tiny_embedder.py): the model of the streaming and encode tests."""
    from . import tiny_embedder

    return tiny_embedder.make_checkpoint(tmp_path_factory.mktemp("micro"), size="micro")
