"""Export a transducer trained with ESPnet (and the plug-in) to a directory of ONNX
graphs that :mod:`espnet_multiblank.runtime` decodes without torch.

:func:`export_model` builds the model as ESPnet's inference does, refuses what it
cannot export exactly (:class:`~espnet_multiblank.export.support.ExportError`),
traces the graphs of :mod:`espnet_multiblank.runtime.metadata` with torch's
TorchScript-based ONNX exporter, writes the metadata into each, checks each with
``onnx.checker`` and then *verifies* them: ONNX Runtime runs every graph on random
waveforms, batches of several lengths and (streaming models) chunk after chunk, and
its outputs must equal PyTorch's (the model's own ``encode``, prediction step and
joint network; the chunk-masked encoder) within a tolerance, or nothing is written.
The directory appears only when everything passed (written under a temporary name,
then renamed).
"""

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Tuple

import torch

from espnet_multiblank.export.encoder import (
    ChunkEncoderStep,
    OfflineEncoder,
    check_encoder,
)
from espnet_multiblank.export.networks import JointLogProbs, PredictionStep
from espnet_multiblank.export.sherpa import write_sherpa
from espnet_multiblank.export.support import ExportError, check_model
from espnet_multiblank.export.tracing import export_graph
from espnet_multiblank.export.verify import verify_export, verify_sherpa
from espnet_multiblank.runtime.metadata import (
    GRAPHS,
    TOKENS,
    ModelInfo,
    lattice_keys,
)

logger = logging.getLogger(__name__)


def load_model(asr_train_config: Any, asr_model_file: Any) -> Tuple[Any, Any]:
    """The model (eval mode, CPU, float32, batch-exact where it can be) and its
    training arguments, as the plug-in's inference builds them."""
    import espnet_multiblank
    import espnet_multiblank.espnet.registration.quiet  # noqa: F401

    espnet_multiblank.register()
    from espnet2.tasks.asr import ASRTask

    from espnet_multiblank.espnet.batch_exact.exact_encoding import make_batch_exact

    model, args = ASRTask.build_model_from_file(asr_train_config, asr_model_file, "cpu")
    model = model.float().eval()
    make_batch_exact(model)
    return model, args


def model_info(model: Any, args: Any) -> ModelInfo:
    """The :class:`~espnet_multiblank.runtime.metadata.ModelInfo` of a checked
    model."""
    from espnet_multiblank import __version__
    from espnet_multiblank.espnet.inference.inputs import (
        min_encoder_samples,
        model_sample_rate,
    )
    from espnet_multiblank.espnet.inference.search import (
        fix_decoder_blank,
        joint_size_of,
        lattice_from_model,
    )
    from espnet_multiblank.export.frontend import ExportFrontend

    check_model(model)
    kind = check_encoder(model)
    lattice = lattice_from_model(model)
    fix_decoder_blank(model.decoder, lattice)
    frontend = ExportFrontend(model)
    enc = model.encoder
    convs = [m for m in enc.embed.conv if isinstance(m, torch.nn.Conv2d)]
    stride, field = 1, 1
    for conv in convs:
        field += (conv.kernel_size[0] - 1) * stride
        stride *= conv.stride[0]
    fs = model_sample_rate(args)
    if fs is None:
        raise ExportError("the model's sample rate (frontend_conf.fs) is unknown")
    min_samples = _min_samples(model, frontend, field)
    if min_samples is None:
        min_samples = min_encoder_samples(model, "cpu", torch.float32)
    if min_samples is None:
        raise ExportError("the model gives no encoder frame even for 65536 samples")
    chunk: Dict[str, Any] = {}
    streaming = kind == "chunk_conformer"
    if streaming:
        layer = enc.encoders[0]
        conv = layer.conv_module
        chunk = dict(
            num_left_chunks=int(enc.num_left_chunks),
            chunk_size_range=list(enc.chunk_size_range),
            decoding_chunk_size=int(enc.decoding_chunk_size),
            layers=len(enc.encoders),
            heads=int(layer.self_attn.h),
            head_dim=int(layer.self_attn.d_k),
            conv_context=int(conv.context) if conv is not None else 0,
        )
    decoder = model.decoder
    joint = model.joint_network
    return ModelInfo(
        **lattice_keys(lattice),
        vocab_size=len(model.token_list),
        joint_size=int(joint_size_of(model, lattice)),
        token_type=str(getattr(args, "token_type", "char")),
        sample_rate=int(fs),
        feature_dim=_feature_dim(model),
        framing=frontend.framing.as_dict(),
        subsampling=stride,
        receptive_field=field,
        min_samples=int(min_samples),
        encoder_type=kind,
        encoder_size=int(enc.output_size()),
        joint_space=int(joint.lin_enc.out_features),
        streaming=streaming,
        decoder_rnn_type=str(decoder.dtype),
        decoder_layers=int(decoder.dlayers),
        decoder_hidden=int(decoder.dunits),
        version=__version__,
        chunk=chunk,
    )


