"""Build step of espnet-multiblank that pyproject.toml cannot express: wheels ship the
start-up hook (a .pth at the wheel root). The metadata is in pyproject.toml."""

import importlib.util
import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "espnet_multiblank_autoregister.pth"


def _autoregister_module():
    """espnet_multiblank/espnet/autoregister.py, loaded without importing the package
    (it uses only the standard library, so building needs no torch)."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "espnet_multiblank", "espnet", "autoregister.py")
    spec = importlib.util.spec_from_file_location("_mb_autoregister", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithPth(build_py):
    """Ship the start-up hook (a .pth at the wheel root) that registers the plug-in when
    ``espnet2.tasks.asr`` is imported, so ESPnet's stock scripts see it. Editable
    installs get it from ``python -m espnet_multiblank.espnet.autoregister install``
    (tools/setup_env.sh does that)."""

    def run(self):
        super().run()
        if not getattr(self, "editable_mode", False):
            _autoregister_module().write(self.build_lib)

    def get_outputs(self, include_bytecode=1):
        out = super().get_outputs(include_bytecode)
        if not getattr(self, "editable_mode", False):
            out.append(os.path.join(self.build_lib, PTH))
        return out


setup(cmdclass={"build_py": BuildPyWithPth})
