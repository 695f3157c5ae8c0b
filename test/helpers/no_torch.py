"""An environment for subprocesses in which torch, ESPnet, Numba and typeguard
cannot be imported (as if they were not installed): the torch-free runtime's tests.

A ``sitecustomize`` on the subprocess's path installs an import hook that refuses
those packages.
"""

import os
import textwrap
from pathlib import Path

BLOCKED = ("torch", "espnet", "espnet2", "numba", "typeguard", "torchaudio")

SITECUSTOMIZE = f"""
import sys

class _Refuse:
    blocked = {BLOCKED!r}

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.split(".")[0] in cls.blocked:
            raise ImportError(f"{{name}} is blocked in this test (not installed)")
        return None

sys.meta_path.insert(0, _Refuse)
"""

REPO = Path(__file__).resolve().parents[2]


def env_without_torch(tmp_path) -> dict:
    """``os.environ`` with ``PYTHONPATH`` = a ``sitecustomize`` blocker (written
    under ``tmp_path``) and the repository."""
    site = Path(tmp_path) / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(textwrap.dedent(SITECUSTOMIZE))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO)])
    return env
