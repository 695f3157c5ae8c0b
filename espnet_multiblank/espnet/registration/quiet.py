"""Keep ESPnet's import quiet: no network, no notes about optional packages.

``import espnet2.tasks.asr`` imports g2p_en, whose own import calls ``nltk.download``
for its tagger and the CMU dictionary when they are not installed (only ESPnet's
``g2p_en`` phoneme tokenizer uses them, never this plug-in); without network each
call prints an error. Importing this module (the plug-in's entry points, its Python
API modules, ``register()`` and the start-up hook do it before they import ESPnet)
imports g2p_en first, with ``nltk.download`` replaced by a no-op for the duration of
that import only: ESPnet's import then finds g2p_en loaded, and ``nltk.download`` is
nltk's own again afterwards. So g2p_en does not fetch its data at import in these
processes: a ``g2p_en`` tokenizer needs it installed beforehand (``python -m
nltk.downloader cmudict averaged_perceptron_tagger_eng``).

It also sets the environment variable ``NLTK_DATA`` to ``~/nltk_data`` when it is
unset (for this process and its children). Nothing else happens when nltk or g2p_en
is not installed.

Two notes about optional things that do not matter here are kept out of a script's
output:

* ESPnet's attention module *prints* (on stdout, where a decoding script's results
  may go) ``Failed to import Flash Attention, using ESPnet default: ...`` when the
  optional ``flash_attn`` package is missing (a CUDA kernel that the transducer
  models here never use). That module is imported here once, with exactly that line
  taken off stdout (logged at DEBUG); everything else it prints passes through, and
  an import error is left for ESPnet's own import to raise.
* torch's ``FutureWarning`` that ``torch.cuda.amp.autocast(args...)`` is deprecated,
  which ESPnet's modules trigger at import and in their forward passes: ignored when
  raised from ESPnet's own modules (``espnet``, ``espnet2``), as ESPnet's to fix; the
  same warning from any other code is still shown.
"""

import logging
import os
import sys
import warnings

logger = logging.getLogger(__name__)

#: the start of the line ESPnet's attention module prints without flash_attn
FLASH_ATTENTION_LINE = "Failed to import Flash Attention"
#: that module, under ESPnet 1's layout root (``espnet`` or ``espnet2.legacy``)
ATTENTION_MODULE = "nets.pytorch_backend.transformer.attention"
#: torch's deprecation warning that ESPnet's modules trigger
AUTOCAST_DEPRECATION = r"`torch\.cuda\.amp\.autocast\(args\.\.\.\)` is deprecated"

os.environ.setdefault("NLTK_DATA", os.path.join(os.path.expanduser("~"), "nltk_data"))


def _offline_download(*args, **kwargs) -> bool:
    """nltk.download's "not downloaded" answer, without trying the network."""
    return False


def _import_g2p_en_offline() -> None:
    try:  # nltk and g2p_en are ESPnet dependencies; nothing to silence without them
        import nltk
    except ImportError:  # pragma: no cover
        return
    download = nltk.download
    nltk.download = _offline_download
    try:
        import g2p_en  # noqa: F401
    except ImportError:  # pragma: no cover
        pass
    finally:
        nltk.download = download


class LineFilter:
    """A text stream that writes to ``target`` all but the lines that start with
    ``prefix`` (those are logged at DEBUG). A line that may still become one is
    held until its end (or :meth:`finish`)."""

    def __init__(self, target, prefix: str):
        self.target = target
        self.prefix = prefix
        self._pending = ""

    def write(self, text: str) -> int:
        self._pending += text
        out = []
        while self._pending:
            head, newline, rest = self._pending.partition("\n")
            if head.startswith(self.prefix) or self.prefix.startswith(head):
                if not newline:
                    break  # wait for the end of the line
                if head.startswith(self.prefix):
                    logger.debug("dropped from stdout: %s", head)
                else:
                    out.append(head + newline)
            else:
                out.append(head + newline)
            self._pending = rest
        if out:
            self.target.write("".join(out))
        return len(text)

    def flush(self) -> None:
        self.target.flush()

    def finish(self) -> None:
        """Write what is held (a line that ended without a newline)."""
        if self._pending:
            self.target.write(self._pending)
            self._pending = ""

    def __getattr__(self, name):
        return getattr(self.target, name)


def _import_attention_quietly() -> None:
    """Import ESPnet's attention module with its flash_attn note off stdout."""
    try:
        from espnet_multiblank.espnet.compat import legacy_module

        stdout = sys.stdout
        sys.stdout = quiet = LineFilter(stdout, FLASH_ATTENTION_LINE)
        try:
            legacy_module(ATTENTION_MODULE)
        finally:
            if sys.stdout is quiet:
                sys.stdout = stdout
            quiet.finish()
    except Exception:  # pragma: no cover  (ESPnet's own import reports it)
        pass


def silence_espnet_deprecations() -> None:
    """Ignore torch's ``torch.cuda.amp.autocast`` deprecation when ESPnet's own
    modules raise it (idempotent)."""
    warnings.filterwarnings(
        "ignore",
        message=AUTOCAST_DEPRECATION,
        category=FutureWarning,
        module=r"espnet2?\.",
    )


_import_g2p_en_offline()
silence_espnet_deprecations()
_import_attention_quietly()
