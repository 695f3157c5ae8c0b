"""espnet-multiblank: multi-blank RNN-T loss (Numba CPU/CUDA) and ESPnet plug-in."""

from setuptools import find_packages, setup

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
    include_package_data=True,
    package_data={"espnet_multiblank": ["conf/*.yaml"]},
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
