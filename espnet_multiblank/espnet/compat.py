"""ESPnet's modules that moved between releases, found wherever the installed ESPnet
keeps them, and the ESPnet versions the plug-in supports.

ESPnet 202611 moved the ``espnet`` package's ``nets`` and ``utils`` (ESPnet 1's layers
and helpers that ``espnet2`` still builds on) to ``espnet2.legacy.nets`` and
``espnet2.legacy.utils``; ``espnet`` became a small loader package (espnet/espnet#6304).
Every name the plug-in needs from that code is taken from here, never from
``espnet.*`` or ``espnet2.legacy.*`` directly (``test_espnet_layout.py`` checks it):

    from espnet_multiblank.espnet.compat import ConvolutionModule, make_pad_mask

Each name is looked up when it is first asked for (:data:`MOVED` says in which
module, relative to the layout's root), in the layout the installed ESPnet has:
``espnet2.legacy`` (202611 and later) or ``espnet`` (202511 and earlier). Both give
the very objects ``espnet2`` itself uses, so ``isinstance`` checks against ESPnet's
modules hold. An ESPnet with neither layout gets an :class:`ImportError` that names
the supported versions (:data:`SUPPORTED_ESPNET`), not a ``ModuleNotFoundError``
from deep inside the plug-in.

Importing this module imports nothing from ESPnet.
"""

import importlib
import importlib.util
import warnings
from types import ModuleType
from typing import Optional, Tuple

#: ESPnet releases the plug-in is tested with (CI runs the suite against each)
SUPPORTED_ESPNET: Tuple[str, ...] = ("202511", "202611")

#: the roots of ESPnet 1's code, newest layout first
LAYOUTS: Tuple[str, ...] = ("espnet2.legacy", "espnet")

#: name -> module under a layout root that defines it
MOVED = {
    # conformer blocks (batch-exact encoding)
    "ConvolutionModule": "nets.pytorch_backend.conformer.convolution",
    "ConformerEncoderLayer": "nets.pytorch_backend.conformer.encoder_layer",
    "Swish": "nets.pytorch_backend.conformer.swish",
    # transformer blocks
    "MultiHeadedAttention": "nets.pytorch_backend.transformer.attention",
    "RelPositionMultiHeadedAttention": "nets.pytorch_backend.transformer.attention",
    "PositionalEncoding": "nets.pytorch_backend.transformer.embedding",
    "RelPositionalEncoding": "nets.pytorch_backend.transformer.embedding",
    "ScaledPositionalEncoding": "nets.pytorch_backend.transformer.embedding",
    "TransformerEncoderLayer": "nets.pytorch_backend.transformer.encoder_layer",
    "LayerNorm": "nets.pytorch_backend.transformer.layer_norm",
    "PositionwiseFeedForward": (
        "nets.pytorch_backend.transformer.positionwise_feed_forward"
    ),
    "MultiSequential": "nets.pytorch_backend.transformer.repeat",
    "Conv2dSubsampling": "nets.pytorch_backend.transformer.subsampling",
    "Conv2dSubsampling1": "nets.pytorch_backend.transformer.subsampling",
    "Conv2dSubsampling2": "nets.pytorch_backend.transformer.subsampling",
    "Conv2dSubsampling6": "nets.pytorch_backend.transformer.subsampling",
    "Conv2dSubsampling8": "nets.pytorch_backend.transformer.subsampling",
    "TooShortUttError": "nets.pytorch_backend.transformer.subsampling",
    "check_short_utt": "nets.pytorch_backend.transformer.subsampling",
    # frontends, helpers
    "Frontend": "nets.pytorch_backend.frontends.frontend",
    "make_pad_mask": "nets.pytorch_backend.nets_utils",
    "ErrorCalculator": "nets.e2e_asr_common",
    "get_commandline_args": "utils.cli_utils",
}

#: the attribute of the defining module, where it differs from the name here
_ATTRIBUTE = {
    "ConformerEncoderLayer": "EncoderLayer",
    "TransformerEncoderLayer": "EncoderLayer",
}

_layout: Optional[str] = None
_warned_untested = False


def espnet_version() -> Optional[str]:
    """The installed ESPnet distribution's version (``"202511"``), or None."""
    from importlib import metadata

    try:
        return metadata.version("espnet")
    except metadata.PackageNotFoundError:
        return None


def _supported() -> str:
    return ", ".join(SUPPORTED_ESPNET)


def layout() -> str:
    """The root of ESPnet 1's code in the installed ESPnet: ``"espnet2.legacy"`` or
    ``"espnet"``.

    Raises:
        ImportError: ESPnet is not installed, or keeps that code in neither place;
            the message names the installed and the supported versions.
    """
    global _layout
    if _layout is None:
        for root in LAYOUTS:
            try:
                found = importlib.util.find_spec(root + ".nets") is not None
            except ModuleNotFoundError:  # the parent package is missing
                found = False
            if found:
                _layout = root
                break
        else:
            version = espnet_version()
            installed = (
                "ESPnet is not installed"
                if version is None
                else f"the installed ESPnet {version} has neither espnet.nets nor "
                "espnet2.legacy.nets"
            )
            raise ImportError(
                f"espnet-multiblank needs ESPnet ({_supported()}; tested with each): "
                f"{installed}. Install a supported version, e.g. "
                f"pip install --no-deps espnet=={SUPPORTED_ESPNET[0]} (see the "
                "README's Installation section)."
            )
    return _layout


def check_espnet() -> str:
    """Check the installed ESPnet once per process: an :class:`ImportError` when the
    plug-in cannot find what it needs (see :func:`layout`), one warning when the
    version is not one the plug-in is tested with. Returns the layout root."""
    global _warned_untested
    root = layout()
    version = espnet_version()
    if version not in SUPPORTED_ESPNET and not _warned_untested:
        _warned_untested = True
        warnings.warn(
            f"espnet-multiblank is tested with ESPnet {_supported()}; the installed "
            f"ESPnet is {version}. It may work; if something fails, install a tested "
            "version.",
            RuntimeWarning,
            stacklevel=2,
        )
    return root


def legacy_module(name: str) -> ModuleType:
    """``<layout>.<name>``, e.g. ``legacy_module("nets.e2e_asr_common")``."""
    return importlib.import_module(f"{layout()}.{name}")


def __getattr__(name: str):
    module = MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(legacy_module(module), _ATTRIBUTE.get(name, name))
    globals()[name] = value  # looked up once
    return value


def __dir__():
    return sorted(list(globals()) + list(MOVED))
