"""Whole CPU forwards in one native call, with one native call per encoder layer,
and op by op.

Where every GEMM of every layer is on the C++ GEMM (a loaded model, up to
``cpu_weights.SMALL_ROWS`` tokens), the cpu encoder runner runs the embeddings and
every layer in one call to ``bertfast._C`` (``cpu.encoder_forward``; "one call");
``cpu.FUSED_FORWARD = False`` runs one call per layer (``cpu.encoder_layer``, a
layer's seven ops; "per layer"), and ``cpu.FUSED_LAYER = False`` the same kernels one
Python call each ("per op"). With ``--quantize int8`` the model's linear layers are
int8 (``_C.cpu.encoder_forward_int8`` / ``encoder_layer_int8``, any row count,
attention in the dtype ``quant.attention_dtype`` gives: bf16 where the CPU has native
bf16, ``BERTFAST_CPU_INT8_ATTENTION=fp32`` for fp32). All three are timed on the same
model and inputs, rotating round by round in one process; medians of the rounds'
medians, and the ratios to one call (only ratios inside one run mean anything on a
shared machine). The outputs are checked equal first. Usage::

    python benchmarks/experiments/layer_call.py [--model minilm|bert-base|FOLDER] \
        [--shapes 1x16,1x128] [--quantize int8]
"""

from __future__ import annotations

import argparse
import statistics

import torch

import bertfast
from bertfast import presets
from bertfast.bench.timing import measure
from bertfast.ops import cpu as cpu_ops


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="minilm", help="minilm, a preset name, or a folder")
    ap.add_argument("--shapes", default="1x16,1x64,1x128,4x32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--seconds", type=float, default=0.3, help="per variant per round")
    ap.add_argument("--quantize", choices=["int8"], default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    folder = presets.resolve(args.model)
    model = bertfast.from_pretrained(folder, backend="cpu", quantize=args.quantize)
    kind = args.quantize or "fp32"
    print(f"{folder} ({kind}): {args.threads} threads, ms per forward, ", end="")
    print(f"median of {args.rounds} rounds")
    variants = {"one call": (True, True), "per layer": (False, True), "per op": (False, False)}
    print(f"{'shape':>7s} " + " ".join(f"{v:>9s}" for v in variants), end="")
    print("  per layer / one call  per op / one call")

    def switch(variant):
        cpu_ops.FUSED_FORWARD, cpu_ops.FUSED_LAYER = variants[variant]

    for shape in args.shapes.split(","):
        B, S = (int(v) for v in shape.split("x"))
        ids = torch.randint(1000, model.config.vocab_size, (B, S))
        mask = torch.ones(B, S, dtype=torch.int64)

        def run(ids=ids, mask=mask):
            with torch.inference_mode():
                return model(ids, attention_mask=mask).last_hidden_state

        res = {v: [] for v in variants}
        outs = {}
        for v in variants:
            switch(v)
            outs[v] = run()
        if not all(torch.equal(outs["one call"], o) for o in outs.values()):
            raise SystemExit(f"{shape}: the paths differ")
        order = list(variants)
        for r in range(args.rounds):
            for v in order[r % 3 :] + order[: r % 3]:
                switch(v)
                stats = measure(run, "cpu", warmup=1, max_rounds=10**6, budget_s=args.seconds)
                res[v].append(stats.median * 1e3)
        switch("one call")
        med = {v: statistics.median(res[v]) for v in variants}
        print(f"{shape:>7s} " + " ".join(f"{med[v]:9.3f}" for v in variants), end="")
        one = med["one call"]
        print(f"  {med['per layer'] / one:20.3f}  {med['per op'] / one:17.3f}")


if __name__ == "__main__":
    main()
