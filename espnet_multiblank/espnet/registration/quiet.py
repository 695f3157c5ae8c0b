"""Keep ESPnet's import quiet on machines without network access.

``import espnet2.tasks.asr`` imports g2p_en, whose own import calls ``nltk.download``
for its tagger and the CMU dictionary when they are not installed (only ESPnet's
``g2p_en`` phoneme tokenizer uses them, never this plug-in); without network each
call prints an error. Importing this module (the plug-in's entry points and
``register()`` do it before they import ESPnet) imports g2p_en first, with
``nltk.download`` replaced by a no-op for the duration of that import only: ESPnet's
import then finds g2p_en loaded, and ``nltk.download`` is nltk's own again
afterwards. So g2p_en does not fetch its data at import in these processes: a
``g2p_en`` tokenizer needs it installed beforehand (``python -m nltk.downloader
cmudict averaged_perceptron_tagger_eng``).

It also sets the environment variable ``NLTK_DATA`` to ``~/nltk_data`` when it is
unset (for this process and its children). Nothing else happens when nltk or g2p_en
is not installed.
"""

import os

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


_import_g2p_en_offline()
