"""Sessions: which session a call belongs to, and what polar keeps per session."""