def _min_samples(model: Any, frontend: Any, field: int):
    """The fewest samples that give one encoder frame: the front end must give
    ``field`` (the subsampling's receptive field) frames; checked by encoding that
    many samples and one fewer (None when the check fails: the caller searches)."""
    framing = frontend.framing
    n = 1
    while framing.total_frames(n) < field:
        n += 1

    def frames(samples: int) -> int:
        try:
            with torch.no_grad():
                _, lens = model.encode(torch.zeros(1, samples), torch.tensor([samples]))
        except Exception:  # ESPnet refuses inputs too short for its subsampling
            return 0
        return int(lens[0])

    if frames(n) >= 1 and (n == 1 or frames(n - 1) < 1):
        return n
    return None


def _feature_dim(model: Any) -> int:
    pre = model.preencoder
    while type(pre).__name__ == "GradScaledPreEncoder":
        pre = pre.preencoder
    if pre is not None:
        return int(pre.output_size())
    frontend = model.frontend
    while type(frontend).__name__ == "GradScaledFrontend":
        frontend = frontend.frontend
    return int(frontend.output_size())


#: ``export_model``'s formats: this package's runtime, or sherpa-onnx's NeMo layout
FORMATS = ("native", "sherpa_onnx")


def export_model(
    asr_train_config: Any,
    asr_model_file: Any,
    output_dir: Any,
    *,
    verify: bool = True,
    overwrite: bool = False,
    format: str = "native",
) -> ModelInfo:
    """Export a model to ``output_dir`` (module docstring).

    Args:
        asr_train_config: The training config (``config.yaml``).
        asr_model_file: The model's weights (``*.pth``). Required: an exported
            random model is never what anyone wants.
        output_dir: The directory to create.
        verify: Compare ONNX Runtime's outputs with PyTorch's before writing
            (recommended; without onnxruntime installed, an :class:`ExportError`
            asks for it).
        overwrite: Replace an existing ``output_dir``.
        format: ``"native"`` (the directory :mod:`espnet_multiblank.runtime`
            decodes, every lattice) or ``"sherpa_onnx"`` (sherpa-onnx's NeMo
            transducer layout: standard and TDT models trained on ``frontend:
            kaldi_fbank``; :mod:`espnet_multiblank.export.sherpa`).

    Returns:
        The exported model's :class:`ModelInfo`.

    Raises:
        ExportError: The model cannot be exported exactly (message: what, why).
        FileExistsError: ``output_dir`` exists and ``overwrite`` is false.
    """
    if format not in FORMATS:
        raise ExportError(f"format must be one of {list(FORMATS)}, got {format!r}")
    if asr_model_file is None:
        raise ExportError("asr_model_file is required (the trained weights)")
    output_dir = Path(output_dir)
    if output_dir.exists() and not overwrite:
        raise FileExistsError(
            f"output_dir {output_dir} exists (overwrite=True / --overwrite true "
            "replaces it)"
        )
    model, args = load_model(asr_train_config, asr_model_file)
    info = model_info(model, args)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=output_dir.name + ".", dir=output_dir.parent))
    try:
        if format == "sherpa_onnx":
            write_sherpa(model, info, tmp)
        else:
            write_graphs(model, info, tmp)
            (tmp / TOKENS).write_text(
                "".join(f"{t}\n" for t in model.token_list), encoding="utf-8"
            )
        if verify:
            check = verify_sherpa if format == "sherpa_onnx" else verify_export
            check(model, info, tmp)
        if output_dir.exists():
            shutil.rmtree(output_dir)
        os.replace(tmp, output_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return info


def write_graphs(model: Any, info: ModelInfo, out: Path) -> None:
    """Trace and write every graph of the model into ``out`` (with metadata)."""
    props = info.to_props()
    kind = info.encoder_type
    encoder = OfflineEncoder(model, kind)
    shift = info.framing["shift"]
    speech = torch.randn(2, info.min_samples + 3 * shift * 8)
    lengths = torch.tensor([speech.size(1), speech.size(1) - 5 * shift])
    inputs: Tuple = (speech, lengths)
    names = ["speech", "speech_lengths"]
    axes = {"speech": {0: "batch", 1: "samples"}, "speech_lengths": {0: "batch"}}
    if kind == "chunk_conformer":
        inputs = inputs + (torch.tensor(0, dtype=torch.int64),)
        names.append("chunk_size")
    export_graph(
        encoder,
        inputs,
        out / GRAPHS["encoder"],
        names,
        ["encoder_out", "encoder_proj", "encoder_lengths"],
        dict(
            axes,
            encoder_out={0: "batch", 1: "frames"},
            encoder_proj={0: "batch", 1: "frames"},
            encoder_lengths={0: "batch"},
        ),
        props,
    )
    step = PredictionStep(model)
    H, Ly = info.decoder_hidden, info.decoder_layers
    labels = torch.tensor([info.blank_id, 0, 1], dtype=torch.int64)
    states = [torch.zeros(Ly, 3, H)]
    state_names = ["state_h"]
    if step.lstm:
        states.append(torch.zeros(Ly, 3, H))
        state_names.append("state_c")
    out_states = [f"new_{n}" for n in state_names]
    export_graph(
        step,
        (labels, *states),
        out / GRAPHS["decoder"],
        ["labels"] + state_names,
        ["decoder_proj"] + out_states,
        {
            "labels": {0: "rows"},
            "decoder_proj": {0: "rows"},
            **{n: {1: "rows"} for n in state_names + out_states},
        },
        props,
    )
    joint = JointLogProbs(model, len(info.tdt_durations))
    J = info.joint_space
    export_graph(
        joint,
        (torch.randn(3, J), torch.randn(3, J)),
        out / GRAPHS["joint"],
        ["encoder_proj", "decoder_proj"],
        ["log_probs"],
        {
            "encoder_proj": {0: "enc_rows"},
            "decoder_proj": {0: "dec_rows"},
            "log_probs": {0: "rows"},
        },
        props,
    )
    if info.streaming:
        _write_streaming_graphs(model, info, out, props)


def _write_streaming_graphs(model, info: ModelInfo, out: Path, props) -> None:
    from espnet_multiblank.export.frontend import ExportFrontend

    frontend = ExportFrontend(model, segment=True)
    n = info.framing["length"] + 4 * info.framing["shift"]
    export_graph(
        frontend,
        (torch.randn(1, n), torch.tensor([n])),
        out / GRAPHS["frontend"],
        ["samples", "sample_lengths"],
        ["feats", "feat_lengths"],
        {
            "samples": {0: "batch", 1: "samples"},
            "sample_lengths": {0: "batch"},
            "feats": {0: "batch", 1: "frames"},
            "feat_lengths": {0: "batch"},
        },
        props,
    )
    c = info.chunk
    N, H, dk, K1 = c["layers"], c["heads"], c["head_dim"], c["conv_context"]
    B, C, L = 2, 3, 5
    F = info.subsampling * (C - 1) + info.receptive_field
    D = info.encoder_size
    args = (
        torch.randn(B, F, info.feature_dim),
        torch.randn(N, B, H, L, dk),
        torch.randn(N, B, H, L, dk),
        torch.randn(N, B, D, max(K1, 1)),
        torch.ones(B, L, dtype=torch.bool),
        torch.tensor([C, C - 1]),
    )
    export_graph(
        ChunkEncoderStep(model),
        args,
        out / GRAPHS["encoder_chunk"],
        [
            "feats",
            "key_cache",
            "value_cache",
            "conv_cache",
            "cache_mask",
            "chunk_frames",
        ],
        ["encoder_out", "encoder_proj", "new_keys", "new_values", "new_conv_cache"],
        {
            "feats": {0: "batch", 1: "feat_frames"},
            "key_cache": {1: "batch", 3: "cached"},
            "value_cache": {1: "batch", 3: "cached"},
            "conv_cache": {1: "batch"},
            "cache_mask": {0: "batch", 1: "cached"},
            "chunk_frames": {0: "batch"},
            "encoder_out": {0: "batch", 1: "frames"},
            "encoder_proj": {0: "batch", 1: "frames"},
            "new_keys": {1: "batch", 3: "frames"},
            "new_values": {1: "batch", 3: "frames"},
            "new_conv_cache": {1: "batch"},
        },
        props,
    )


def describe(info: ModelInfo) -> str:
    """One line on an exported model, for logs."""
    return json.dumps(
        {
            "lattice": info.lattice,
            "blank_id": info.blank_id,
            "big_blank_durations": info.big_blank_durations,
            "tdt_durations": info.tdt_durations,
            "encoder": info.encoder_type,
            "streaming": info.streaming,
        }
    )


__all__: List[str] = ["export_model", "load_model", "model_info", "write_graphs"]
