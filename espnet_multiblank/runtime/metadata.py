"""The exported model directory's self-description: metadata keys and their meaning.

An exported model (``python -m espnet_multiblank.bin.export_onnx``) is a directory of
ONNX graphs and a token list::

    encoder.onnx        waveform samples -> encoder output (front end included)
    decoder.onnx        one prediction-network step (labels + state -> output + state)
    joint.onnx          encoder frames x prediction outputs -> log-probabilities
    frontend.onnx       streaming models only: samples -> normalised features
    encoder_chunk.onnx  streaming models only: one chunk of the encoder with caches
    tokens.txt          one token per line, line i = token id i

Every graph carries the same ``metadata_props`` (string keys and values; lists and
numbers as JSON): :class:`ModelInfo` writes and reads them. This module imports
neither torch nor ESPnet: the exporter and the runtime share it.
"""

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Dict, List, Tuple

from espnet_multiblank.framing import Framing
from espnet_multiblank.lattice import lattice_from_config

#: the value of the ``format`` key of every graph written by the exporter
FORMAT = "espnet_multiblank"
#: bumped when a graph's inputs, outputs or a key's meaning change
FORMAT_VERSION = 1

#: file names in an exported directory
GRAPHS = {
    "encoder": "encoder.onnx",
    "decoder": "decoder.onnx",
    "joint": "joint.onnx",
    "frontend": "frontend.onnx",
    "encoder_chunk": "encoder_chunk.onnx",
}
TOKENS = "tokens.txt"


@dataclass
class ModelInfo:
    """What a runtime needs to know about an exported model (``metadata_props``).

    Attributes:
        lattice: ``"standard"``, ``"multiblank"`` or ``"tdt"``.
        blank_id: Index of the standard blank in the token list.
        big_blank_durations: Frames covered by big blank i (index ``blank_id - 1 -
            i``); ``[]`` for standard and TDT models.
        tdt_durations: The values of the TDT's durations, in the order of the joint
            network's duration outputs; ``[]`` otherwise.
        vocab_size: V, the token list's length (every blank included).
        joint_size: Columns of ``joint.onnx``'s output: V, or V + D for a TDT (token
            log-probabilities, then duration log-probabilities).
        token_type: ESPnet's ``token_type`` (``word``, ``char``, ``bpe``, ...): how
            tokens join into text.
        sample_rate: Samples per second the front end expects.
        feature_dim: Features per frame the encoder reads (after the front end,
            normalisation and pre-encoder).
        framing: Which samples each feature frame reads
            (:class:`~espnet_multiblank.framing.Framing` as a dict: ``kind``
            ``stft`` or ``kaldi``, ``length``, ``shift``, ``center``).
        subsampling: Feature frames per encoder frame.
        receptive_field: Feature frames one encoder frame reads.
        min_samples: The fewest samples that give one encoder frame.
        encoder_type: ESPnet's ``encoder`` choice (``conformer``, ``transformer``,
            ``chunk_conformer``).
        encoder_size: D, the encoder output's width; ``joint_space``: J, the
            projected width that ``decoder.onnx`` and ``joint.onnx`` use.
        streaming: True when ``frontend.onnx`` and ``encoder_chunk.onnx`` exist.
        chunk: For streaming models: ``num_left_chunks`` (-1: all),
            ``chunk_size_range`` and ``decoding_chunk_size`` of the training
            config, ``layers``, ``heads``, ``head_dim``, ``conv_context`` (the
            caches' shapes).
        decoder_rnn_type, decoder_layers, decoder_hidden: The prediction network
            (``lstm``: states h and c; ``gru``: h).
        version: The espnet-multiblank version that exported the model.
    """

    lattice: str
    blank_id: int
    big_blank_durations: List[int]
    tdt_durations: List[int]
    vocab_size: int
    joint_size: int
    token_type: str
    sample_rate: int
    feature_dim: int
    framing: Dict[str, Any]
    subsampling: int
    receptive_field: int
    min_samples: int
    encoder_type: str
    encoder_size: int
    joint_space: int
    streaming: bool
    decoder_rnn_type: str
    decoder_layers: int
    decoder_hidden: int
    version: str
    chunk: Dict[str, Any] = field(default_factory=dict)

    def framing_object(self) -> Framing:
        """The front end's :class:`~espnet_multiblank.framing.Framing`."""
        return Framing(**self.framing)

    def lattice_object(self):
        """The :class:`~espnet_multiblank.lattice.MultiblankLattice` or
        :class:`~espnet_multiblank.lattice.TDTLattice` of the model (validated)."""
        lattice = lattice_from_config(
            self.blank_id,
            self.big_blank_durations,
            self.tdt_durations or None,
            big_blank_name="big_blank_durations",
            tdt_name="tdt_durations",
        )
        lattice.check_vocab_size(self.joint_size, "joint_size")
        return lattice

    def to_props(self) -> Dict[str, str]:
        """``metadata_props`` of every graph: every attribute as a JSON string,
        with ``format`` and ``format_version``."""
        props = {"format": FORMAT, "format_version": str(FORMAT_VERSION)}
        for key, value in asdict(self).items():
            props[key] = value if isinstance(value, str) else json.dumps(value)
        return props

    @classmethod
    def from_props(
        cls, props: Dict[str, str], source: str = "the model"
    ) -> "ModelInfo":
        """Read :meth:`to_props`'s output back.

        Raises:
            ValueError naming ``source`` and the key when a key is missing, the
            format is not this one or its version is newer.
        """
        if props.get("format") != FORMAT:
            raise ValueError(
                f"{source} is not an espnet-multiblank export: its metadata key "
                f"'format' is {props.get('format')!r}, expected {FORMAT!r} (export "
                "with python -m espnet_multiblank.bin.export_onnx)"
            )
        version = int(props.get("format_version", "0"))
        if version > FORMAT_VERSION:
            raise ValueError(
                f"{source} has format_version {version}; this runtime reads up to "
                f"{FORMAT_VERSION}: upgrade espnet-multiblank"
            )
        values = {}
        for f in fields(cls):
            if f.name not in props:
                if f.name == "chunk":
                    continue
                raise ValueError(f"{source}: metadata key {f.name!r} is missing")
            raw = props[f.name]
            values[f.name] = raw if f.type is str else json.loads(raw)
        info = cls(**values)
        info.lattice_object()  # validates blank, durations and sizes
        info.framing_object()
        return info


def lattice_kind(lattice) -> str:
    """``"standard"``, ``"multiblank"`` or ``"tdt"`` for a lattice object: its
    ``kind``, a multi-blank lattice without big blanks being standard RNN-T."""
    if lattice.kind == "multiblank" and not lattice.is_multiblank:
        return "standard"
    return lattice.kind


def lattice_keys(lattice) -> Dict[str, Any]:
    """The metadata keys that describe a lattice object (``lattice``, ``blank_id``,
    ``big_blank_durations``, ``tdt_durations``): what
    :meth:`ModelInfo.lattice_object` builds it back from."""
    tdt = lattice.kind == "tdt"
    return dict(
        lattice=lattice_kind(lattice),
        blank_id=int(lattice.blank),
        big_blank_durations=[] if tdt else list(lattice.big_blank_durations),
        tdt_durations=list(lattice.durations) if tdt else [],
    )


def read_tokens(path) -> Tuple[str, ...]:
    """The token list (one token per line)."""
    with open(path, encoding="utf-8") as f:
        return tuple(line.rstrip("\n") for line in f)
