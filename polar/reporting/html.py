"""RunData → one self-contained HTML page: inline CSS, plots as data: URIs, no script, no external URL."""

from __future__ import annotations

import datetime as dt
import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import jinja2
from matplotlib.figure import Figure

from polar.reporting import plots
from polar.reporting.gather import RunData, SessionStats
from polar.trajectories.model import Trajectory

TABLE_ROWS = 200  # longer per-session tables are cut (the plots still cover every session)
FOLD_ROWS = 20  # longer tables start folded (<details>: no script needed to open them)


@dataclass
class Plot:
    key: str  # data-plot attribute: what tests and readers look for
    title: str
    uri: str
    caption: str


def render(data: RunData, title: str = "polar run report") -> str:
    sections = [_summary(data), _rewards(data), _tokens(data), _timings(data), _prefix_merge(data), _drift(data)]
    if data.verification is not None:  # an input of its own (polar verify's results): its section comes with it
        sections.append(_verification(data))
    if data.replicas:  # the run sampled on a fleet of replicas
        sections.append(_replicas(data))
    generated = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return _TEMPLATE.render(title=title, sections=sections, generated=generated, FOLD_ROWS=FOLD_ROWS,
                            inputs=[("rollout state", data.state_path), ("capture DB", data.captures_path)])


# -- sections ---------------------------------------------------------------------------------------------


@dataclass
class Section:
    key: str
    title: str
    intro: str = ""
    notes: list[str] | None = None
    plots: list[Plot] | None = None
    tables: list[Table] | None = None


@dataclass
class Table:
    caption: str
    header: list[str]
    rows: list[list[object]]
    total: int | None = None  # rows before the cut, when cut
    kv: bool = False  # a two-column key / value table

    @classmethod
    def of(cls, caption: str, header: list[str], rows: list[list[object]]) -> Table:
        return cls(caption, header, rows[:TABLE_ROWS], len(rows) if len(rows) > TABLE_ROWS else None)


def _plot(key: str, title: str, build: Callable[[RunData], Figure | None], data: RunData, caption: str) -> Plot | None:
    fig = build(data)
    return None if fig is None else Plot(key, title, plots.data_uri(fig), caption)


def _summary(data: RunData) -> Section:
    sessions, results = data.sessions, data.results
    rows: list[list[object]] = []
    unfinished = Counter(s.stage for s in sessions if s.result is None and s.stage)
    line = f"{len(sessions)}"
    if data.has_state:
        in_flight = "".join(f", {n} {stage}" for stage, n in sorted(unfinished.items()))
        line += f" ({len(results)} finished{in_flight})"
    rows.append(["sessions", line])
    if data.has_state:
        outcomes = Counter(r.outcome for r in results)
        rows.append(["outcomes", " · ".join(f"{o} {n}" for o, n in outcomes.most_common()) or "none yet"])
        cut = Counter(r.cut["reason"] for r in results if r.cut)
        rows.append(["cut by the watchdog", " · ".join(f"{o} {n}" for o, n in sorted(cut.items())) or "none"])
        rewards = [r.reward for r in results if r.reward is not None]
        rows.append(["mean reward", f"{statistics.fmean(rewards):.3f} over {len(rewards)} scored sessions "
                     f"(min {min(rewards):.3f}, max {max(rewards):.3f})" if rewards else "no session scored"])
    if data.has_captures:
        calls = sum(s.calls or 0 for s in sessions)
        failed = sum(s.failed_calls or 0 for s in sessions)
        rows.append(["calls captured", f"{calls} ({sum(s.turns for s in sessions)} in trajectories, {failed} failed)"])
    trajs = data.trajectories
    forks = sum(t.lineage is not None for t in trajs)
    rows.append(["trajectories", f"{len(trajs)} ({len(trajs) - forks} roots, {forks} forks); "
                 f"{_count(sum(t.broken_prefix for t in trajs), 'broken prefix', 'broken prefixes')}, "
                 f"{sum(t.truncated for t in trajs)} truncated, "
                 f"{sum(t.partial for t in trajs)} partial"])
    rows.append(["logprobs", _logprobs_line(trajs)])
    tokens = (f"{sum(s.sampled_tokens for s in sessions):,} sampled (trainable), "
              f"{sum(s.context_tokens for s in sessions):,} context (masked)")
    if data.has_captures:
        tokens += f"; {sum(s.prompt_tokens_sent or 0 for s in sessions):,} prompt tokens sent upstream"
    rows.append(["tokens", tokens])
    stage_means = _stage_means(sessions)
    if stage_means:
        rows.append(["mean stage time", " · ".join(f"{k.upper()} {v:.1f}s" for k, v in stage_means.items())])
    if data.drift is not None:
        carried = sum(r.carried_tokens for r in data.drift)
        kept = sum(r.reappeared_tokens for r in data.drift)
        rows.append(["drift", f"{kept:,} of {carried:,} carried sampled tokens reappeared unchanged"
                     f" ({kept / carried if carried else 1.0:.1%}); {_count(data.breaks, 'prefix break')}"])
    if data.verification is not None:
        v = data.verification.summary(data.trajectories)
        rows.append(["verification", f"{v['verified']} of {v['trajectories']} trajectories within tolerance, "
                     f"{v['failed']} failed, {v['stale']} stale, {v['not_verified']} not verified"])
    if data.capture_span:
        start, end = data.capture_span
        rows.append(["captured", f"{_time(start)} → {_time(end)} ({end - start:.1f}s)"])
    notes = []
    if not data.has_state:
        notes.append("Capture DB only: no outcomes, rewards or stage timings (give the rollout state with --state). "
                     "Trajectories are rebuilt from the captured calls with the prefix-merge builder.")
    if not data.has_captures:
        notes.append("Rollout state only: no failed calls, call latency or drift report "
                     "(give the capture DB with --db).")
    return Section("summary", "Summary", notes=notes, tables=[Table("run", [], rows, kv=True)])


