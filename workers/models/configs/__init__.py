"""Each model family's `Config`, `PRESETS` and `validate`, importable without torch."""
