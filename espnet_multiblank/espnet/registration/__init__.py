"""What makes a running ESPnet see the plug-in.

* :mod:`~espnet_multiblank.espnet.registration.class_choices`: :func:`register` adds
  ``model: multiblank_espnet``, ``frontend: grad_scaled`` and ``preencoder:
  grad_scaled`` to ``espnet2.tasks.asr``'s class choices (and installs the best-model
  guard); :data:`PLUGIN_MODELS` names the plug-in's models; :func:`is_registered`.
* :mod:`~espnet_multiblank.espnet.registration.best_model_guard`: NaN epochs are never
  chosen as ESPnet's best model.
* :mod:`~espnet_multiblank.espnet.registration.quiet`: imported before ESPnet, keeps
  its import quiet on machines without network (nltk downloads).

``espnet_multiblank.espnet.registration.register`` (also ``espnet_multiblank.register``)
is the documented way to register from Python. Nothing here imports ESPnet at import
time: the start-up hook (:mod:`espnet_multiblank.espnet._hook`) imports this package
while ``espnet2.tasks.asr`` is being set up. The classes it registers are named by
module path (``"module:Class"``) and imported only by :func:`register`.
"""

from espnet_multiblank.espnet.registration.class_choices import (
    ENTRIES,
    PLUGIN_MODELS,
    is_registered,
    register,
)

__all__ = ["ENTRIES", "PLUGIN_MODELS", "is_registered", "register"]