def _logprobs_line(trajs: list[Trajectory]) -> str:
    turns = sum(len(t.turns) for t in trajs)
    missing = sum(t.turns_without_logprobs for t in trajs)
    if not missing:
        return f"captured for every turn ({turns})"
    hit = sum(not t.has_logprobs for t in trajs)
    return (f"{missing} of {turns} turns without logprobs (the upstream returned none: null in the trajectories and "
            f"exports, never 0.0), in {_count(hit, 'trajectory', 'trajectories')}")


def _rewards(data: RunData) -> Section:
    section = Section("rewards", "Rewards and outcomes")
    if not data.has_state:
        section.notes = ["Needs the rollout state (--state): the capture DB holds no rewards."]
        return section
    plot = _plot("rewards", "Rewards and outcomes", plots.rewards, data,
                 "Each dot is a session's reward; the diamond is the mean of its harness · task group.")
    section.plots = [plot] if plot else None
    groups: dict[tuple[str, str], list[SessionStats]] = {}
    for s in data.sessions:
        if s.result is not None:
            groups.setdefault((s.harness or "?", s.task_id or "?"), []).append(s)
    rows = []
    for (harness, task), ss in sorted(groups.items()):
        rewards = [s.reward for s in ss if s.reward is not None]
        outcomes = Counter(s.outcome for s in ss)
        rows.append([harness, task, len(ss), " · ".join(f"{o} {n}" for o, n in outcomes.most_common()),
                     statistics.fmean(rewards) if rewards else "–", min(rewards) if rewards else "–",
                     max(rewards) if rewards else "–"])
    section.tables = [Table.of("per harness · task", ["harness", "task", "sessions", "outcomes", "mean reward",
                                                      "min", "max"], rows)]
    curve = _plot("reward-by-version", "Reward by policy version", plots.reward_by_version, data,
                  "A training run's learning curve: each dot is a session at the policy version it ran under "
                  "(the trainer's, from pause/resume); the line is the mean, the band ± one standard deviation.")
    if curve:
        section.plots = [*(section.plots or []), curve]
        section.tables.append(Table.of("per policy version", ["policy version", "sessions", "outcomes", "mean reward",
                                                              "std", "min", "max"], _version_rows(data)))
    failed = [[s.session_id, s.outcome, (s.result.error or "")[:400]] for s in data.sessions
              if s.result is not None and s.outcome != "ok"]
    if failed:
        section.tables.append(Table.of("sessions that did not end ok", ["session", "outcome", "error"], failed))
    if not data.results:
        section.notes = ["No session has finished yet."]
    return section


def _version_rows(data: RunData) -> list[list[object]]:
    rows: list[list[object]] = []
    for version, sessions in data.by_policy_version().items():
        rewards = [s.reward for s in sessions if s.reward is not None]
        outcomes = Counter(s.outcome for s in sessions)
        stats = [statistics.fmean(rewards), statistics.pstdev(rewards), min(rewards), max(rewards)] if rewards else ["–"] * 4
        rows.append([version, len(sessions), " · ".join(f"{o} {n}" for o, n in outcomes.most_common()), *stats])
    return rows


