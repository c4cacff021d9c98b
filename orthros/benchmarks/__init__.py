"""Benchmarks of the inference engine (``orthros bench prefill|decode|e2e``); see
``docs/benchmarks.md``. Imports the engine, never the reverse."""
