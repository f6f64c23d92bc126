"""Test-session setup shared by every test file.

- Without a GPU, Triton kernels run on CPU tensors through the interpreter; the
  variable must be set before any Triton kernel is defined, hence here.
- fp32 comparisons run with TF32 off (docs/design.md, numerics).
- Tests marked ``gpu`` skip cleanly without a CUDA device.
- ``HF_HUB_OFFLINE=1`` and a private, empty ``HF_HUB_CACHE``: no test downloads.
- Ray Serve's proxy start-up limits raised (a loaded machine, below).
- ``BERTFAST_TEST_EARLY_FAILURES=1`` prints each failure the moment it is reported
  (one ``EARLY FAILED <nodeid> (<phase>)`` line and the head of its traceback), so a
  run cut by a timeout, whose end-of-run summary never comes, still names its
  failures (the GPU check sets it; under pytest-xdist the controller prints them).
"""

import atexit
import os
import shutil
import sys
import tempfile

# No test reaches the network: Hugging Face Hub ids resolve offline, from a private,
# empty cache that the Hub tests fill (set before anything imports huggingface_hub,
# which reads both at import).
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HUB_CACHE"] = tempfile.mkdtemp(prefix="bertfast-tests-hf-cache-")
atexit.register(shutil.rmtree, os.environ["HF_HUB_CACHE"], True)

# Ray Serve's proxy gets 5 s to report ready and is dropped after three misses; with two
# pytest-xdist workers busy on a 2-core machine it once took longer, and serve.start()
# failed. Generous limits for every Ray process the tests start (they inherit the
# environment), in process and in `bertfast serve --ray` subprocesses alike.
os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")
os.environ.setdefault("RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S", "60")

import pytest  # noqa: E402
import torch  # noqa: E402

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


EARLY_FAILURE_LINES = 12
_CONFIG = []


def pytest_configure(config):
    _CONFIG[:] = [config]


def pytest_runtest_logreport(report):
    if not report.failed or os.environ.get("BERTFAST_TEST_EARLY_FAILURES") != "1":
        return
    text = getattr(report, "longreprtext", "") or ""
    tail = [ln for ln in text.splitlines() if ln.strip()][-EARLY_FAILURE_LINES:]
    lines = [f"EARLY FAILED {report.nodeid} ({report.when})"]
    lines += [f"    {ln[:200]}" for ln in tail]
    # through the terminal reporter (the real stdout, not a test's captured one)
    term = _CONFIG[0].pluginmanager.get_plugin("terminalreporter") if _CONFIG else None
    if term is not None:
        term.write_line("")
        for ln in lines:
            term.write_line(ln)
        if hasattr(term, "flush"):  # pytest >= 7
            term.flush()
    else:
        print("\n".join(lines), file=sys.__stdout__, flush=True)


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
