"""What the exporter can export, and the message when it cannot.

A model the exporter cannot handle exactly is refused with :class:`ExportError`
naming the part and what is supported, never exported into a wrong graph.
"""

from typing import Any


class ExportError(ValueError):
    """The model (or a part of it) cannot be exported; the message says what and
    why."""


def unwrap_frontend(model: Any) -> Any:
    """The model's ESPnet ``DefaultFrontend`` (inside ``grad_scaled``), checked:
    an STFT, no WPE / beamformer, a plain log-mel."""
    frontend = model.frontend
    while type(frontend).__name__ == "GradScaledFrontend":
        frontend = frontend.frontend
    if type(frontend).__name__ == "KaldiFbankFrontend":
        return frontend
    if frontend is None:
        raise ExportError(
            "a model without a front end (precomputed features) cannot be exported: "
            "the exported encoder starts from waveform samples"
        )
    if type(frontend).__name__ != "DefaultFrontend" or frontend.stft is None:
        raise ExportError(
            f"frontend {type(frontend).__name__} cannot be exported (supported: "
            "default, i.e. STFT + log-mel, and kaldi_fbank, also inside grad_scaled)"
        )
    enhancement = frontend.frontend
    if enhancement is not None and (
        getattr(enhancement, "use_wpe", True)
        or getattr(enhancement, "use_beamformer", True)
    ):
        raise ExportError("a front end with WPE / beamforming cannot be exported")
    if not frontend.stft.onesided:
        raise ExportError("a two-sided STFT (onesided: false) cannot be exported")
    if type(frontend.logmel).__name__ != "LogMel":
        raise ExportError(f"{type(frontend.logmel).__name__} cannot be exported")
    return frontend


def check_model(model: Any) -> None:
    """Refuse, with :class:`ExportError`, what the graphs cannot compute exactly:
    another front end, normalisation or pre-encoder, a post-encoder, a model
    without a transducer decoder, a prediction network or joint network other than
    ESPnet's transducer ones."""
    unwrap_frontend(model)
    norm = type(model.normalize).__name__ if model.normalize is not None else None
    if norm not in (None, "GlobalMVN", "UtteranceMVN", "ExactUtteranceMVN"):
        raise ExportError(
            f"normalize {norm} cannot be exported (supported: global_mvn, "
            "utterance_mvn, none)"
        )
    if getattr(model, "postencoder", None) is not None:
        raise ExportError("a post-encoder cannot be exported")
    decoder = getattr(model, "decoder", None)
    joint = getattr(model, "joint_network", None)
    if joint is None or type(decoder).__name__ != "TransducerDecoder":
        raise ExportError(
            "only transducer models (decoder: transducer with a joint network) can "
            f"be exported; this model's decoder is {type(decoder).__name__}"
        )
    if decoder.dtype not in ("lstm", "gru"):
        raise ExportError(f"prediction network rnn_type {decoder.dtype} is unsupported")
    for name in ("lin_enc", "lin_dec", "lin_out", "joint_activation"):
        if not hasattr(joint, name):
            raise ExportError(
                f"joint network {type(joint).__name__} has no {name}: only ESPnet's "
                "JointNetwork can be exported"
            )
