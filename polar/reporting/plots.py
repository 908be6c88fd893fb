"""The report's plots: one matplotlib figure per topic, returned as an inline PNG (a data: URI).

Figures are built with the object API on an Agg canvas, never through pyplot, so rendering a
report changes no global matplotlib state of the process. Up to PER_SESSION sessions, plots show
one bar per session; past that, distributions over sessions (a bar per session stops being read).
Each function returns None when its inputs hold nothing to plot.
"""

from __future__ import annotations

import base64
import io
from collections import Counter, defaultdict

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from polar.reporting.gather import RunData, SessionStats

PER_SESSION = 40
DPI = 110
WIDTH = 10.0  # inches
STYLE = {
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.titleweight": "bold",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "axes.axisbelow": True,
    "grid.alpha": 0.3,
    "legend.fontsize": 8,
    "legend.frameon": False,
}
OUTCOME_COLORS = {"ok": "#2e7d32", "timeout": "#ef6c00", "error": "#c62828", "stale": "#757575",
                  "cancelled": "#6a1b9a", "looping": "#f9a825", "stalled": "#8d6e63", "budget": "#00838f"}
STAGE_ORDER = ["init", "run", "postrun"]
BLUE, LIGHT_BLUE, GREY, RED = "#1565c0", "#90caf9", "#9e9e9e", "#c62828"


def data_uri(fig: Figure) -> str:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    with matplotlib.rc_context(STYLE):
        fig.savefig(buf, format="png", dpi=DPI)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _figure(rows: int, cols: int, height: float, **kwargs) -> tuple[Figure, np.ndarray]:
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(WIDTH, height), layout="constrained")
        axes = fig.subplots(rows, cols, squeeze=False, **kwargs)
    return fig, axes.ravel()


def _height(bars: int) -> float:
    return min(2.0 + 0.28 * bars, 14.0)


def _legend(fig: Figure) -> None:
    """One legend for the figure, below the plots (inside an axes it would cover bars)."""
    seen: dict[str, object] = {}
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    if seen:
        fig.legend(list(seen.values()), list(seen), loc="outside lower center", ncols=min(len(seen), 6))


