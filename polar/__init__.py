"""polar: capture token-level truth from unchanged agent harnesses, at the model API boundary."""

__version__ = "0.1.0"
