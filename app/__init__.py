"""The application on top of the layers: the ``kvbench`` command line, suite files, sweeps over
cells (in process or on Ray), the doctor and the GPU smoke check.

Nothing below imports this package: harness (specs, geometry, policies, scheduler, records) ←
workloads ← runners; reports read the records through harness alone.
"""
