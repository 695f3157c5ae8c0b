"""The plot of the decoding section: WER against search time, every model and search."""

import os


def points(res, jobs, test_set):
    """[(model, search, search seconds, WER)] of the decodings that have both."""
    out = []
    for m, search in jobs:
        sc, st = res.get((m, search, test_set), (None, None))
        if sc and st and st.get("search_seconds") is not None:
            out.append((m, search, float(st["search_seconds"]), float(sc["wer"])))
    return out


def plot(res, jobs, test_set, out_png):
    """Write ``out_png``: WER (%) on ``test_set`` against the search time (s), one
    marker per model, the search written next to it. Returns the points drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = points(res, jobs, test_set)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    markers = {}
    for m, search, secs, wer in pts:
        if m not in markers:
            markers[m] = "osD^v<>"[len(markers) % 7]
            ax.scatter([], [], marker=markers[m], color=f"C{len(markers) - 1}", label=m)
        color = f"C{list(markers).index(m)}"
        ax.scatter([secs], [wer], marker=markers[m], color=color, s=50)
        ax.annotate(
            search, (secs, wer), textcoords="offset points", xytext=(5, 4), fontsize=8
        )
    if pts and min(p[2] for p in pts) > 0:
        ax.set_xscale("log")
    ax.set_xlabel(f"search time on {test_set} (s, encoder excluded; log scale)")
    ax.set_ylabel(f"WER on {test_set} (%)")
    ax.set_title("Digits (8 kHz): WER against search time, batch 1, one thread")
    ax.grid(alpha=0.3, which="both")
    ax.margins(x=0.15, y=0.12)  # room for the search names next to the markers
    if markers:
        ax.legend(title="model")
    fig.tight_layout()
    fig.savefig(out_png + ".tmp.png", dpi=100)
    plt.close(fig)
    os.replace(out_png + ".tmp.png", out_png)
    return pts
