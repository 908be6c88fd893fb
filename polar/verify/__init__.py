"""`polar verify`: does a trainer's own forward pass give the logprobs vLLM recorded? (docs/verify.md)

    compare.py  captured vs recomputed logprobs per trajectory: |Δ|, importance-ratio drift, spikes, ok
    runner.py   the worker process, under a Python with torch + transformers (polar's own or another venv's)
    worker.py   that worker: standalone (no polar import), loads the served weights, recomputes logprobs
    run.py      a run over a capture DB's trajectories; the summary
    results.py  the results file (`polar verify --json` lines) that `polar report` and `polar export` read
"""

from polar.verify.compare import DEFAULT_RATIO_THRESHOLD, DEFAULT_TOLERANCE, Tolerance, TrajectoryCheck, compare
from polar.verify.errors import VerifyError
from polar.verify.results import Record, Verification, read_records
from polar.verify.run import VerifyRun, iter_checks, load_trajectories, summarize, verify
from polar.verify.runner import Worker, find_python

__all__ = [
    "DEFAULT_RATIO_THRESHOLD",
    "DEFAULT_TOLERANCE",
    "Record",
    "Tolerance",
    "TrajectoryCheck",
    "Verification",
    "VerifyError",
    "VerifyRun",
    "Worker",
    "compare",
    "find_python",
    "iter_checks",
    "load_trajectories",
    "read_records",
    "summarize",
    "verify",
]
