"""Report section "Stage times": run.sh's done-markers exp/.done/<N>."""

import datetime
import os

#: the last stage before the report (run.sh: 15 score, 16 report)
LAST_STAGE = 15
#: stages a run may leave out (9: no --sherpa_models)
OPTIONAL = {9}


def stage_intervals(done_dir, last=LAST_STAGE):
    """[(start, finish)] in seconds since the epoch of stages 1 to ``last``; None when
    a marker is missing or unreadable.

    Each ``exp/.done/<N>`` holds ``<finish time ISO>, <seconds> s``.
    """
    out = []
    for k in range(1, last + 1):
        if k in OPTIONAL and not os.path.exists(os.path.join(done_dir, str(k))):
            continue
        try:
            with open(os.path.join(done_dir, str(k))) as f:
                stamp, secs = f.read().strip().split(", ")
            end = datetime.datetime.fromisoformat(stamp).timestamp()
            secs = float(secs.split()[0])
        except (OSError, ValueError):
            return None
        out.append((end - secs, end))
    return out


def run_span(done_dir, last=LAST_STAGE):
    """Seconds from the first stage's start to the last stage's finish (stages 1 to
    ``last``); None when a marker is missing (stages run in separate invocations
    still give a span, which then includes the time between them)."""
    intervals = stage_intervals(done_dir, last)
    if not intervals:
        return None
    return max(e for _, e in intervals) - min(s for s, _ in intervals)


def busy_time(done_dir, last=LAST_STAGE):
    """Seconds during which some stage of 1 to ``last`` ran: the union of their
    intervals (side-by-side stages count once, the time between separate invocations
    not at all); None when a marker is missing."""
    intervals = stage_intervals(done_dir, last)
    if not intervals:
        return None
    total, cur_start, cur_end = 0.0, None, None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    return total + (cur_end - cur_start)


def section(exp):
    """Markdown lines of the section ([] without markers)."""
    done = os.path.join(exp, ".done")
    if not os.path.isdir(done):
        return []
    L = ["## Stage times", "", "| stage | finished, seconds |", "|---|---|"]
    stages = [k for k in os.listdir(done) if k.isdigit() and int(k) <= LAST_STAGE]
    for k in sorted(stages, key=int):
        L.append(f"| {k} | {open(os.path.join(done, k)).read().strip()} |")
    L.append("")
    L.append("(the report stage itself is not listed.)")
    span, busy = run_span(done), busy_time(done)
    if span:
        L.append("")
        line = (
            f"Stages 1-{LAST_STAGE}, first start to last finish: {span / 60:.1f} min."
        )
        if busy is not None and span - busy > 60:
            line += (
                f" The stages ran in separate invocations: {busy / 60:.1f} min while "
                "a stage ran (side-by-side stages counted once)."
            )
        L.append(line)
    L.append("")
    return L