def _tokens(data: RunData) -> Section:
    section = Section("tokens", "Tokens and turns per session",
                      "Context tokens are the masked positions of a session's trajectories (prompts, tool results, "
                      "template glue), each counted once; sampled tokens are what the policy produced and what the "
                      "loss is computed on. A turn is one sampled call.")
    plot = _plot("tokens", "Tokens and turns per session", plots.tokens, data,
                 "Per session (or, for large runs, the distribution over sessions).")
    section.plots = [plot] if plot else None
    header = ["session", "task", "harness", "turns", "sampled tokens", "context tokens"]
    if data.has_captures:
        header += ["calls captured", "failed calls", "prompt tokens sent"]
    no_logprobs = any(s.turns_without_logprobs for s in data.sessions)  # the column only when it says something
    if no_logprobs:
        header.append("turns without logprobs")
    rows = []
    for s in data.sessions:
        row = [s.session_id, s.task_id or "–", s.harness or "–", s.turns, s.sampled_tokens, s.context_tokens]
        if data.has_captures:
            row += [s.calls or 0, s.failed_calls or 0, s.prompt_tokens_sent or 0]
        if no_logprobs:
            row.append(s.turns_without_logprobs)
        rows.append(row)
    section.tables = [Table.of("per session", header, rows)]
    if not rows:
        section.notes = ["No session in the inputs."]
    return section


def _timings(data: RunData) -> Section:
    section = Section("timings", "Stage timings",
                      "Seconds each session spent in the rollout stages: INIT (sandbox and harness set-up), RUN "
                      "(the harness working), POSTRUN (trajectories, evaluation, teardown).")
    found = [_plot("timings", "Stage timings", plots.timings, data,
                   "Seconds per stage, stacked per session (for large runs, their spread over sessions)."),
             _plot("latency", "Model-call latency", plots.call_latency, data,
                   "Per captured call: time waiting for the upstream, and the rest (polar's own work).")]
    section.plots = [p for p in found if p] or None
    notes = []
    if not data.has_state:
        notes.append("Stage timings need the rollout state (--state).")
    elif not any(s.timings for s in data.sessions):
        notes.append("No finished session recorded stage timings.")
    if not data.has_captures:
        notes.append("Model-call latency needs the capture DB (--db).")
    section.notes = notes or None
    return section


def _prefix_merge(data: RunData) -> Section:
    section = Section("prefix-merge", "Prefix-merge trajectories",
                      "A linear session becomes one trajectory; a call that continues an earlier call other than a "
                      "trajectory's last starts a fork (its lineage names the parent); a call that meant to continue "
                      "an earlier one but does not repeat its tokens marks a broken prefix. Truncated: a turn hit the "
                      "token limit. Partial: the conversation went on in calls that failed.")
    plot = _plot("prefix-merge", "Prefix-merge trajectories", plots.prefix_merge, data,
                 "Roots and forks per session, calls per trajectory, and flag counts.")
    section.plots = [plot] if plot else None
    rows = []
    for s in data.sessions:
        if not s.trajectories:
            continue
        per = [len(t.turns) for t in s.trajectories]
        rows.append([s.session_id, len(s.trajectories), s.roots, s.forks, statistics.fmean(per), max(per),
                     s.broken, s.truncated, s.partial])
    section.tables = [Table.of("per session", ["session", "trajectories", "roots", "forks", "calls / trajectory",
                                               "max calls", "broken", "truncated", "partial"], rows)]
    forks = [[t.id, t.lineage.parent_id, t.lineage.parent_row_id, t.lineage.fork_position, len(t.turns)]
             for t in data.trajectories if t.lineage is not None]
    if forks:
        section.tables.append(Table.of("lineage of the forks", ["fork", "parent", "after row", "fork position",
                                                                "calls"], forks))
    if not rows:
        section.notes = ["No trajectory in the inputs."]
    return section


