"""What bertfast says about a CPU's native bf16 / int8 dot products: ``bertfast info``,
``bertfast.info.low_precision_paths`` and the one-time warning when a bf16 model is
loaded on a CPU without native bf16 (detection forced by patching ``cpu_info``)."""

from __future__ import annotations

import warnings

import pytest
import torch

import bertfast
import bertfast.info as info

from .models import build, make_batch, save

SPR = ["avx2", "fma", "avx512f", "avx512dq", "avx512vl", "avx512bw", "avx512_bf16", "amx_bf16"]
SPR += ["avx512_vnni", "avx_vnni", "amx_int8"]
ZEN3 = ["avx", "avx2", "fma", "f16c"]  # no AVX-512, no VNNI, no bf16


def test_native_dot_products_from_flags():
    assert info.native_dot_products(SPR) == {
        "bf16": ["avx512_bf16", "amx_bf16"],
        "int8": ["avx512_vnni", "avx_vnni", "amx_int8"],
    }
    assert info.native_dot_products(ZEN3) == {"bf16": [], "int8": []}
    assert info.native_dot_products(None) == info.native_dot_products(info.cpu_info()["flags"])


def test_low_precision_paths(monkeypatch):
    monkeypatch.delenv("BERTFAST_CPU_ATTENTION_ISA", raising=False)
    monkeypatch.delenv("BERTFAST_CPU_INT8_ISA", raising=False)
    fast = info.low_precision_paths(SPR)
    assert fast["bf16_attention"].startswith("AMX")
    no_amx = [f for f in SPR if f != "amx_bf16"]
    assert info.low_precision_paths(no_amx)["bf16_attention"].startswith("vdpbf16ps")
    assert "AMX" in fast["bf16_gemm"]
    assert fast["int8"].startswith("AMX tiles (amx_int8")
    no_amx8 = [f for f in SPR if f != "amx_int8"]
    assert info.low_precision_paths(no_amx8)["int8"].startswith("vpdpbusd (avx512_vnni")
    # AVX-VNNI alone (no AVX-512): qgemm.cpp runs its AVX2 kernel
    assert "AVX2" in info.low_precision_paths(ZEN3 + ["avx_vnni"])["int8"]
    slow = info.low_precision_paths(ZEN3)
    assert "fp32 math" in slow["bf16_attention"] and "AVX2" in slow["bf16_attention"]
    assert "no avx512_bf16" in slow["bf16_attention"]
    assert "torch's bf16 matmul" in slow["bf16_gemm"]
    assert "no AVX-512 VNNI" in slow["int8"]
    monkeypatch.setenv("BERTFAST_CPU_ATTENTION_ISA", "avx512bf16")
    assert info.low_precision_paths(SPR)["bf16_attention"].startswith("vdpbf16ps")
    monkeypatch.setenv("BERTFAST_CPU_ATTENTION_ISA", "avx512")
    forced = info.low_precision_paths(SPR)["bf16_attention"]
    assert "AVX-512" in forced and "BERTFAST_CPU_ATTENTION_ISA=avx512" in forced
    monkeypatch.setenv("BERTFAST_CPU_INT8_ISA", "vnni")
    assert info.low_precision_paths(SPR)["int8"].startswith("vpdpbusd")
    monkeypatch.setenv("BERTFAST_CPU_INT8_ISA", "avx2")
    assert "BERTFAST_CPU_INT8_ISA=avx2" in info.low_precision_paths(SPR)["int8"]


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    return save(build("bert"), str(tmp_path_factory.mktemp("bert")))


@pytest.fixture
def fresh_warning(monkeypatch):
    monkeypatch.setattr(info, "_BF16_WARNED", False)


def _no_bf16_cpu(monkeypatch):
    real = info.cpu_info()
    monkeypatch.setattr(info, "cpu_info", lambda: {**real, "flags": ZEN3})


def test_bf16_load_warns_once_without_native_bf16(bert_folder, fresh_warning, monkeypatch):
    _no_bf16_cpu(monkeypatch)
    with pytest.warns(RuntimeWarning, match="no native bf16 dot products") as rec:
        bertfast.from_pretrained(bert_folder, dtype=torch.bfloat16)
    message = str(rec[0].message)
    assert "fp32 math on bf16 storage" in message and "dtype=torch.float32" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process: a second load is silent
        bertfast.from_pretrained(bert_folder, dtype=torch.bfloat16)


def test_no_warning_when_not_needed(bert_folder, fresh_warning, monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _no_bf16_cpu(monkeypatch)
        bertfast.from_pretrained(bert_folder, dtype=torch.float32)  # fp32: nothing to say
        monkeypatch.setattr(info, "cpu_info", lambda: {"flags": SPR})
        bertfast.from_pretrained(bert_folder, dtype=torch.bfloat16)  # native bf16
    assert info._BF16_WARNED is False


@pytest.mark.parametrize("isa", ["native", "avx512bf16", "avx512"])
def test_bf16_model_matches_transformers(tmp_path, isa, monkeypatch):
    """A random BERT (heads of 32 and 64) in bf16 on the cpu backend against
    transformers in fp32: its error is at most twice that of transformers run in bf16
    (plus one bf16 ulp of slack), on each attention path."""
    if isa == "native":
        monkeypatch.delenv("BERTFAST_CPU_ATTENTION_ISA", raising=False)
    else:
        monkeypatch.setenv("BERTFAST_CPU_ATTENTION_ISA", isa)
    for heads in (3, 2):
        hf = build("bert", hidden_size=96 if heads == 3 else 128, num_attention_heads=heads)
        folder = save(hf, str(tmp_path / f"h{heads}"))
        batch = make_batch("bert", lengths=(40, 23, 1, 39))
        real = batch["attention_mask"].bool()
        with torch.no_grad():
            ref = hf(**batch).last_hidden_state[real]
            ref16 = hf.to(torch.bfloat16)(**batch).last_hidden_state[real].float()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = bertfast.from_pretrained(folder, dtype=torch.bfloat16, backend="cpu")
        out = model(**batch).last_hidden_state
        assert out.dtype == torch.bfloat16
        err = (out[real].float() - ref).abs().max().item()
        ref_err = (ref16 - ref).abs().max().item()
        assert err <= 2 * ref_err + 3e-2, (heads, err, ref_err)


def test_info_names_native_dot_products(capsys, monkeypatch):
    """``bertfast info`` (text and JSON) says what the CPU has and which paths run."""
    import json

    from bertfast.cli import main

    real = info.cpu_info()
    monkeypatch.setattr(info, "cpu_info", lambda: {**real, "flags": ZEN3})
    monkeypatch.delenv("BERTFAST_CPU_ATTENTION_ISA", raising=False)
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "native bf16  : none (slow fallback)" in out
    assert "native int8  : none (slow fallback)" in out
    assert "bf16 attn    : fp32 math on bf16 storage (AVX2; no avx512_bf16)" in out
    monkeypatch.setattr(info, "cpu_info", lambda: {**real, "flags": SPR})
    assert main(["info", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cpu"]["native_dot_products"]["bf16"] == ["avx512_bf16", "amx_bf16"]
    assert data["cpu"]["low_precision_paths"]["bf16_attention"].startswith("AMX")
