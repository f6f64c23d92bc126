"""Where OpenVINO's time goes, per node type, beside bertfast's own split.

OpenVINO (the fastest fp32 peer on most CPU shapes) compiled as ``bertfast bench``
compiles it (the same ONNX export, fp32 inference precision, or bf16 with ``--dtype
bf16`` as the suite's ``openvino-bf16``, LATENCY hint), with its performance
counters on; then bertfast's forward on the same shape and dtype with each
native kernel timed (GEMMs, attention, LayerNorm, embedding). Each runtime in a
process of its own, one after the other, as ``bertfast bench`` times its providers:
runtimes sharing a process fight over the cores with their thread pools. OpenVINO's
per-node times are its own counters: they can add up to more than its wall time
(measured: 128.8 ms of nodes in a 116.4 ms forward, MiniLM 8x128, 2 threads), so read
them as which kernels it picks and their rough weight, not as a sum to subtract.
Usage::

    python benchmarks/experiments/openvino_profile.py [--model minilm] [--shape 8x128] \
        [--threads 2] [--dtype fp32|bf16]
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import multiprocessing
import time

import numpy as np
import torch

import bertfast
from bertfast import _C, presets
from bertfast.bench.peers import onnx_export
from bertfast.bench.timing import call_times


def openvino_split(folder: str, B: int, S: int, threads: int, iters: int, dtype: str = "fp32"):
    import openvino as ov

    core = ov.Core()
    model = core.read_model(onnx_export(folder))
    compiled = core.compile_model(
        model,
        "CPU",
        {
            "INFERENCE_PRECISION_HINT": {"fp32": "f32", "bf16": "bf16"}[dtype],
            "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_NUM_THREADS": threads,
            "PERF_COUNT": True,
        },
    )
    rng = np.random.default_rng(0)
    feeds = {}
    for port in model.inputs:
        name = port.any_name
        if "input_ids" in name:
            feeds[name] = rng.integers(1000, 20000, (B, S), dtype=np.int64)
        elif "mask" in name:
            feeds[name] = np.ones((B, S), np.int64)
        else:
            feeds[name] = np.zeros((B, S), np.int64)
    request = compiled.create_infer_request()
    for _ in range(3):
        request.infer(feeds)
    split: collections.Counter = collections.Counter()
    start = time.perf_counter()
    for _ in range(iters):
        request.infer(feeds)
        for node in request.profiling_info:
            if node.status == node.Status.EXECUTED:
                split[f"{node.node_type} ({node.exec_type})"] += node.real_time.total_seconds()
    wall = (time.perf_counter() - start) / iters
    return wall, {k: v / iters for k, v in split.items()}


def bertfast_split(folder: str, B: int, S: int, threads: int, iters: int, dtype: str = "fp32"):
    torch.set_num_threads(threads)
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    model = bertfast.from_pretrained(folder, backend="cpu", dtype=torch_dtype)
    ids = torch.randint(1000, 20000, (B, S))
    mask = torch.ones(B, S, dtype=torch.int64)
    ops = [(torch.ops.mkldnn, "_linear_pointwise", "GEMMs (oneDNN)")]
    ops += [
        (_C.cpu, name, label)
        for name, label in [
            ("linear_packed", "GEMMs (C++)"),
            ("encoder_forward", "whole encoder (one native call)"),
            ("encoder_layer", "whole layers (one call, C++ GEMM)"),
            ("attention_varlen", "attention"),
            ("add_layernorm", "add + LayerNorm"),
            ("embed_layernorm", "embedding + LayerNorm"),
        ]
    ]
    with contextlib.ExitStack() as stack:
        split = {label: stack.enter_context(call_times(owner, name)) for owner, name, label in ops}
        with torch.inference_mode():
            for _ in range(3):
                model(ids, attention_mask=mask)
            for times in split.values():
                times.clear()
            start = time.perf_counter()
            for _ in range(iters):
                model(ids, attention_mask=mask)
            wall = (time.perf_counter() - start) / iters
    return wall, {k: sum(v) / iters for k, v in split.items() if v}


def in_own_process(fn, *args):
    """``fn(*args)`` in a fresh (spawned) process of its own, its result returned."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        return pool.submit(fn, *args).result()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--shape", default="8x128")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="both runtimes")
    args = ap.parse_args()
    folder = str(presets.resolve(args.model))
    B, S = (int(v) for v in args.shape.split("x"))
    threads, n = args.threads, args.iters
    runs = [
        (
            "OpenVINO (performance counters on)",
            in_own_process(openvino_split, folder, B, S, threads, n, args.dtype),
        ),
        (
            "bertfast-cpu (native calls timed)",
            in_own_process(bertfast_split, folder, B, S, threads, n, args.dtype),
        ),
    ]
    for title, (wall, split) in runs:
        print(f"{title}: {wall * 1e3:.2f} ms per forward at {args.shape}")
        for name, seconds in sorted(split.items(), key=lambda kv: -kv[1])[:10]:
            print(f"  {seconds * 1e3:9.3f} ms  {name}")
        print(f"  {(wall - sum(split.values())) * 1e3:9.3f} ms  outside those")


if __name__ == "__main__":
    main()
