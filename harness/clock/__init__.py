"""Step clocks: how long a scheduler step takes. GPU presets and fitted terms (``model``), the
profile files that carry fitted terms (``profile``), the clocks that price steps (``clocks``) and the
fit of terms to an engine's measured steps (``fit``); docs/clock.md states the model."""
