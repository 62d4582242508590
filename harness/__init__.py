"""kvbench harness: the version, the errors and the safe reading of input files every layer
uses, and its rooms: clock, spec, records, formats, sim."""

__version__ = "0.1.0"
