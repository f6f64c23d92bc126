"""Hugging Face Hub ids (issue 28, item 1; ``bertfast/hub.py``), offline: the test
builds the standard cache layout (``models--org--name/{blobs,snapshots,refs}``) the
way ``huggingface_hub`` writes it, and the real client resolves ids, branches and
commits from it (``HF_HUB_OFFLINE=1``, set for every test in ``tests/conftest.py``).
The reference is transformers loading the same id through the same cache."""

from __future__ import annotations

import hashlib
import http.server
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import bertfast
from bertfast.embedder import Embedder
from bertfast.validate import CheckpointError

from . import tiny_embedder
from .test_cli import _in_process, assert_one_line

transformers = pytest.importorskip("transformers")
pytest.importorskip("huggingface_hub")

IDS = torch.tensor([[2, 7, 9, 11, 3, 0], [2, 5, 6, 3, 0, 0]])
MASK = (IDS != 0).long()


def cache_repo(cache: Path, repo_id: str, source: Path, ref: str = "main", commit=None) -> str:
    """Put the files of ``source`` into ``cache`` as huggingface_hub stores a
    downloaded snapshot: content-addressed blobs, a snapshot folder of relative links
    to them, and ``refs/<ref>`` naming the commit. Returns the commit hash."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    files = sorted(p for p in source.rglob("*") if p.is_file())
    commit = (
        commit
        or hashlib.sha1(b"".join(p.name.encode() + p.read_bytes() for p in files)).hexdigest()
    )
    for p in files:
        data = p.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = repo / "snapshots" / commit / p.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    return commit


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub-sources")
    return [tiny_embedder.make_checkpoint(root / f"seed{s}", seed=s) for s in (0, 1)]


@pytest.fixture
def cache(tmp_path, sources):
    cache = tmp_path / "hf-cache"
    cache_repo(cache, "org/tiny", sources[0])
    return cache


def _hidden(model):
    """Hidden states of the real tokens (padded rows are bertfast's own business)."""
    with torch.no_grad():
        return model(IDS, attention_mask=MASK).last_hidden_state[MASK.bool()]


def _reference(repo_id, cache, **kwargs):
    ref = transformers.AutoModel.from_pretrained(repo_id, cache_dir=str(cache), **kwargs)
    return _hidden(ref.eval())


def test_hub_id_loads_what_transformers_loads(cache, sources):
    ours = _hidden(bertfast.from_pretrained("org/tiny", cache_dir=cache))
    torch.testing.assert_close(ours, _reference("org/tiny", cache), atol=1e-5, rtol=0)
    # and it is the snapshot of that folder
    torch.testing.assert_close(ours, _hidden(bertfast.from_pretrained(sources[0])))


def test_revision_branch_and_commit(cache, sources):
    commit = cache_repo(cache, "org/tiny", sources[1], ref="v2")
    expect = _reference("org/tiny", cache, revision="v2")
    for revision in ("v2", commit):
        got = _hidden(bertfast.from_pretrained("org/tiny", revision=revision, cache_dir=cache))
        torch.testing.assert_close(got, expect, atol=1e-5, rtol=0)
    main = _hidden(bertfast.from_pretrained("org/tiny", cache_dir=cache))
    assert (main - expect).abs().max() > 1e-3  # the branches differ


def test_default_cache_embedder_and_cli(sources, tmp_path, capsys):
    cache = Path(os.environ["HF_HUB_CACHE"])  # the standard cache (tests/conftest.py)
    cache_repo(cache, "org/cli-tiny", sources[0])
    texts = tiny_embedder.corpus(5)
    got = Embedder.from_pretrained("org/cli-tiny").encode(texts)
    np.testing.assert_allclose(got, Embedder.from_pretrained(sources[0]).encode(texts), atol=1e-6)
    (tmp_path / "t.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = tmp_path / "o.npy"
    result = _in_process(capsys)(
        "encode", "org/cli-tiny", "--input", tmp_path / "t.txt", "--output", out
    )
    assert result.returncode == 0, result.stderr
    np.testing.assert_allclose(np.load(out), got, atol=1e-6)


def test_pytorch_bin_only_repository(tmp_path, sources):
    # an older repository: pytorch_model.bin, read with torch.load(weights_only=True)
    folder = tmp_path / "bin-only"
    shutil.copytree(sources[0], folder, ignore=shutil.ignore_patterns("*.safetensors"))
    state = transformers.AutoModel.from_pretrained(sources[0]).state_dict()
    torch.save(state, folder / "pytorch_model.bin")
    cache = tmp_path / "hf-cache"
    cache_repo(cache, "org/old", folder)
    got = _hidden(bertfast.from_pretrained("org/old", cache_dir=cache))
    torch.testing.assert_close(got, _reference("org/old", cache), atol=1e-5, rtol=0)


def test_unreachable_hub_falls_back_to_the_cache(cache, sources, monkeypatch):
    # huggingface_hub 1.33 (the GPU image's) goes to the Hub for a commit hash whose
    # snapshot is cached when no tree listing lies beside it, and raises
    # LocalEntryNotFoundError offline: bertfast then reads the cache alone.
    import huggingface_hub
    from huggingface_hub import errors

    commit = cache_repo(cache, "org/tiny", sources[1], ref="v2")
    real = huggingface_hub.snapshot_download
    asked = []

    def snapshot_download(*args, local_files_only=False, **kwargs):
        asked.append(local_files_only)
        if not local_files_only:
            raise errors.LocalEntryNotFoundError("the Hub cannot be reached (test)")
        return real(*args, local_files_only=True, **kwargs)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    got = _hidden(bertfast.from_pretrained("org/tiny", revision=commit, cache_dir=cache))
    torch.testing.assert_close(got, _reference("org/tiny", cache, revision="v2"), atol=1e-5, rtol=0)
    assert asked[0] is False and asked[-1] is True
    # and a revision the cache lacks is still the one clear line
    with pytest.raises(CheckpointError, match="is not in the Hugging Face cache"):
        bertfast.from_pretrained("org/tiny", revision="f" * 40, cache_dir=cache)


def test_uncached_id_offline_is_one_clear_line(cache, capsys, tmp_path):
    (tmp_path / "x.txt").write_text("hello\n", encoding="utf-8")
    for kwargs in ({}, {"revision": "nope"}):
        with pytest.raises(CheckpointError) as e:
            repo = "org/tiny" if kwargs else "org/absent"
            bertfast.from_pretrained(repo, cache_dir=cache, **kwargs)
        msg = str(e.value)
        assert isinstance(e.value, FileNotFoundError) and "\n" not in msg
        assert "is not in the Hugging Face cache" in msg and "HF_HUB_OFFLINE" in msg
        assert ("org/absent" in msg) if not kwargs else ("revision 'nope'" in msg)
    assert_one_line(
        _in_process(capsys)(
            "encode", "org/absent", "--input", tmp_path / "x.txt", "--output", tmp_path / "o.npy"
        ),
        "org/absent is not in the Hugging Face cache",
    )


def test_options_apply_to_hub_ids_only(sources):
    with pytest.raises(ValueError, match="revision apply to Hugging Face Hub ids; .* is a local"):
        bertfast.from_pretrained(sources[0], revision="main")
    with pytest.raises(TypeError, match="revision must be a string"):
        bertfast.from_pretrained("org/tiny", revision=3)
    # not an id and not a folder: the folder's own error
    with pytest.raises(CheckpointError, match="does not exist"):
        bertfast.from_pretrained("no such/folder/here")


def test_a_snapshot_link_out_of_the_cache_is_refused(cache, tmp_path):
    # a snapshot file may link into its repository's blobs, nowhere else
    snapshot = next((cache / "models--org--tiny" / "snapshots").iterdir())
    outside = tmp_path / "elsewhere.safetensors"
    target = snapshot / "model.safetensors"
    outside.write_bytes(target.read_bytes())
    target.unlink()
    target.symlink_to(outside)
    with pytest.raises(CheckpointError, match="outside"):
        bertfast.from_pretrained("org/tiny", cache_dir=cache)


# ---------------------------------------------------------------- a Hub that answers
class _Hub(http.server.BaseHTTPRequestHandler):
    """The Hub's answers to the first request of a download (the repository's
    revision), in its error protocol (``X-Error-Code``), which huggingface_hub maps to
    its exceptions."""

    def do_GET(self):
        code, error = 404, "RepoNotFound"
        if "/revision/nope" in self.path:
            code, error = 404, "RevisionNotFound"
        elif "/gated/" in self.path:
            code, error = 403, "GatedRepo"
        body = b'{"error": "refused by the test Hub"}'
        self.send_response(code)
        self.send_header("X-Error-Code", error)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


CASES = """
import bertfast, sys
for repo, revision in (("org/absent", None), ("org/tiny", "nope"), ("org/gated", None)):
    try:
        bertfast.from_pretrained(repo, revision=revision)
    except bertfast.CheckpointError as exc:
        print(type(exc).__name__, "|", exc)
"""


def test_hub_errors_online_are_one_line_each(tmp_path):
    # a fresh process (huggingface_hub reads HF_ENDPOINT at import), online, against a
    # Hub on 127.0.0.1; and with nothing listening there, "cannot be reached"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    env = dict(os.environ, HF_HUB_OFFLINE="0", HF_HUB_CACHE=str(tmp_path / "cache"))
    env["HF_ENDPOINT"] = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        out = subprocess.run(
            [sys.executable, "-c", CASES], env=env, capture_output=True, text=True, timeout=300
        )
    finally:
        server.shutdown()
        server.server_close()
    lines = out.stdout.splitlines()
    assert len(lines) == 3, out.stdout + out.stderr
    assert lines[0].startswith("CheckpointNotFoundError | no model 'org/absent' on the Hugging")
    assert lines[1].startswith("CheckpointNotFoundError | org/tiny has no revision 'nope'")
    assert (
        lines[2].startswith("CheckpointError | org/gated is a gated model") and "token=" in lines[2]
    )
    # the endpoint gone: no answer at all
    out = subprocess.run(
        [sys.executable, "-c", CASES.replace('("org/tiny", "nope"), ("org/gated", None)', "")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "is not in the Hugging Face cache" in out.stdout and "cannot be reached" in out.stdout