def _distribution(ax, values: list[int], color: str) -> None:
    """How many sessions (or trajectories) have each value: a bar per value when few, else a histogram."""
    counts = Counter(values)
    lo, hi = min(counts), max(counts)
    if hi - lo <= 30:
        ax.bar(list(counts), list(counts.values()), color=color, width=0.7)
        ax.set_xticks(range(lo, hi + 1, max(1, (hi - lo) // 10 + 1)))
        ax.set_xlim(lo - 0.6, hi + 0.6)
        ax.grid(axis="x", visible=False)
    else:
        ax.hist(values, bins=30, color=color)
    _integer(ax.yaxis)


def _integer(axis) -> None:
    """Counts: ticks on whole numbers only."""
    axis.set_major_locator(MaxNLocator(integer=True))


def _labels(ax, labels: list[str]) -> None:
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()  # first session on top, as in the tables
    ax.grid(axis="y", visible=False)


# -- rewards and outcomes ----------------------------------------------------------------------------


def rewards(data: RunData) -> Figure | None:
    scored = [s for s in data.sessions if s.result is not None]
    if not scored:
        return None
    groups: dict[str, list[SessionStats]] = defaultdict(list)
    for s in scored:
        groups[f"{s.harness or '?'} · {s.task_id or '?'}"].append(s)
    names = sorted(groups)
    with matplotlib.rc_context(STYLE):
        fig, (left, right) = _figure(1, 2, _height(len(names)) + 0.6, sharey=True, width_ratios=[3, 2])
        fig.suptitle("Rewards and outcomes per harness · task", fontweight="bold")
        values = [r for s in scored if (r := s.reward) is not None]
        for i, name in enumerate(names):
            rs = [s.reward for s in groups[name] if s.reward is not None]
            if rs:
                ys = i + (np.linspace(-0.25, 0.25, len(rs)) if len(rs) > 1 else np.zeros(1))
                left.scatter(rs, ys, s=22, color=BLUE, alpha=0.7, label="session" if i == 0 else None)
                left.scatter([np.mean(rs)], [i], marker="D", s=60, color=RED, zorder=3,
                             label="mean" if i == 0 else None)
        lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
        lo, hi = min(lo, 0.0), max(hi, 1.0)
        left.set_xlim(lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo))
        left.set_title("Reward per session")
        left.set_xlabel("reward")
        left.set_ylabel("harness · task")
        if not values:
            left.text(0.5, 0.5, "no session was scored", transform=left.transAxes, ha="center", color=GREY)
        _labels(left, names)
        counts = {name: Counter(s.outcome for s in groups[name]) for name in names}
        outcomes = [o for o in OUTCOME_COLORS if any(c[o] for c in counts.values())]
        start = np.zeros(len(names))
        for outcome in outcomes:
            n = np.array([counts[name][outcome] for name in names])
            right.barh(range(len(names)), n, left=start, color=OUTCOME_COLORS[outcome], label=outcome, height=0.6)
            start += n
        right.set_title("Outcomes")
        right.set_xlabel("sessions")
        _integer(right.xaxis)
        right.grid(axis="y", visible=False)
        _legend(fig)
    return fig


def reward_by_version(data: RunData) -> Figure | None:
    """A training run's learning curve: each session's reward by the policy version it ran under, the
    mean and spread per version, and the outcomes (stale: refused, too many versions behind)."""
    versions = data.by_policy_version()
    if len(versions) < 2:
        return None
    xs = list(versions)
    with matplotlib.rc_context(STYLE):
        fig, (left, right) = _figure(1, 2, 3.4, width_ratios=[3, 2])
        fig.suptitle("Reward by policy version", fontweight="bold")
        means, spreads, at = [], [], []
        for i, (version, sessions) in enumerate(versions.items()):
            rs = [s.reward for s in sessions if s.reward is not None]
            if not rs:
                continue
            jitter = np.linspace(-0.15, 0.15, len(rs)) if len(rs) > 1 else np.zeros(1)
            left.scatter(version + jitter, rs, s=12, color=LIGHT_BLUE, alpha=0.8, label="session" if i == 0 else None)
            at.append(version)
            means.append(float(np.mean(rs)))
            spreads.append(float(np.std(rs)))
        if means:
            m, sd = np.array(means), np.array(spreads)
            left.fill_between(at, m - sd, m + sd, color=BLUE, alpha=0.12, label="± std")
            left.plot(at, m, marker="o", color=BLUE, label="mean")
        left.set_title("Reward per session")
        left.set_xlabel("policy version")
        left.set_ylabel("reward")
        _integer(left.xaxis)
        counts = {v: Counter(s.outcome for s in ss) for v, ss in versions.items()}
        bottom = np.zeros(len(xs))
        for outcome, color in OUTCOME_COLORS.items():
            n = np.array([counts[v][outcome] for v in xs])
            if n.any():
                right.bar(xs, n, bottom=bottom, color=color, label=outcome, width=0.7)
                bottom += n
        right.set_title("Outcomes")
        right.set_xlabel("policy version")
        right.set_ylabel("sessions")
        _integer(right.xaxis)
        _integer(right.yaxis)
        right.grid(axis="x", visible=False)
        _legend(fig)
    return fig


# -- tokens and turns --------------------------------------------------------------------------------


def tokens(data: RunData) -> Figure | None:
    sessions = [s for s in data.sessions if s.trajectories or s.calls]
    if not sessions:
        return None
    context = [s.context_tokens for s in sessions]
    sampled = [s.sampled_tokens for s in sessions]
    turns = [s.turns for s in sessions]
    failed = [s.failed_calls or 0 for s in sessions]
    with matplotlib.rc_context(STYLE):
        if len(sessions) <= PER_SESSION:
            fig, axes = _figure(1, 3, _height(len(sessions)) + 0.6, sharey=True)
            ys = range(len(sessions))
            axes[0].barh(ys, context, color=GREY, height=0.6)
            axes[1].barh(ys, sampled, color=BLUE, height=0.6)
            if any(failed):
                axes[2].barh(ys, turns, color=BLUE, height=0.6, label="turns (sampled calls)")
                axes[2].barh(ys, failed, left=turns, color=RED, height=0.6, label="failed calls")
            else:
                axes[2].barh(ys, turns, color=BLUE, height=0.6)
            axes[0].set_ylabel("session")
            _labels(axes[0], [s.session_id for s in sessions])
            for ax, unit in zip(axes, ("tokens", "tokens", "calls")):
                ax.set_xlabel(unit)
            _integer(axes[2].xaxis)
        else:
            fig, axes = _figure(1, 3, 3.2)
            _distribution(axes[0], context, GREY)
            _distribution(axes[1], sampled, BLUE)
            _distribution(axes[2], turns, BLUE)
            axes[0].set_ylabel("sessions")
            for ax, unit in zip(axes, ("context tokens", "sampled tokens", "turns (sampled calls)")):
                ax.set_xlabel(unit)
        axes[0].set_title("Context tokens (masked)")
        axes[1].set_title("Sampled tokens (trainable)")
        axes[2].set_title("Turns per session")
        fig.suptitle("Tokens and turns per session", fontweight="bold")
        _legend(fig)
    return fig


# -- stage timings and model-call latency --------------------------------------------------------------


def timings(data: RunData) -> Figure | None:
    sessions = [s for s in data.sessions if s.timings]
    if not sessions:
        return None
    keys = {k for s in sessions for k in s.timings}
    stages = [k for k in STAGE_ORDER if k in keys] + sorted(keys - set(STAGE_ORDER))
    colors = dict(zip(stages, ["#8e24aa", BLUE, "#00897b", "#f9a825", "#6d4c41", GREY]))
    with matplotlib.rc_context(STYLE):
        if len(sessions) <= PER_SESSION:
            fig, (ax,) = _figure(1, 1, _height(len(sessions)) + 0.6)
            start = np.zeros(len(sessions))
            for stage in stages:
                secs = np.array([s.timings.get(stage, 0.0) for s in sessions])
                ax.barh(range(len(sessions)), secs, left=start, height=0.6, color=colors.get(stage, GREY),
                        label=stage.upper())
                start += secs
            _labels(ax, [s.session_id for s in sessions])
            ax.set_ylabel("session")
            ax.set_title("Seconds per stage, per session")
        else:
            fig, (ax,) = _figure(1, 1, 1.5 + 0.5 * len(stages))
            ax.boxplot([[s.timings[k] for s in sessions if k in s.timings] for k in stages], vert=False,
                       patch_artist=True, boxprops={"facecolor": LIGHT_BLUE}, medianprops={"color": RED})
            ax.set_yticks(range(1, len(stages) + 1), [k.upper() for k in stages])
            ax.set_ylabel("stage")
            ax.set_title(f"Seconds per stage over {len(sessions)} sessions")
        ax.set_xlabel("seconds")
        fig.suptitle("Stage timings", fontweight="bold")
        _legend(fig)
    return fig


def call_latency(data: RunData) -> Figure | None:
    times = [t for s in data.sessions for t in s.call_times]
    if not times:
        return None
    upstream = np.array([t.upstream for t in times]) * 1000
    own = np.array([max(t.seconds - t.upstream, 0.0) for t in times]) * 1000
    with matplotlib.rc_context(STYLE):
        fig, (left, right) = _figure(1, 2, 3.0)
        left.hist(upstream, bins=min(30, max(5, len(times))), color=BLUE)
        right.hist(own, bins=min(30, max(5, len(times))), color="#00897b")
        left.set_title("Upstream (vLLM) wait per call")
        right.set_title("polar's own time per call")
        for ax in (left, right):
            ax.set_xlabel("milliseconds")
            ax.set_ylabel("calls")
            _integer(ax.yaxis)
        fig.suptitle(f"Model-call latency ({len(times)} calls)", fontweight="bold")
    return fig


# -- prefix merge --------------------------------------------------------------------------------------


def prefix_merge(data: RunData) -> Figure | None:
    sessions = [s for s in data.sessions if s.trajectories]
    if not sessions:
        return None
    trajectories = data.trajectories
    with matplotlib.rc_context(STYLE):
        fig, (left, middle, right) = _figure(
            1, 3, max(_height(len(sessions)) if len(sessions) <= PER_SESSION else 3.2, 3.2) + 0.6,
            width_ratios=[3, 2, 2])
        if len(sessions) <= PER_SESSION:
            ys = range(len(sessions))
            roots, forks = [s.roots for s in sessions], [s.forks for s in sessions]
            left.barh(ys, roots, color=BLUE, height=0.6, label="roots")
            left.barh(ys, forks, left=roots, color=LIGHT_BLUE, height=0.6, label="forks")
            _labels(left, [s.session_id for s in sessions])
            left.set_ylabel("session")
            left.set_xlabel("trajectories")
            _integer(left.xaxis)
        else:
            _distribution(left, [len(s.trajectories) for s in sessions], BLUE)
            left.set_xlabel("trajectories in a session")
            left.set_ylabel("sessions")
        left.set_title("Trajectories per session")
        _distribution(middle, [len(t.turns) for t in trajectories], BLUE)
        middle.set_title("Calls per trajectory")
        middle.set_xlabel("calls (turns)")
        middle.set_ylabel("trajectories")
        flags = {"fork": sum(t.lineage is not None for t in trajectories),
                 "broken prefix": sum(t.broken_prefix for t in trajectories),
                 "truncated": sum(t.truncated for t in trajectories),
                 "partial": sum(t.partial for t in trajectories)}
        bars = right.barh(range(len(flags)), list(flags.values()), color=[LIGHT_BLUE, RED, "#ef6c00", "#6a1b9a"],
                          height=0.6)
        right.bar_label(bars, padding=3)
        right.set_xlim(0, max(max(flags.values()), 1) * 1.25)
        _labels(right, list(flags))
        right.set_title(f"Flags over {len(trajectories)} trajectories")
        right.set_xlabel("trajectories")
        right.set_ylabel("flag")
        _integer(right.xaxis)
        fig.suptitle("Prefix-merge trajectories", fontweight="bold")
        _legend(fig)
    return fig


# -- drift -----------------------------------------------------------------------------------------------


def drift(data: RunData) -> Figure | None:
    """Only when something drifted: sampled tokens that did not come back, or a broken prefix."""
    reports = data.drift or []
    if not any(r.breaks or r.reappeared_tokens < r.carried_tokens for r in reports):
        return None
    breaks = [(i, r.session_id, b) for i, r in enumerate(reports) for b in r.breaks]
    regions = {"context": GREY, "sampled": BLUE, "end-of-prompt": RED}
    with matplotlib.rc_context(STYLE):
        if len(reports) <= PER_SESSION:
            fig, (left, right) = _figure(1, 2, _height(len(reports)) + 0.6, sharey=True)
            ys = range(len(reports))
            left.barh(ys, [r.carried_tokens for r in reports], color=LIGHT_BLUE, height=0.6,
                      label="carried into a later prompt")
            left.barh(ys, [r.reappeared_tokens for r in reports], color=BLUE, height=0.35,
                      label="reappeared unchanged")
            left.set_xlabel("sampled tokens")
            left.set_ylabel("session")
            for region, color in regions.items():
                points = [(b.position, i) for i, _, b in breaks if b.region == region]
                if points:
                    xs, ys_ = zip(*points)
                    right.scatter(xs, ys_, color=color, s=40, label=f"in {region}", zorder=3)
            _labels(left, [r.session_id for r in reports])
        else:
            fig, (left, right) = _figure(1, 2, 3.2)
            left.hist([r.reappeared_fraction for r in reports], bins=20, range=(0, 1), color=BLUE)
            left.set_xlabel("fraction of carried sampled tokens that reappeared")
            left.set_ylabel("sessions")
            for region, color in regions.items():
                positions = [b.position for _, _, b in breaks if b.region == region]
                if positions:
                    right.hist(positions, bins=30, color=color, alpha=0.7, label=f"in {region}")
            right.set_ylabel("breaks")
        left.set_title("Sampled tokens carried and kept")
        right.set_title(f"Where prefixes broke ({len(breaks)} break{'' if len(breaks) == 1 else 's'})")
        right.set_xlabel("token position of the first difference")
        right.ticklabel_format(axis="x", style="plain", useOffset=False)
        if breaks:  # from 0: where in the sequence, not how far apart the breaks are
            right.set_xlim(0, max(b.position for _, _, b in breaks) * 1.08 + 1)
        else:
            right.text(0.5, 0.5, "no prefix break", transform=right.transAxes, ha="center", color=GREY)
        fig.suptitle("Drift: do sampled tokens come back unchanged?", fontweight="bold")
        _legend(fig)
    return fig


def verification(data: RunData) -> Figure | None:
    """Per trajectory, its largest |Δ logprob| (log scale), verified and failed apart; the tolerance as a line."""
    if data.verification is None:
        return None
    found = [data.verification.lookup(t) for t in data.trajectories]
    worst = {s: [r.max_abs_diff for state, r in found if state == s and r and r.max_abs_diff is not None]
             for s in ("verified", "failed")}
    if not any(worst.values()):
        return None
    fig, (ax,) = _figure(1, 1, 2.8)
    floor = 1e-7  # an exact match (Δ = 0) still shows, at the left edge
    values = [max(v, floor) for vs in worst.values() for v in vs]
    bins = np.logspace(np.log10(min(values)), np.log10(max(values)) + 1e-9, 30) if len(set(values)) > 1 else 10
    for state, color in (("verified", BLUE), ("failed", RED)):
        if worst[state]:
            ax.hist([max(v, floor) for v in worst[state]], bins=bins, color=color, alpha=0.8, label=state)
    for tolerance in {r.tolerance for _, r in found if r and r.tolerance is not None and np.isfinite(r.tolerance)}:
        ax.axvline(tolerance, color=GREY, linestyle="--", label=f"tolerance {tolerance:g}")
    ax.set_xscale("log")
    ax.set_xlabel("max |Δ logprob| in the trajectory")
    ax.set_ylabel("trajectories")
    _integer(ax.yaxis)
    ax.legend()
    return fig