def _drift(data: RunData) -> Section:
    section = Section("drift", "Drift report",
                      "Per session: how many sampled tokens a later call carried in its prompt, how many of them "
                      "reappeared unchanged, and where a prefix broke (the first token where a continuing prompt "
                      "left the earlier sequence).")
    if data.drift is None:
        section.notes = ["Needs the capture DB (--db)."]
        return section
    plot = _plot("drift", "Drift", plots.drift, data,
                 "Carried vs. kept sampled tokens, and the position of each break.")
    section.plots = [plot] if plot else None
    if plot is None:
        section.notes = ["No drift: every carried sampled token reappeared unchanged and no prefix broke."]
    rows = [[r.session_id, r.calls, r.samples, ", ".join(f"{k} {v}" for k, v in sorted(r.not_ok.items())) or "–",
             r.trajectories, r.sampled_tokens, r.carried_tokens, r.reappeared_tokens, f"{r.reappeared_fraction:.1%}",
             len(r.breaks)] for r in data.drift]
    section.tables = [Table.of("per session", ["session", "calls", "samples", "not ok", "trajectories", "sampled",
                                               "carried", "reappeared", "kept", "breaks"], rows)]
    breaks = [[r.session_id, b.row_id, b.earlier_row_id, b.evidence, b.position,
               b.region + (f" of row {b.region_row_id}" if b.region_row_id is not None else ""), b.prompt_mode or "–",
               _window(b.expected_ids, b.expected_text), _window(b.actual_ids, b.actual_text)]
              for r in data.drift for b in r.breaks]
    if breaks:
        section.tables.append(Table.of("prefix breaks", ["session", "row", "left row", "evidence", "position", "in",
                                                         "prompt mode", "expected", "actual"], breaks))
    return section


def _replicas(data: RunData) -> Section:
    section = Section("replicas", "Fleet replicas",
                      "Each upstream replica's share of the run, from the capture rows: calls it answered or failed, "
                      "calls it failed that another replica then answered, sessions, tokens, the policy versions "
                      "its samples carry; with `--upstream`, each server's vLLM prefix-cache hit rate since it started. "
                      "Live load is in `polar rollout status`.")
    rows = [[r.replica, r.calls, r.ok, r.failed, r.failed_over, len(r.sessions), r.prompt_tokens, r.sampled_tokens,
             ", ".join(map(str, sorted(r.policy_versions))) or "–"] for r in data.replicas]
    header = ["replica", "calls", "ok", "failed", "failed over", "sessions", "prompt tokens", "sampled tokens",
              "policy versions"]
    if any(r.metrics is not None for r in data.replicas):  # `polar report --upstream`: read from vLLM now
        header.append("vLLM prefix-cache hit rate")
        for row, r in zip(rows, data.replicas, strict=True):
            rate = r.prefix_cache_hit_rate
            row.append("no answer" if r.metrics is None else "–" if rate is None else f"{rate:.1%}")
    section.tables = [Table.of("per replica", header, rows)]
    return section


def _verification(data: RunData) -> Section:
    assert data.verification is not None
    section = Section("verification", "Verification",
                      "polar verify recomputed every sampled token's logprob with the served weights and compared "
                      "it with the captured one (Δ = recomputed − captured). Failed: some token's |Δ| is over the "
                      "tolerance (a spike), or no logprob was captured to compare. Stale: the results are about "
                      "other tokens under the same trajectory id. Not verified: no result for the trajectory.")
    plot = _plot("verification", "Verification", plots.verification, data,
                 "Largest |Δ logprob| per trajectory it checked (verified or failed), against the tolerance it used.")
    section.plots = [plot] if plot else None
    order = {"failed": 0, "stale": 1, "not verified": 2, "verified": 3}
    rows = []
    for t in data.trajectories:
        state, r = data.verification.lookup(t)
        spikes = ", ".join(map(str, r.raw.get("spike_positions", [])[:8])) if r else ""
        rows.append([t.id, state, r.tokens if r else "–", r.missing if r else "–", _num(r and r.mean_abs_diff),
                     _num(r and r.max_abs_diff), r.spikes if r else "–", spikes or "–"])
    rows.sort(key=lambda row: order[row[1]])
    section.tables = [Table.of("per trajectory (failed first)", ["trajectory", "verdict", "tokens", "missing",
                                                                 "mean |Δ|", "max |Δ|", "spikes", "spikes at"], rows)]
    if not rows:
        section.notes = ["No trajectory in the inputs."]
    return section


def _num(x: float | None) -> str:
    return "–" if x is None else f"{x:.3g}"


# -- formatting -----------------------------------------------------------------------------------------


def _stage_means(sessions: list[SessionStats]) -> dict[str, float]:
    keys = {k for s in sessions for k in s.timings}
    ordered = [k for k in plots.STAGE_ORDER if k in keys] + sorted(keys - set(plots.STAGE_ORDER))
    return {k: statistics.fmean(s.timings[k] for s in sessions if k in s.timings) for k in ordered}


