"""Turn pytest-benchmark JSON from this suite into a Markdown report and PNG plots.

    python benchmarks/make_report.py RESULTS.json [MORE.json ...] [--out DIR]

Writes ``report.md``, ``e2e.png`` and ``kernels.png`` (whichever suites are present)
under ``DIR`` (default ``benchmarks/results/<device>/``) and prints the report, ending
with the targets section. The report itself is ``bertfast.bench.report`` (tables,
targets, plots: :func:`bertfast.bench.report.main`); this is its command line.
"""

from __future__ import annotations

import sys

from bertfast.bench.report import main

if __name__ == "__main__":
    sys.exit(main())
