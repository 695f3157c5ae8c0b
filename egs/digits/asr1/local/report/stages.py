"""Report section "Stage times": run.sh's done-markers exp/.done/<N>."""

import datetime
import os

#: the last stage before the report (run.sh: 13 score, 14 report)
LAST_STAGE = 13


def run_span(done_dir, last=LAST_STAGE):
    """Seconds from the first stage's start to the last stage's finish (stages 1 to
    ``last``).

    Each ``exp/.done/<N>`` holds ``<finish time ISO>, <seconds> s``; None when a marker
    is missing or unreadable (stages run in separate invocations still give a span,
    which then includes the time between them).
    """
    starts, ends = [], []
    for k in range(1, last + 1):
        try:
            with open(os.path.join(done_dir, str(k))) as f:
                stamp, secs = f.read().strip().split(", ")
            end = datetime.datetime.fromisoformat(stamp).timestamp()
            secs = float(secs.split()[0])
        except (OSError, ValueError):
            return None
        starts.append(end - secs)
        ends.append(end)
    return max(ends) - min(starts)


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
    span = run_span(done)
    if span:
        L.append("")
        L.append(
            f"Stages 1-{LAST_STAGE}, first start to last finish: {span / 60:.1f} min."
        )
    L.append("")
    return L
