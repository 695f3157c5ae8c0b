"""Subprocess environments that run this checkout's start-up hook."""

import os
from pathlib import Path

from espnet_multiblank.espnet import autoregister


def stock_env(root: Path) -> dict:
    """The environment of a stock ``python -m espnet2.bin.*`` subprocess that runs
    this checkout's start-up hook: a ``sitecustomize`` in ``root/site``, first on
    PYTHONPATH, replaces whatever hook the environment's ``.pth`` installed by this
    checkout's bootstrap (:func:`autoregister.pth_line`); the rest of PYTHONPATH is
    kept (e.g. for kenlm). One torch thread."""
    site = root / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(
        "import sys\n"
        "sys.meta_path[:] = [f for f in sys.meta_path\n"
        "                    if getattr(f, 'tag', None) != 'espnet_multiblank']\n"
        + autoregister.pth_line()
    )
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p
    )
    env.pop("ESPNET_MULTIBLANK_NO_AUTOREGISTER", None)
    return env
