"""The one error of `polar verify`: a run that cannot go ahead (bad input, no torch, a worker that died)."""


class VerifyError(ValueError):
    """The message says what is wrong and how to fix it; the CLI shows it as is (exit 2)."""
