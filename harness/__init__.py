"""kvbench harness: specs, KV geometry, allocation policies, scheduler, records, CLI."""

__version__ = "0.1.0"
