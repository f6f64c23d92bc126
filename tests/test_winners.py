"""Winners tables (bertfast/ops/winners.py): shape buckets, which table a GPU uses, lookup
inside it, dispatch following it on CUDA (faked on the CPU), table_from_rows and
`bertfast tune` (no GPU: refused; --dry-run: the whole path on the CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

from bertfast import cli, tune
from bertfast.ops import dispatch, winners

H100 = {
    "gpu": "NVIDIA H100 80GB HBM3",
    "capability": "9.0",
    "torch": "2.11.0",
    "triton": "3.6.0",
    "cuda": "13.0",
}


def meta(*shape):
    return torch.empty(shape, device="meta")


def table(device: dict, entries=()) -> dict:
    return {"format": 1, "device": dict(device), "made_by": "test", "entries": list(entries)}


def entry(op="add_layernorm", bucket="width=8,rows=128", backend="cuda", variant="fast", **kw):
    return {
        "op": op,
        "dtype": kw.pop("dtype", "float32"),
        "bucket": bucket,
        "backend": backend,
        "variant": variant,
        "config": kw.pop("config", {}),
        "median_ms": 0.01,
        **kw,
    }


def write(folder, name, data) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    """Empty user and shipped folders, the device facts of an H100 for every index,
    and fresh winners state before and after."""
    user, shipped = tmp_path / "user", tmp_path / "shipped"
    user.mkdir()
    shipped.mkdir()
    monkeypatch.delenv("BERTFAST_WINNERS", raising=False)
    monkeypatch.delenv("BERTFAST_BACKEND", raising=False)
    monkeypatch.setenv("BERTFAST_WINNERS_DIR", str(user))
    monkeypatch.setattr(winners, "SHIPPED_DIR", shipped)
    facts = dict(H100)
    monkeypatch.setattr(winners, "device_facts", lambda index: dict(facts))
    winners.reset()
    yield user, shipped, facts
    winners.reset()


# ---------------------------------------------------------------- buckets
def test_bucket_keys_per_op():
    key = winners.bucket_key
    assert key("attention", (meta(8, 256, 1152), None, 6, 0.1)) == "head_dim=64,seq=256,rows=2048"
    assert key("attention", (meta(1, 100, 1152), None, 12, 0.1)) == "head_dim=32,seq=128,rows=128"
    assert key("attention", (meta(2, 16, 96), None, 2, 0.1)) == "head_dim=16,seq=64,rows=128"
    varlen = (meta(3000, 2304), None, 200, 12, 0.1)
    assert key("attention_varlen", varlen) == "head_dim=64,seq=256,rows=4096"
    big = (meta(1_000_000, 2304), None, 512, 12, 0.1)
    assert key("attention_varlen", big) == "head_dim=64,seq=512,rows=65536"
    lin = (meta(4, 100, 384), meta(1536, 384), None)
    assert key("linear", lin) == "N=1536,K=384,rows=512"
    assert key("linear_gelu", lin + ("gelu",)) == "N=1536,K=384,rows=512,act=gelu"
    assert key("linear_gelu", lin + ("gelu_tanh",)) == "N=1536,K=384,rows=512,act=gelu_tanh"
    ids = torch.zeros(2, 30, dtype=torch.long)
    emb = (ids, ids, None, meta(100, 32), meta(64, 32), None, meta(32), meta(32), 1e-12)
    assert key("embed_layernorm", emb) == "width=32,rows=128"
    x = meta(300, 64)
    assert key("add_layernorm", (x, x, None, meta(64), meta(64), 1e-12)) == "width=64,rows=512"
    assert key("bias_gelu", (x, None, "gelu")) == "width=64,rows=512,act=gelu"
    assert key("bias_gelu_", (meta(70000, 64), None, "relu")) == "width=64,rows=65536,act=relu"
    assert key("pack_tokens", (x, torch.zeros(3, dtype=torch.long))) is None
    assert winners.bucket("unpack_tokens", (x, None, 4)) is None
    assert winners.parse_bucket_key("linear", "N=1536,K=384,rows=512") == {
        "N": 1536,
        "K": 384,
        "rows": 512,
    }
    assert winners.parse_bucket_key("linear", "width=8,rows=128") is None
    assert winners.parse_bucket_key("linear", "N=1,K=x,rows=128") is None


# ---------------------------------------------------------------- choosing a table
def chosen() -> str:
    summary = winners.table_summary(0)
    return None if summary is None else os.path.basename(summary.split(" (")[0])


def test_table_matching_order(dirs, monkeypatch):
    user, shipped, facts = dirs
    other_versions = dict(H100, torch="2.13.0", triton="3.9.0")
    write(shipped, "exact.json", table(H100))
    write(shipped, "same-gpu.json", table(other_versions))
    write(shipped, "same-cap.json", table(dict(H100, gpu="NVIDIA H800")))
    write(shipped, "cap-8.9.json", table(dict(H100, gpu="NVIDIA L40S", capability="8.9")))
    write(shipped, "cap-10.0.json", table(dict(H100, gpu="NVIDIA B200", capability="10.0")))
    write(user, "user-same-cap.json", table(dict(H100, gpu="NVIDIA GH200")))
    assert chosen() == "exact.json"
    assert "exact:" in winners.table_summary(0)
    order = ["exact.json", "same-gpu.json", "user-same-cap.json", "same-cap.json", "cap-8.9.json"]
    for name in order:
        winners.reset()
        assert chosen() == name
        (user / name if (user / name).exists() else shipped / name).unlink()
    winners.reset()
    assert chosen() == "cap-10.0.json"  # the only one left, however far
    # nearest capability: equal distance, the lower one first
    write(shipped, "cap-9.1.json", table(dict(H100, gpu="X", capability="9.1")))
    write(shipped, "cap-8.9.json", table(dict(H100, gpu="Y", capability="8.9")))
    winners.reset()
    assert chosen() == "cap-8.9.json"
    assert "nearest capability" in winners.table_summary(0)


def test_user_table_beats_shipped_at_the_same_level(dirs):
    user, shipped, _ = dirs
    write(shipped, "a.json", table(H100))
    write(user, "b.json", table(H100))
    assert chosen() == "b.json"
    # but a better level wins over the user's
    (user / "b.json").write_text(json.dumps(table(dict(H100, gpu="other"))))
    winners.reset()
    assert chosen() == "a.json"


def test_no_table_and_dry_run_tables_are_not_picked(dirs):
    user, _, facts = dirs
    assert winners.table_summary(0) is None
    write(user, "dry.json", table(dict(H100, dry_run=True)))
    winners.reset()
    assert winners.table_summary(0) is None
    x = torch.randn(4, 8)
    assert winners.lookup("add_layernorm", 0, torch.float32, (x, x)) is None


def test_forced_file_wins_whatever_its_device(dirs, monkeypatch, tmp_path):
    user, _, _ = dirs
    write(user, "exact.json", table(H100))
    forced = write(tmp_path, "forced.json", table(dict(H100, gpu="far", capability="5.0")))
    monkeypatch.setenv("BERTFAST_WINNERS", forced)
    winners.reset()
    assert chosen() == "forced.json"
    assert "forced by BERTFAST_WINNERS" in winners.table_summary(0)


@pytest.mark.parametrize(
    "text, problem",
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        (json.dumps(dict(table(H100), format=2)), "format 2"),
        (json.dumps({"format": 1, "entries": []}), "device.gpu"),
        (json.dumps(table(dict(H100, capability="sm90"))), "capability"),
        (json.dumps(dict(table(H100), entries={})), "no entries list"),
        (json.dumps(table(H100, [entry(bucket="rows=1")])), "not a add_layernorm bucket"),
        (json.dumps(table(H100, [entry(dtype="float8")])), "dtype 'float8'"),
        (json.dumps(table(H100, [entry(config=[1])])), "config"),
        (json.dumps(table(H100, [entry(backend=3)])), "op, backend and variant"),
    ],
)
def test_malformed_table_warns_once_and_is_ignored(dirs, text, problem):
    user, shipped, _ = dirs
    bad = write(user, "bad.json", text)
    write(shipped, "good.json", table(H100))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert chosen() == "good.json"
        x = torch.randn(4, 8)
        winners.lookup("add_layernorm", 1, torch.float32, (x, x))  # another device
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1, messages
    assert bad in messages[0] and problem in messages[0]
    assert "\n" not in messages[0]


def test_unreadable_forced_file_warns(dirs, monkeypatch, tmp_path):
    monkeypatch.setenv("BERTFAST_WINNERS", str(tmp_path / "missing.json"))
    winners.reset()
    with pytest.warns(RuntimeWarning, match="missing.json: cannot read it"):
        assert winners.table_summary(0) is None


# ---------------------------------------------------------------- lookup
class Recorder:
    """A fake "cuda" backend (device types cpu and cuda, so CPU tensors stand in for
    GPU ones) whose functions record which one ran."""

    def __init__(self):
        self.calls = []

        def fn(name):
            def run(*args, config=None):
                self.calls.append((name, config))
                return name

            return run

        self.backend = dispatch.Backend(
            name="cuda",
            device_types=("cpu", "cuda"),
            ops={"add_layernorm": fn("default"), "linear": fn("default")},
            variants={"add_layernorm": {"fast": fn("fast"), "picky": fn("picky")}},
            variant_supports={("add_layernorm", "picky"): lambda *a: "refuses this input"},
            configs={"linear": lambda *a: [{"BLOCK": 32}, {"BLOCK": 64}]},
        )


@pytest.fixture
def fake_cuda(dirs, monkeypatch):
    rec = Recorder()
    monkeypatch.setitem(dispatch._backends, "cuda", rec.backend)
    return rec


def ln_args(rows=4, width=8):
    x = torch.randn(rows, width)
    return (x, x, None, torch.ones(width), torch.zeros(width), 1e-12)


def test_lookup_exact_then_nearest_bucket(dirs, fake_cuda):
    user, _, _ = dirs
    entries = [
        entry(bucket="width=8,rows=128", variant="fast"),
        entry(bucket="width=8,rows=4096", variant="picky"),
        entry(bucket="width=16,rows=1024", variant="picky"),  # another width: never used
        entry(bucket="width=8,rows=128", variant="picky", dtype="float16"),
    ]
    write(user, "t.json", table(H100, entries))
    look = winners.lookup
    assert look("add_layernorm", 0, torch.float32, ln_args(4)).variant == "fast"
    assert look("add_layernorm", 0, torch.float32, ln_args(300)).variant == "fast"  # 512: 128
    assert look("add_layernorm", 0, torch.float32, ln_args(3000)).variant == "picky"  # 4096
    assert look("add_layernorm", 0, torch.float16, ln_args(4)).variant == "picky"
    assert look("add_layernorm", 0, torch.bfloat16, ln_args(4)) is None
    assert look("add_layernorm", 0, torch.float32, ln_args(4, width=32)) is None
    assert look("linear", 0, torch.float32, (torch.randn(4, 8), torch.randn(8, 8), None)) is None


def test_nearest_attention_bucket_prefers_seq_then_rows(dirs, fake_cuda):
    user, _, _ = dirs
    entries = [
        entry("attention_varlen", "head_dim=64,seq=256,rows=1024", backend="torch", variant="a"),
        entry("attention_varlen", "head_dim=64,seq=128,rows=4096", backend="torch", variant="b"),
        entry("attention_varlen", "head_dim=32,seq=128,rows=4096", backend="torch", variant="c"),
    ]
    write(user, "t.json", table(H100, entries))
    monkeypatch_variants = dispatch.get_backend("torch").variants
    saved = dict(monkeypatch_variants)
    try:
        monkeypatch_variants["attention_varlen"] = {"a": None, "b": None, "c": None}
        args = (meta(4096, 2304), None, 128, 12, 0.1)  # seq 128, rows 4096: "b" exactly
        assert winners.lookup("attention_varlen", 0, torch.float32, args).variant == "b"
        args = (meta(1024, 2304), None, 100, 12, 0.1)  # seq 128 rows 1024: seq nearest -> b
        assert winners.lookup("attention_varlen", 0, torch.float32, args).variant == "b"
        args = (meta(1024, 2304), None, 300, 12, 0.1)  # seq 512: 256 is nearer -> a
        assert winners.lookup("attention_varlen", 0, torch.float32, args).variant == "a"
    finally:
        monkeypatch_variants.clear()
        monkeypatch_variants.update(saved)


def test_entries_naming_missing_backends_variants_or_configs_are_skipped(dirs, fake_cuda):
    user, _, _ = dirs
    entries = [
        entry(bucket="width=8,rows=128", backend="nonesuch"),
        entry(bucket="width=8,rows=256", variant="nope"),
        entry(bucket="width=8,rows=512", config={"BLOCK": 64}),  # no configs for this op
        entry(bucket="width=8,rows=8192", variant="fast"),
        entry("linear", "N=8,K=8,rows=128", variant="default", config={"BLOCK": 128}),
        entry("linear", "N=8,K=8,rows=256", variant="default", config={"BLOCK": 64}),
        entry("made_up_op", "x=1"),  # an op this bertfast does not tune: skipped
    ]
    write(user, "t.json", table(H100, entries))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        found = winners.lookup("add_layernorm", 0, torch.float32, ln_args(4))
    assert (found.backend, found.variant) == ("cuda", "fast")  # the only usable one
    lin = (torch.randn(4, 8), torch.randn(8, 8), None)
    found = winners.lookup("linear", 0, torch.float32, lin)
    assert found.config == (("BLOCK", 64),)  # BLOCK=128 is not a config offered here
    assert found.label == "cuda[BLOCK=64]"
    # nothing usable at all: None
    write(user, "t.json", table(H100, entries[:3]))
    winners.reset()
    assert winners.lookup("add_layernorm", 0, torch.float32, ln_args(4)) is None


def test_lookup_is_memoised(dirs, fake_cuda, monkeypatch):
    user, _, _ = dirs
    write(user, "t.json", table(H100, [entry()]))
    calls = []
    real = winners._resolve
    monkeypatch.setattr(winners, "_resolve", lambda *a: calls.append(a) or real(*a))
    args = ln_args(4)
    first = winners.lookup("add_layernorm", 0, torch.float32, args)
    for rows in (4, 4, 5, 100):  # same bucket: resolved once
        assert winners.lookup("add_layernorm", 0, torch.float32, ln_args(rows)) == first
    assert len(calls) == 1


# ---------------------------------------------------------------- dispatch
def test_cuda_select_follows_the_table(dirs, fake_cuda):
    user, _, _ = dirs
    entries = [
        entry(bucket="width=8,rows=128", variant="fast"),
        entry(bucket="width=16,rows=128", variant="picky"),  # cannot run: falls back
        entry("linear", "N=8,K=8,rows=128", variant="default", config={"BLOCK": 64}),
    ]
    write(user, "t.json", table(H100, entries))

    def run(op, args):
        return dispatch.select(op, "auto", "cuda", torch.float32, args)(*args)

    assert run("add_layernorm", ln_args(4)) == "fast"
    assert run("add_layernorm", ln_args(1000)) == "fast"  # nearest bucket (rows 128)
    assert run("add_layernorm", ln_args(4, width=16)) == "default"  # picky refuses
    assert run("add_layernorm", ln_args(4, width=32)) == "default"  # no entry
    assert run("linear", (torch.randn(4, 8), torch.randn(8, 8), None)) == "default"
    assert fake_cuda.calls[-1] == ("default", {"BLOCK": 64})
    # a named backend, BERTFAST_BACKEND and CPU never ask the table
    impl = dispatch.select("add_layernorm", "cuda", "cuda", torch.float32, ln_args())
    assert impl is fake_cuda.backend.ops["add_layernorm"]


def test_cuda_select_without_table_walks_the_preference_order(dirs, fake_cuda):
    impl = dispatch.select("add_layernorm", "auto", "cuda", torch.float32, ln_args())
    assert impl is fake_cuda.backend.ops["add_layernorm"]


def test_bertfast_backend_env_skips_the_table(dirs, fake_cuda, monkeypatch):
    user, _, _ = dirs
    write(user, "t.json", table(H100, [entry()]))
    monkeypatch.setenv("BERTFAST_BACKEND", "cuda")
    impl = dispatch.select("add_layernorm", "auto", "cuda", torch.float32, ln_args())
    assert impl is fake_cuda.backend.ops["add_layernorm"]


def test_cpu_select_never_consults_winners(monkeypatch):
    def boom(*a):
        raise AssertionError("winners consulted on CPU")

    monkeypatch.setattr(winners, "lookup", boom)
    import bertfast.ops as ops

    ops.add_layernorm(*ln_args()[:5])
    assert dispatch.select(
        "linear", "auto", "cpu", torch.float32, (torch.randn(2, 4),) * 2 + (None,)
    )


def test_cpu_forward_does_not_import_winners():
    code = (
        "import sys, torch, bertfast.ops as ops\n"
        "x = torch.randn(4, 8)\n"
        "ops.add_layernorm(x, x, None, torch.ones(8), torch.zeros(8))\n"
        "ops.linear_gelu(x, torch.randn(16, 8), None)\n"
        "assert 'bertfast.ops.winners' not in sys.modules, 'winners imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# ---------------------------------------------------------------- table_from_rows
def row(candidate, ms, parity="pass", shape=(32, 128), bucket="N=8,K=8,rows=4096,act=gelu", **kw):
    backend, _, variant = candidate.partition(":")
    return {
        "stage": "c",
        "op": kw.pop("op", "linear_gelu"),
        "dtype": kw.pop("dtype", "float16"),
        "shape": {"batch": shape[0], "seqlen": shape[1]},
        "bucket": bucket,
        "candidate": candidate,
        "backend": backend,
        "variant": variant or "default",
        "config": kw.pop("config", {}),
        "median_ms": ms,
        "parity": parity,
        "device": kw.pop("device", H100),
        **kw,
    }


def test_table_from_rows_picks_the_fastest_passing_candidate():
    rows = [
        row("cuda:cublaslt", 0.5, parity="fail: 0.3 > 0.01"),  # fastest, but wrong
        row("triton", 0.8),
        row("triton", 0.7, config={"BLOCK_M": 128}),
        row("cuda", 1.0),
        row("torch", None, parity="error: RuntimeError: boom"),
        row("torch", 0.1, device=dict(H100, gpu="NVIDIA A100", capability="8.0")),  # other GPU
        row("triton", 0.1, op="gemm_ceiling"),  # not a tuned op
        row("triton", 0.1, bucket=None),
        "not a row",
    ]
    t = tune.table_from_rows(rows, H100, made_by="test")
    assert t["format"] == 1 and t["device"]["gpu"] == H100["gpu"] and t["made_by"] == "test"
    (e,) = t["entries"]
    bucket = "N=8,K=8,rows=4096,act=gelu"
    assert (e["op"], e["dtype"], e["bucket"]) == ("linear_gelu", "float16", bucket)
    assert (e["backend"], e["variant"], e["config"]) == ("triton", "default", {"BLOCK_M": 128})
    assert e["median_ms"] == pytest.approx(0.7)
    assert e["runner_up"] == "triton" and e["speedup"] == pytest.approx(0.8 / 0.7, rel=1e-3)
    # a candidate that failed on one shape of the bucket is out of it
    rows += [row("triton", 0.9, shape=(30, 128), config={"BLOCK_M": 128}, parity="fail: x")]
    (e,) = tune.table_from_rows(rows, H100)["entries"]
    assert (e["backend"], e["config"]) == ("triton", {})
    # no device given: the rows' own
    assert tune.table_from_rows(rows[1:4])["device"]["gpu"] == H100["gpu"]


def test_table_from_rows_over_several_shapes_of_a_bucket():
    rows = [
        row("cuda", 1.0, shape=(32, 128)),
        row("triton", 1.2, shape=(32, 128)),
        row("cuda", 1.1, shape=(30, 128)),
        row("triton", 1.0, shape=(30, 128)),
        row("torch", 0.5, shape=(30, 128)),  # fastest where it ran, but only on one shape
    ]
    (e,) = tune.table_from_rows(rows, H100)["entries"]
    # to the best per shape, cuda: 1.0 and 2.2 (geomean 1.48); triton 1.2 and 2.0 (1.55)
    assert e["backend"] == "cuda" and e["runner_up"] == "triton"
    assert e["median_ms"] == pytest.approx((1.0 * 1.1) ** 0.5, rel=1e-4)
    assert e["speedup"] == pytest.approx((1.2 * 2.0) ** 0.5 / (1.0 * 2.2) ** 0.5, rel=1e-3)


def test_table_from_rows_round_trips_through_lookup(dirs, fake_cuda):
    user, _, _ = dirs
    rows = [
        row("cuda:fast", 0.1, op="add_layernorm", dtype="float32", bucket="width=8,rows=128"),
        row("cuda", 0.2, op="add_layernorm", dtype="float32", bucket="width=8,rows=128"),
    ]
    winners.write_table(tune.table_from_rows(rows, H100), user / "made.json")
    assert winners.lookup("add_layernorm", 0, torch.float32, ln_args()).variant == "fast"


# ---------------------------------------------------------------- bertfast tune
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a GPU")
@pytest.mark.parametrize(
    "args, says",
    [([], "needs a CUDA GPU"), (["--device", "cpu"], "--device cpu is refused")],
)
def test_tune_without_a_gpu_is_one_line_and_status_2(capsys, args, says):
    assert cli.main(["tune", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bertfast: error: ") and says in err


def test_tune_usage_errors(capsys):
    assert cli.main(["tune", "--dry-run", "--device", "cuda"]) == 2
    assert "--dry-run runs on the CPU" in capsys.readouterr().err
    assert cli.main(["tune", "--dry-run", "--dtype", "float8"]) == 2
    assert "--dtype 'float8'" in capsys.readouterr().err
    assert cli.main(["tune", "--dry-run", "--shapes", "12"]) == 2
    assert "--shapes" in capsys.readouterr().err


def test_tune_dry_run_writes_a_table_lookup_reads(tmp_path, monkeypatch, capsys):
    out, rows_file = tmp_path / "table.json", tmp_path / "rows.jsonl"
    code = cli.main(["tune", "--dry-run", "--out", str(out), "--rows", str(rows_file)])
    assert code == 0, capsys.readouterr().err
    data = json.loads(out.read_text())
    assert data["format"] == 1 and data["device"]["dry_run"] is True
    assert "bertfast tune" in data["made_by"] and "--dry-run" in data["made_by"]
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    assert rows and all(r["stage"] == "tune" for r in rows)
    assert {r["parity"] for r in rows} == {"pass"}
    ops_seen = {e["op"] for e in data["entries"]}
    assert {"embed_layernorm", "linear", "linear_gelu", "add_layernorm"} <= ops_seen
    assert "attention_varlen" in ops_seen
    for e in data["entries"]:
        assert e["backend"] in ("cpu", "torch") and e["dtype"] == "float32"
        assert e["median_ms"] > 0 and e["speedup"] >= 1.0
    # the table is what lookup reads when BERTFAST_WINNERS names it
    monkeypatch.setenv("BERTFAST_WINNERS", str(out))
    winners.reset()
    try:
        e = next(e for e in data["entries"] if e["op"] == "linear_gelu")
        n, k = (int(part.split("=")[1]) for part in e["bucket"].split(",")[:2])
        args = (torch.randn(4, k), torch.randn(n, k), None, "gelu")
        found = winners.lookup("linear_gelu", "cpu", torch.float32, args)
        assert (found.backend, found.variant) == (e["backend"], e["variant"])
        assert "dry-run" in winners.table_summary("cpu")
    finally:
        winners.reset()


def test_made_by_names_the_command_version_and_commit():
    """What a tuned table records of its making: the command, bertfast's version and,
    in a git checkout, its commit (``info.git_revision``: git's own answer)."""
    import subprocess
    from pathlib import Path

    from bertfast import __version__
    from bertfast.info import git_revision

    text = tune._made_by("bertfast tune --dry-run")
    assert text.startswith(f"bertfast tune --dry-run (bertfast {__version__}")
    here = Path(tune.__file__).resolve().parent
    out = subprocess.run(
        ["git", "-C", str(here), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    want = out.stdout.strip() if out.returncode == 0 else None
    assert git_revision() == want
    assert (f", commit {want})" in text) if want else text.endswith(")") and "commit" not in text
    dirty = git_revision(mark_dirty=True)
    assert dirty is None if want is None else dirty in (want, want + "-dirty")
