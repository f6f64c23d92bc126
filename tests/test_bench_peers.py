"""The peer runtimes of the benchmarks (ONNX Runtime, OpenVINO, CTranslate2, and the
int8 variants) and the per-process runner, on a tiny random BERT, on CPU.

The peers are not in the ``test`` extra: each test skips with the reason when its
runtime is not installed (``pip install -e ".[bench]"`` brings them). Parity is checked
against transformers' own ``BertModel`` on the real tokens, with the same measure and
tolerance as the benchmark suite (``bertfast.bench.parity_error``, ``PARITY_TOL`` fp32;
``INT8_PARITY_TOL`` for the int8 peers). Nothing here is timed against anything.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from bertfast.bench import (
    INT8_PARITY_TOL,
    PARITY_TOL,
    Batch,
    LocalRunner,
    TransformersProvider,
    Worker,
    make_batch,
    parity_error,
    peer_providers,
)
from tests import models

transformers = pytest.importorskip("transformers")

PEERS = (
    "onnxruntime",
    "openvino",
    "ctranslate2",
    "onnxruntime-int8",
    "ctranslate2-int8",
    "openvino-bf16",
)
FP32 = torch.float32


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("peers") / "bert")
    models.save(models.build("bert"), folder)
    return folder


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("peers-cache"))


def _batch() -> Batch:
    """Ragged rows (right padding) with a second segment in two of them, so token
    types and the padding mask both matter."""
    b = make_batch([13, 5, 9, 11], models.VOCAB, seed=3)
    tt = b.token_type_ids.clone()
    tt[0, 7:13] = 1
    tt[3, 4:11] = 1
    return Batch(b.input_ids, b.attention_mask, tt, b.lengths)


def _reference(folder: str, batch: Batch) -> torch.Tensor:
    model = transformers.BertModel.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        return model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            token_type_ids=batch.token_type_ids,
        ).last_hidden_state


def _peer(name: str, cache: str):
    prov = {p.name: p for p in peer_providers("cpu", cache_dir=cache)}[name]
    why = prov.unavailable("cpu", FP32)
    if why:
        pytest.skip(f"{name}: {why}")
    return prov


@pytest.mark.parametrize("name", PEERS)
def test_peer_parity(name, checkpoint, cache):
    prov = _peer(name, cache)
    batch = _batch()
    ref = _reference(checkpoint, batch)
    run = prov.load(checkpoint, "cpu", FP32)
    out = run(batch)
    assert tuple(out.shape) == tuple(ref.shape)
    err = parity_error(out, ref, batch.attention_mask)
    suffix_tol = {"-int8": INT8_PARITY_TOL, "-bf16": PARITY_TOL[torch.bfloat16]}
    tol = next((t for sfx, t in suffix_tol.items() if name.endswith(sfx)), PARITY_TOL[FP32])
    assert prov.parity_tol(FP32) == tol
    assert err <= tol, f"{name}: max |out - transformers| on real tokens {err:.2e} > {tol}"
    # Real tokens of a row do not depend on the other rows' lengths (the padding mask
    # reaches the runtime): row 1 alone gives the same hidden states.
    alone = Batch(
        batch.input_ids[1:2, :5],
        batch.attention_mask[1:2, :5],
        batch.token_type_ids[1:2, :5],
        [5],
    )
    assert parity_error(run(alone), ref[1:2, :5], alone.attention_mask) <= tol
    if name.startswith("openvino"):
        assert run.info["hint"] in ("LATENCY", "THROUGHPUT")


def test_worker_per_provider(checkpoint, cache):
    """Each provider in a worker process of its own: the runner returns its parity
    output and timed calls, for every provider, and a load failure is a RuntimeError
    with the reason."""
    provs = [TransformersProvider("sdpa")]
    provs += [
        p for p in peer_providers("cpu", cache_dir=cache)[:3] if not p.unavailable("cpu", FP32)
    ]
    batch = _batch()
    ref = _reference(checkpoint, batch)
    workers = []
    try:
        for p in provs:
            workers.append(Worker(p, checkpoint, "cpu", FP32, threads=1))
        pids = {w._proc.pid for w in workers}
        assert os.getpid() not in pids and len(pids) == len(workers)
        for w in workers:
            out, seconds = w.prepare(batch)
            assert seconds > 0
            assert parity_error(out, ref, batch.attention_mask) <= PARITY_TOL[FP32], w.name
        for _ in range(2):  # alternating rounds, as the suite runs them
            for w in workers:
                times = w.timed(2)
                assert len(times) == 2 and all(t > 0 for t in times)
        # The same provider in this process gives the same output as in its worker.
        local = LocalRunner(provs[0], checkpoint, "cpu", FP32)
        assert torch.equal(local.prepare(batch)[0], workers[0].prepare(batch)[0])
    finally:
        for w in workers:
            w.close()
    assert all(w._proc.poll() is not None for w in workers)

    with pytest.raises(RuntimeError, match="not-a-checkpoint"):
        Worker(TransformersProvider("eager"), os.path.join(cache, "not-a-checkpoint"), "cpu", FP32)


def test_bench_cli_peers(checkpoint, cache, tmp_path, monkeypatch, capsys):
    """``bertfast bench --providers peers``: a row per installed peer, parity ok against
    transformers (not against one of the peers), int8 rows without ratios and out of
    the fp32 ratios; a missing peer skips with its reason."""
    from bertfast.cli import bench

    monkeypatch.setenv("BERTFAST_BENCH_CACHE", cache)
    out = tmp_path / "rows.json"
    rc = bench.main(
        [
            "--model",
            checkpoint,
            "--shapes",
            "2x8",
            "--seconds",
            "0",
            "--device",
            "cpu",
            "--threads",
            "1",
            "--providers",
            "peers",  # transformers eager is then loaded in the parent for parity
            "--json",
            str(out),
        ]
    )
    installed = [
        p.name for p in peer_providers("cpu") if p.name in PEERS and not p.unavailable("cpu", FP32)
    ]
    if not installed:  # every peer skipped with its reason, and the run says so
        captured = capsys.readouterr()
        assert rc == 1 and "no provider could run" in captured.err
        for name in PEERS:
            assert f"skip {name}: " in captured.out
        return
    assert rc == 0
    text = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["isolation"] == "process" and data["cpu"]["logical_cpus"] == os.cpu_count()
    assert data["parity_ref"] == "transformers-eager"
    rows = {r["provider"]: r for r in data["rows"]}
    for name in PEERS:
        why = {p.name: p for p in peer_providers("cpu")}[name].unavailable("cpu", FP32)
        if why:
            assert f"skip {name}: {why}" in text
            continue
        assert rows[name]["parity"] == "ok", rows[name]
    for r in rows.values():
        if r["int8"]:
            assert r["ratios"] == {}
        else:
            assert not any(b.endswith("-int8") for b in r["ratios"])


def test_report_keeps_int8_apart():
    """bertfast/bench/report.py (the suite's report): int8 rows get their own table and
    never enter the fp32 table's ratios or the best-peer target."""
    from bertfast.bench import report

    def row(provider, ms, **kw):
        return dict(
            suite="e2e",
            model="minilm",
            workload="8x128",
            kind="grid",
            provider=provider,
            median_s=ms / 1e3,
            device="cpu-x-2t",
            dtype="float32",
            is_bertfast=provider.startswith("bertfast"),
            parity_ok=True,
            parity_max_abs_err=1e-5,
            cpu={"model": "Some CPU", "flags": ["avx2", "fma"], "logical_cpus": 2},
            isolation="process",
            **kw,
        )

    rows = [
        row("onnxruntime", 12.0),
        row("openvino", 10.0, provider_info={"hint": "LATENCY"}),
        row("ctranslate2-int8", 4.0, int8=True, parity_tol=0.5),
        row("openvino-bf16", 5.0, int8=True, parity_tol=0.05),
        row("bertfast-cpu", 11.0),
    ]
    text = report.build(rows, {})
    fp32_part, int8_part = text.split("## Low precision")
    for low in ("ctranslate2-int8", "openvino-bf16"):
        assert low not in fp32_part and low in int8_part
    assert "Some CPU" in text and "avx2 fma" in text and "isolation: process" in text
    assert "OpenVINO performance hint used: LATENCY" in text
    # best fp32 peer is OpenVINO (10 ms) -> bertfast at 11 ms is 0.91x: not met, even
    # though the int8 and bf16 peers would be faster still.
    target = next(ln for ln in text.splitlines() if "best fp32 peer" in ln and "full" in ln)
    assert "not met" in target and "0.91x vs OV" in target
    # the int8 row is compared with the best bertfast fp32 row: 11 / 4
    assert "2.75 (bertfast-cpu)" in int8_part


def test_bertfast_bf16_row_runs_bf16_in_a_float32_run(checkpoint):
    """``bertfast-cpu-bf16``: a low-precision row (no fp32 ratios) whose output is the
    bf16 model's, close to transformers fp32 within the bf16 parity tolerance and not
    bit-equal to bertfast fp32 (it really ran in bf16)."""
    from bertfast.bench.providers import BertfastProvider
    from bertfast.bench.registry import provider_by_name

    pr = provider_by_name("bertfast-cpu-bf16", "cpu")
    assert pr.int8 and pr.precision == "bfloat16" and not pr.is_bertfast
    if pr.unavailable("cpu", FP32):
        pytest.skip(pr.unavailable("cpu", FP32))
    batch = _batch()
    got = pr.load(checkpoint, "cpu", FP32)(batch)
    fp32 = BertfastProvider("cpu").load(checkpoint, "cpu", FP32)(batch)
    ref = TransformersProvider("eager").load(checkpoint, "cpu", FP32)(batch)
    assert got.dtype == FP32
    err = parity_error(got, ref, batch.attention_mask)
    assert 0 < err <= pr.parity_tol(FP32) == PARITY_TOL[torch.bfloat16]
    assert parity_error(got, fp32, batch.attention_mask) > parity_error(
        fp32, ref, batch.attention_mask
    )


def test_registry_names_every_provider_once():
    """bertfast.bench.registry is the one list of providers (``bertfast bench`` and the
    suite): every name resolves to a provider of that name, the suite's default list is
    the baselines, then the int8 peers, then bertfast; the peer conversions go to the
    cache folder asked for. providers.py (the Provider interface) imports neither the
    peers nor the registry: no circle."""
    import ast

    from bertfast.bench import providers, registry

    tree = ast.parse(open(providers.__file__).read())
    froms = {(n.level, n.module) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {(1, "peers"), (1, "registry")} & froms, froms

    suite = [p.name for p in registry.suite_providers("cpu")]
    n = len(registry.BASELINES)
    assert suite[:n] == list(registry.BASELINES)
    assert suite[n : n + len(registry.INT8_PEERS)] == list(registry.INT8_PEERS)
    n += len(registry.INT8_PEERS)
    assert suite[n : n + len(registry.BF16_PEERS)] == list(registry.BF16_PEERS)
    assert all(name.startswith("bertfast-") for name in suite[n + len(registry.BF16_PEERS) :])
    builtin = [p.name for p in registry.builtin_providers("cpu")]
    assert builtin[:2] == ["transformers-eager", "transformers-sdpa"]
    known = registry.known_providers("cpu")
    extra = {"bertfast-cpu-int8", "bertfast-cpu-bf16", "openvino-latency", "openvino-throughput"}
    assert set(known) == set(suite) | set(builtin) | extra
    for name in known:
        assert registry.provider_by_name(name, "cpu").name == name
    assert registry.provider_by_name("bertfast-nope", "cpu").unavailable("cpu", FP32)
    with pytest.raises(ValueError, match="bertfast-<backend>"):
        registry.provider_by_name("no-such-runtime", "cpu")
    for name in PEERS:
        assert registry.provider_by_name(name, "cpu", cache_dir="/cache").cache_dir == "/cache"
    # the bf16 peer is a low-precision row, like bertfast's bf16 one: apart from the fp32
    # rows, held to the bf16 tolerance, and asks OpenVINO for bf16
    bf16, ours = known["openvino-bf16"], known["bertfast-cpu-bf16"]
    assert bf16.int8 and bf16.precision == ours.precision == "bfloat16"
    assert bf16.parity_tol(FP32) == ours.parity_tol(FP32) == PARITY_TOL[torch.bfloat16]
    assert not known["openvino"].int8 and known["openvino"].parity_tol(FP32) == PARITY_TOL[FP32]
