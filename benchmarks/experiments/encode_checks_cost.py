"""What ``bertfast encode``'s safety checks cost on a normal run.

Issue 27 added, on every run: the checkpoint's content fingerprint (SHA-256 of every
file the loader reads, recorded for ``--resume``), the text check (lone surrogates)
and the pre-tokenisation cut of long texts. This runs ``bertfast encode`` on the same
input in fresh processes, alternating: ``with`` is the installed tree, ``without``
patches those three out in-process. It prints the load and encode seconds that
``bertfast encode`` reports (encode = the chunk loop, which gives texts/s) and the
medians; the outputs are compared equal. Only ratios within one run mean anything.

    python benchmarks/experiments/encode_checks_cost.py [--model FOLDER] [--texts 2000] [--rounds 4]

Default model: the bundled all-MiniLM-L6-v2; texts: bertfast/data/accuracy_corpus.txt,
repeated to ``--texts`` lines.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

_RUN = r"""
import sys
if sys.argv[1] == "without":
    from bertfast import embedder, fingerprint, tokenizer
    fingerprint.checkpoint_fingerprint = lambda folder: {}
    tokenizer.Tokenizer._cut = lambda self, inputs, max_length: inputs
    tokenizer.text_problem = lambda text: None
from bertfast import cli
sys.exit(cli.main(sys.argv[2:]))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="checkpoint folder (default: MiniLM)")
    ap.add_argument("--texts", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    corpus = Path(__file__).resolve().parents[2] / "bertfast" / "data" / "accuracy_corpus.txt"
    lines = corpus.read_text(encoding="utf-8").splitlines()
    texts = (lines * (args.texts // len(lines) + 1))[: args.texts]
    work = Path(tempfile.mkdtemp(prefix="bertfast-encode-cost-"))
    source = work / "in.txt"
    source.write_text("\n".join(texts) + "\n", encoding="utf-8")
    model = [] if args.model is None else [args.model]
    times: dict[str, list[tuple[float, float]]] = {"with": [], "without": []}
    first: dict[str, np.ndarray] = {}
    for r in range(args.rounds):
        for mode in times:
            out = work / f"{mode}-{r}.npy"
            cmd = [sys.executable, "-c", _RUN, mode, "encode", *model]
            cmd += ["-i", str(source), "-o", str(out), "--no-progress"]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            found = re.search(r"load ([\d.]+) s, encode ([\d.]+) s", done.stdout)
            times[mode].append((float(found.group(1)), float(found.group(2))))
            first.setdefault(mode, np.load(out))
            print(
                f"round {r} {mode:8s} load {times[mode][-1][0]:.2f} s, encode "
                f"{times[mode][-1][1]:.2f} s",
                flush=True,
            )
    assert np.array_equal(first["with"], first["without"]), "the checks changed a vector"
    med = {m: [statistics.median(t[i] for t in v) for i in (0, 1)] for m, v in times.items()}
    for mode, (load, enc) in med.items():
        print(
            f"{mode:8s} median load {load:.3f} s, encode {enc:.3f} s "
            f"({args.texts / enc:.1f} texts/s)"
        )
    (lw, ew), (lo, eo) = med["with"], med["without"]
    print(
        f"encode throughput with / without: {eo / ew:.3f}; load + encode: "
        f"{(lw + ew) / (lo + eo):.3f}x the time"
    )


if __name__ == "__main__":
    main()
