"""The ``kvbench`` subcommands: one module per command, each exposing ``COMMAND``.

``MODULES`` is the order ``kvbench --help`` lists them in. The CLI imports each while it
builds its parser, so importing one must stay cheap: heavy imports (pandas, numpy, pyarrow,
torch, vllm) happen inside the command functions.
"""

from __future__ import annotations

MODULES: tuple[str, ...] = (
    "run",
    "calc",
    "workload",
    "report",
    "compare",
    "history",
    "export",
    "import_",
    "diverge",
    "calibrate",
    "fit_roofline",
    "doctor",
)
