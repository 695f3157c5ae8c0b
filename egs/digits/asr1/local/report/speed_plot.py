"""The plot of the decoding section: WER against search time, every model and search.

The search names are placed next to their markers where they overlap no other name,
marker or the axes' edge (the first free place of a few around the marker, else the
least covered one): neighbouring points of one model (e.g. ``greedy`` and
``mb_greedy`` of the standard model at the same WER) would otherwise print over each
other. The log time axis is labelled with plain seconds at 1-2-5 steps, no minor tick
labels.
"""

import math
import os

#: where a name may go, in points from its marker: (dx, dy, horizontal alignment)
PLACES = [
    (6, 4, "left"),
    (6, -12, "left"),
    (-6, 4, "right"),
    (-6, -12, "right"),
    (0, 9, "center"),
    (0, -17, "center"),
    (10, 14, "left"),
    (-10, 14, "right"),
    (10, -22, "left"),
    (-10, -22, "right"),
]


def points(res, jobs, test_set):
    """[(model, search, search seconds, WER)] of the decodings that have both."""
    out = []
    for m, search in jobs:
        sc, st = res.get((m, search, test_set), (None, None))
        if sc and st and st.get("search_seconds") is not None:
            out.append((m, search, float(st["search_seconds"]), float(sc["wer"])))
    return out


def nice_ticks(lo, hi):
    """Tick values at 1-2-5 steps covering [lo, hi] (lo > 0), at least two."""
    ticks = []
    for e in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1):
        for m in (1, 2, 5):
            v = m * 10.0**e
            if lo <= v <= hi:
                ticks.append(v)
    if len(ticks) < 2:  # a narrow range: its ends
        ticks = sorted({lo, hi})
    return ticks


def plain_seconds(v, _pos=None):
    return f"{v:g}"


def _overlap(a, b):
    """Area of the intersection of two display-space boxes."""
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return w * h if w > 0 and h > 0 else 0.0


def place_labels(ax, fig, pts, fontsize=8):
    """Annotate every point with its search name at the first place of ``PLACES``
    where it overlaps nothing already drawn (names, markers) and stays inside the
    axes; else at the least covered place. Returns the annotations."""
    from matplotlib.transforms import Bbox

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    taken = []
    for _, _, secs, wer in pts:  # every marker, as a small box
        x, y = ax.transData.transform((secs, wer))
        taken.append(Bbox.from_extents(x - 5, y - 5, x + 5, y + 5))
    markers = len(taken)
    legend = ax.get_legend()
    if legend is not None:
        taken.append(legend.get_window_extent(renderer))
    labels = []
    for i, (_, search, secs, wer) in enumerate(pts):
        best = None
        for dx, dy, ha in PLACES:
            ann = ax.annotate(
                search,
                (secs, wer),
                textcoords="offset points",
                xytext=(dx, dy),
                ha=ha,
                fontsize=fontsize,
            )
            box = ann.get_window_extent(renderer)
            cover = sum(
                _overlap(box, t) for j, t in enumerate(taken) if j != i or j >= markers
            )
            outside = box.width * box.height - _overlap(box, frame)
            cost = cover + outside
            if best is None or cost < best[0]:
                if best is not None:
                    best[1].remove()
                best = (cost, ann, box)
            else:
                ann.remove()
            if cost == 0:
                break
        taken.append(best[2])
        labels.append(best[1])
    return labels


def plot(res, jobs, test_set, out_png):
    """Write ``out_png``: WER (%) on ``test_set`` against the search time (s), one
    marker per model, the search written next to it. Returns the points drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    pts = points(res, jobs, test_set)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    markers = {}
    for m, search, secs, wer in pts:
        if m not in markers:
            markers[m] = "osD^v<>"[len(markers) % 7]
            ax.scatter([], [], marker=markers[m], color=f"C{len(markers) - 1}", label=m)
        color = f"C{list(markers).index(m)}"
        ax.scatter([secs], [wer], marker=markers[m], color=color, s=50)
    log = bool(pts) and min(p[2] for p in pts) > 0
    ax.set_xlabel(
        f"search time on {test_set} (s, encoder excluded"
        + ("; log scale)" if log else ")")
    )
    ax.set_ylabel(f"WER on {test_set} (%)")
    ax.set_title(
        "Digits (8 kHz): WER against search time, one thread, batch 1 (_bN: N)"
    )
    ax.grid(alpha=0.3)
    ax.margins(x=0.15, y=0.15)  # room for the search names next to the markers
    if log:
        ax.set_xscale("log")
        lo, hi = ax.get_xlim()
        ax.xaxis.set_major_locator(FixedLocator(nice_ticks(lo, hi)))
        ax.xaxis.set_major_formatter(FuncFormatter(plain_seconds))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlim(lo, hi)
    if markers:
        ax.legend(title="model")
    fig.tight_layout()
    place_labels(ax, fig, pts)
    fig.savefig(out_png + ".tmp.png", dpi=100)
    plt.close(fig)
    os.replace(out_png + ".tmp.png", out_png)
    return pts