def _count(n: int, singular: str, plural: str | None = None) -> str:
    return f"{n} {singular if n == 1 else plural or singular + 's'}"


def _time(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _window(ids: list[int], text: str | None) -> str:
    return repr(text) if text is not None else " ".join(map(str, ids))


_CSS = """
:root { --fg: #1b1b1b; --muted: #5f6368; --line: #dadce0; --bg-alt: #f6f8fa; --accent: #1565c0; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.5 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); background: #fff; }
header, main { max-width: 1180px; margin: 0 auto; padding: 0 24px; }
header { padding-top: 24px; border-bottom: 1px solid var(--line); }
h1 { margin: 0 0 4px; font-size: 24px; }
h2 { margin: 0 0 8px; font-size: 19px; border-bottom: 2px solid var(--accent); padding-bottom: 4px; }
.meta { color: var(--muted); margin: 0 0 8px; }
nav { margin: 8px 0 12px; }
nav a { margin-right: 14px; color: var(--accent); text-decoration: none; }
section { margin: 28px 0; }
.intro, .note { color: var(--muted); max-width: 900px; }
.note { background: var(--bg-alt); border-left: 3px solid var(--line); padding: 6px 10px; }
figure.plot { margin: 12px 0 18px; }
figure.plot img { display: block; max-width: 100%; height: auto; border: 1px solid var(--line); }
figcaption { color: var(--muted); font-size: 13px; margin-top: 4px; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 13px; }
caption { text-align: left; font-weight: 600; padding-bottom: 4px; }
th, td { border-bottom: 1px solid var(--line); padding: 3px 10px; text-align: left; vertical-align: top; }
th { background: var(--bg-alt); }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td:first-child { white-space: nowrap; }
table.kv th { width: 170px; background: none; font-weight: 600; }
.cut { color: var(--muted); font-size: 12px; }
details { margin: 8px 0 16px; }
summary { cursor: pointer; font-weight: 600; font-size: 13px; }
code, .mono { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 12px; }
"""

_TEMPLATE = jinja2.Environment(autoescape=True, trim_blocks=True, lstrip_blocks=True).from_string("""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{{ title }}</title>
<style>""" + _CSS + """</style>
</head>
<body>
<header>
<h1>{{ title }}</h1>
<p class="meta">
{% for name, path in inputs if path %}
{{ name }}: <code>{{ path }}</code> ·
{% endfor %}
generated {{ generated }}</p>
<nav>{% for s in sections %}<a href="#{{ s.key }}">{{ s.title }}</a>{% endfor %}</nav>
</header>
<main>
{% for s in sections %}
<section id="{{ s.key }}">
<h2>{{ s.title }}</h2>
{% if s.intro %}<p class="intro">{{ s.intro }}</p>{% endif %}
{% for note in s.notes or [] %}<p class="note">{{ note }}</p>{% endfor %}
{% for p in s.plots or [] %}
<figure class="plot" data-plot="{{ p.key }}">
<img src="{{ p.uri }}" alt="{{ p.title }}">
<figcaption>{{ p.caption }}</figcaption>
</figure>
{% endfor %}
{% for t in s.tables or [] %}
{% set folded = t.rows | length > FOLD_ROWS %}
{% if folded %}<details><summary>{{ t.caption }}: {{ t.total or t.rows | length }} rows</summary>{% endif %}
<table{% if t.kv %} class="kv"{% endif %}>
{% if t.caption and not t.kv %}<caption>{{ t.caption }}</caption>{% endif %}
{% if t.header %}<thead><tr>{% for h in t.header %}<th>{{ h }}</th>{% endfor %}</tr></thead>{% endif %}
<tbody>
{% for row in t.rows %}
<tr>
{% for cell in row %}
{% if t.kv and loop.first %}
<th>{{ cell }}</th>
{% elif cell is number %}
<td class="num">{{ "%.3f" | format(cell) if cell is float else cell }}</td>
{% else %}
<td>{{ cell }}</td>
{% endif %}
{% endfor %}
</tr>
{% endfor %}
</tbody>
</table>
{% if t.total %}<p class="cut">first {{ t.rows | length }} of {{ t.total }} rows</p>{% endif %}
{% if folded %}</details>{% endif %}
{% endfor %}
</section>
{% endfor %}
</main>
</body>
</html>
""")
