"""One module per model family's output format: its `TurnParser` (registered in polar/tokens/parsers.py)."""
