"""Small helpers shared by the report sections."""

import json
import os


def fmt_time(s):
    if s is None:
        return "-"
    s = float(s)
    return f"{s / 60:.1f} min" if s >= 120 else f"{s:.1f} s"


def fmt_pct(x):
    return "-" if x is None else f"{x:.2f}%"


def load_json(path):
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return None
