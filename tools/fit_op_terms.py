"""Fits the tables clock's operation model on the shipped A100 and A40 tables and writes its terms
beside them (``harness/clock/tables/op_terms.json``), which the clock reads instead of fitting in
every process. Run it after the tables or the model's form change; ``tests/clock/test_gpu_tables.py``
fails while the file and a fresh fit differ.

    python tools/fit_op_terms.py
"""

from __future__ import annotations

from kvbench.harness.clock.op_model import write_op_terms
from kvbench.harness.clock.tables_clock import OP_TERMS_FILE, fit_shipped_op_terms


def main() -> None:
    terms = fit_shipped_op_terms()
    write_op_terms(terms, OP_TERMS_FILE)
    print(f"wrote {OP_TERMS_FILE} ({len(terms)} operations)")


if __name__ == "__main__":
    main()
