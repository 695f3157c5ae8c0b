"""ESPnet's stock ``espnet2.bin.asr_inference`` with the plug-in's models decoded right.

ESPnet's ``Speech2Text`` builds its own ``BeamSearchTransducer``, which emits a
multi-blank model's big blanks as labels (its greedy search knows only one blank):
without help, ``python -m espnet2.bin.asr_inference`` turns the plug-in's multi-blank
models into big-blank tokens and repeated labels, silently. The start-up hook
(:mod:`espnet_multiblank.espnet._hook`) calls :func:`wrap` on that module's namespace
as soon as it has executed:

* ``Speech2Text`` becomes a subclass (same name, same arguments) that decodes the
  plug-in's models, and any transducer model whose decode config asks for a plug-in
  search type (``mb_greedy``, ``mb_beam``, ``max_sym_per_frame``), with the plug-in's
  searches, chosen by ``transducer_conf`` exactly as in the plug-in's own entry point
  (``python -m espnet_multiblank.bin.asr_inference``), so both give the same
  hypotheses; other models decode exactly as ESPnet does;
* ``inference`` refuses ``batch_size > 1`` (ESPnet's own loop decodes one utterance
  at a time) with an error naming the plug-in's entry point, which batches, and, when
  it has decoded with the plug-in's search, writes ``<output_dir>/decoding_stats.json``
  like the plug-in's entry point: ``decode_seconds`` is the wall time from the end of
  model loading to the end of ESPnet's decoding loop (data loading, features,
  encoder, search, writing), so the two entry points' throughputs compare;
  ``audio_seconds`` and ``rtf`` are not known there and are left out.
"""

import functools
import time

import torch

from espnet_multiblank.espnet.speech2text import (
    PluginSearchMixin,
    plugin_speech2text,
    write_decoding_stats,
)

ENTRY_POINT = "python -m espnet_multiblank.bin.asr_inference"


def _refuse_batches(inference):
    @functools.wraps(inference)
    def wrapped(*args, **kwargs):
        batch_size = kwargs.get("batch_size", 1)
        if isinstance(batch_size, int) and batch_size > 1:
            raise NotImplementedError(
                f"espnet2.bin.asr_inference decodes one utterance at a time "
                f"(--batch_size must be 1, got {batch_size}); for batched decoding "
                f"of transducer models use {ENTRY_POINT} (same arguments)"
            )
        PluginSearchMixin.last_stats = None
        out = inference(*args, **kwargs)
        end = time.perf_counter()
        st = PluginSearchMixin.last_stats
        output_dir = kwargs.get("output_dir", args[0] if args else None)
        # only the plug-in's search path counts utterances and search time
        if st is not None and st.search is not None and output_dir:
            device = "cuda" if int(kwargs.get("ngpu", 0) or 0) > 0 else "cpu"
            write_decoding_stats(output_dir, _stats(st, end, device))
        return out

    wrapped.espnet_inference = inference
    return wrapped


def _stats(st, end: float, device: str) -> dict:
    """decoding_stats.json of a stock run from its ``DecodingStats`` (the keys the
    plug-in's entry point writes, but for the audio duration)."""
    return {
        "num_utterances": st.num_utterances,
        "decode_seconds": end - st.created_at,
        **st.as_dict(),
        "search": st.search,
        "batch_size": 1,
        "device": device,
        "torch_num_threads": torch.get_num_threads(),
        "entry_point": "espnet2.bin.asr_inference",
    }


def wrap(namespace: dict) -> None:
    """Wrap ``Speech2Text`` and ``inference`` of an executed
    ``espnet2.bin.asr_inference`` namespace (idempotent)."""
    speech2text = namespace.get("Speech2Text")
    if speech2text is None:
        raise RuntimeError("espnet2.bin.asr_inference has no Speech2Text to wrap")
    if getattr(speech2text, "espnet_speech2text", None) is None:
        namespace["Speech2Text"] = plugin_speech2text(speech2text, "plugin")
    inference = namespace.get("inference")
    if inference is not None and not hasattr(inference, "espnet_inference"):
        namespace["inference"] = _refuse_batches(inference)
