"""Trajectories rebuilt from captured calls: the format, the builders, the drift report, files."""

from polar.trajectories.builders import BUILDERS, per_request, prefix_merge, summary
from polar.trajectories.drift import SessionDrift, drift_report
from polar.trajectories.model import Lineage, PrefixBreak, Trajectory, Turn

__all__ = [
    "BUILDERS",
    "Lineage",
    "PrefixBreak",
    "SessionDrift",
    "Trajectory",
    "Turn",
    "drift_report",
    "per_request",
    "prefix_merge",
    "summary",
]
