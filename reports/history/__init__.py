"""``kvbench history DIR``: every night of a nightly results directory read together.

``nights`` finds and reads the nights, ``series`` matches their cells and makes one series per
cell and metric, ``changes`` finds where each changed and judges tonight (the gate), ``page``
draws the page and ``output`` writes it, and the changes as JSON. docs/ci.md, "History across
nights", says what each holds and why the methods are the ones they are.
"""
