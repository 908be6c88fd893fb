"""Captures: one SQLite row per model call (schema.py), written by one writer thread (writer.py) from typed
records (records.py), token ids stored linearly (tokens.py), read back read-only (reader.py)."""
