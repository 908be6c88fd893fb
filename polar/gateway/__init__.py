"""The gateway pipeline: one model call in, one provider-shaped answer out, captured on the way."""
