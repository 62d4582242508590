"""A run row's status: a failure of the cell is a row (docs/records.md), never a missing run.

Apart from the schema (``schema.py`` re-exports them) so that the commands, which the CLI imports
while it builds its parser, name a status without loading pyarrow.
"""

from __future__ import annotations

OK, FAILED, INFEASIBLE, OOM = "ok", "failed", "infeasible", "oom"
STATUSES = (OK, FAILED, INFEASIBLE, OOM)
FAILURES = (FAILED, OOM)  # a cell that did not run to the end: `kvbench run` exits 1
