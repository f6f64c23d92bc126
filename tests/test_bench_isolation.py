"""How the interleaved benchmark rounds run a provider: untimed settle calls, then a
block of timed ones, in its worker process or inline (no timed assertions: the tests
count calls)."""

from __future__ import annotations

import time

import pytest
import torch

from bertfast.bench.isolated import LocalRunner, Worker
from bertfast.bench.providers import Provider
from bertfast.bench.timing import SETTLE_S, block_size, call_times, settle
from bertfast.bench.workload import make_batch

FP32 = torch.float32


class CountingProvider(Provider):
    """Appends one line to ``log`` per call (readable across processes)."""

    is_bertfast = False
    is_baseline = False

    def __init__(self, log: str):
        self.name = "counting"
        self.log = log

    def load(self, model_path, device, dtype):
        log = self.log

        def run(batch):
            with open(log, "a") as f:
                f.write("call\n")
            return torch.zeros(batch.input_ids.shape[0], batch.input_ids.shape[1], 4)

        return run


def _calls(log) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_settle_runs_until_its_time_is_spent():
    n = []
    t0 = time.perf_counter()
    calls = settle(lambda: n.append(time.sleep(0.002)), settle_s=0.02)
    assert calls == len(n) >= 2
    assert time.perf_counter() - t0 >= 0.02
    assert settle(lambda: n.append(1), settle_s=0.0) == 1  # at least one call


@pytest.mark.parametrize(
    "per_call,expected",
    [(SETTLE_S / 4, 4), (SETTLE_S * 3, 1), (0.0, 16), (SETTLE_S / 1000, 16)],
)
def test_block_size(per_call, expected):
    assert block_size(per_call) == expected


@pytest.mark.parametrize("isolation", ["inline", "process"])
def test_timed_settles_before_its_block(tmp_path, isolation):
    log = tmp_path / "calls.log"
    prov = CountingProvider(str(log))
    if isolation == "process":
        runner = Worker(prov, str(tmp_path), "cpu", FP32, threads=1)
    else:
        runner = LocalRunner(prov, str(tmp_path), "cpu", FP32)
    try:
        runner.prepare(make_batch([3, 5], 100))
        assert _calls(log) == 2
        times = runner.timed(3)
        assert len(times) == 3 and all(t > 0 for t in times)
        assert _calls(log) == 5  # no settle asked: only the timed calls
        times = runner.timed(2, settle_s=0.03)
        assert len(times) == 2
        assert _calls(log) >= 5 + 1 + 2  # at least one untimed call before the block
    finally:
        runner.close()


def test_gemm_ceiling_counts_the_packed_gemms_a_model_runs():
    """The ceiling's packed-weight GEMMs (the forms ``from_pretrained`` packs a weight
    into) compute ``a @ b.T`` (checked against torch), one per form the machine has,
    and the ceiling they feed is a positive throughput."""
    pytest.importorskip("bertfast._C")
    from bertfast.bench.timing import gemm_ceiling, packed_gemms
    from bertfast.ops.cpu import weights as cpu_weights

    g = torch.Generator().manual_seed(0)
    # 256 rows: above SMALL_ROWS and a oneDNN size, so the oneDNN form runs on oneDNN
    rows = 2 * cpu_weights.SMALL_ROWS
    assert cpu_weights.onednn_rows(rows) == rows
    a, b = torch.randn(rows, 96, generator=g), torch.randn(128, 96, generator=g)
    fns = packed_gemms(a, b)
    assert len(fns) == 1 + cpu_weights.ONEDNN  # the C++ GEMM's panels, and oneDNN's form
    for fn in fns.values():
        torch.testing.assert_close(fn(), a @ b.T, rtol=1e-5, atol=1e-4)
    # fp16: the C++ GEMM is fp32-only, and oneDNN's form exists exactly where torch's
    # oneDNN can reorder an fp16 linear weight on this CPU (e.g. Xeons with AMX-FP16):
    # the expectation comes from the machine, never from a constant
    try:
        torch.ops.mkldnn._reorder_linear_weight(b.half(), None)
        onednn_fp16 = True
    except Exception:  # no fp16 inner product on this CPU / in this torch
        onednn_fp16 = False
    half = packed_gemms(a.half(), b.half())
    assert set(half) == ({"bertfast.ops.linear[packed, onednn]"} if onednn_fp16 else set())
    for fn in half.values():
        expect = a.half().float() @ b.half().float().T
        torch.testing.assert_close(fn().float(), expect, rtol=2e-2, atol=5e-2)
    assert gemm_ceiling("cpu", torch.float32, n=64, budget_s=0.02, with_bertfast=True) > 0


def test_call_times_times_each_call_and_puts_the_function_back():
    import types

    def slow(x, *, pause=0.002):
        if x is None:
            raise ValueError("no x")
        time.sleep(pause)
        return 2 * x

    owner = types.SimpleNamespace(fn=slow)
    with call_times(owner, "fn") as times:
        assert owner.fn is not slow
        assert owner.fn(3) == 6 and owner.fn(4, pause=0.0) == 8
        assert len(times) == 2 and times[0] >= 0.002 and times[1] < times[0]
    assert owner.fn is slow  # restored on exit
    with pytest.raises(ValueError, match="no x"), call_times(owner, "fn") as times:
        owner.fn(None)
    assert owner.fn is slow and len(times) == 1  # the failed call timed, then restored
