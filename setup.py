"""espnet-multiblank: multi-blank RNN-T loss (Numba CPU/CUDA) and ESPnet plug-in."""

import importlib.util
import os

from setuptools import find_packages, setup
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


setup(
    name="espnet-multiblank",
    version="0.1.0",
    description=(
        "Multi-blank transducer loss (Numba kernels on CPU and CUDA), autograd helpers and "
        "an ESPnet ASR plug-in with multi-blank greedy and beam search"
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["espnet_multiblank", "espnet_multiblank.*"]),
    cmdclass={"build_py": BuildPyWithPth},
    install_requires=[
        "torch>=2.1",
        "numba>=0.60",
        "numpy>=1.24",
        "typeguard>=4",
        # installed by tools/setup_env.sh with --no-deps next to a pinned torch: a plain
        # resolver run would replace torch (see README "Installation")
        "espnet>=202511",
    ],
    extras_require={
        "test": ["pytest>=7", "pytest-timeout", "matplotlib"],
        "cuda": ["numba-cuda[cu13]>=0.30"],
        # n-gram LM fusion (--ngram_file): kenlm builds from its source with gcc
        "ngram": ["kenlm"],
    },
    entry_points={
        "console_scripts": [
            "multiblank-asr-train=espnet_multiblank.bin.asr_train:main",
            "multiblank-asr-inference=espnet_multiblank.bin.asr_inference:main",
        ]
    },
    license="Apache-2.0",
    classifiers=["Programming Language :: Python :: 3", "Topic :: Scientific/Engineering"],
)
