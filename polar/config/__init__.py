"""How polar is configured: its options, each declared once (options.py)."""
