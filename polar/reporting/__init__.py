"""`polar report`: a self-contained HTML report of a run (gather → plots → HTML).

`gather` reads a rollout state DB and/or a capture DB into a RunData; `render` turns it into one
HTML page whose plots are inline PNGs, readable offline and without JavaScript.
"""

from pathlib import Path

from polar.reporting.gather import ReportInputError, RunData, SessionStats, gather
from polar.reporting.html import render


def write_report(out: str | Path, state: str | Path | None = None,
                 captures: str | Path | list[str | Path] | tuple | None = None,
                 tokenizer=None, title: str = "polar run report", verification: list[str | Path] | tuple = (),
                 replica_metrics: dict[str, dict[str, float] | None] | None = None) -> RunData:
    """Gather the inputs, render them and write the page to `out`; returns what was gathered.
    `verification`: `polar verify --json` results files, shown against the run's trajectories.
    `replica_metrics`: fleet replicas' vLLM metrics by URL (polar/upstream/fleet/metrics.py; None: it did
    not answer), shown with each replica's share of the run."""
    data = gather(state, captures, tokenizer, verification)
    data.add_replica_metrics(replica_metrics or {})
    Path(out).write_text(render(data, title), encoding="utf-8")
    return data


__all__ = ["ReportInputError", "RunData", "SessionStats", "gather", "render", "write_report"]
