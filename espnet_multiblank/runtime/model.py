"""An exported model directory loaded into ONNX Runtime sessions (no torch).

:class:`ExportedModel` reads the metadata (:mod:`.metadata`), builds the lattice from
:mod:`espnet_multiblank.lattice` and runs the graphs on NumPy arrays:
:meth:`~ExportedModel.encode` (waveforms -> projected encoder frames),
:meth:`~ExportedModel.step` (one prediction-network step for N rows) and
:meth:`~ExportedModel.log_probs` (the joint network). The searches call nothing else.

Shapes: B utterances, L samples, T encoder frames, J joint space, N rows, V' joint
outputs (V tokens, plus D durations for a TDT).
"""

from pathlib import Path
from typing import List, Sequence, Tuple

import numpy as np

from espnet_multiblank.runtime.extras import needs_extra
from espnet_multiblank.runtime.metadata import GRAPHS, TOKENS, ModelInfo, read_tokens

#: a prediction-network state: the arrays of ``decoder.onnx``'s state inputs, in order
State = Tuple[np.ndarray, ...]


def _import_onnxruntime():
    with needs_extra("espnet_multiblank.runtime needs onnxruntime", "runtime"):
        import onnxruntime
    return onnxruntime


class ExportedModel:
    """The graphs of an exported directory, ready to run.

    Args:
        model_dir: The directory ``export_onnx`` wrote.
        num_threads: ONNX Runtime's intra-op threads per graph (1: one core).

    Attributes:
        info: The :class:`~.metadata.ModelInfo`.
        lattice: The model's lattice (``MultiblankLattice`` or ``TDTLattice``).
        tokens: The token list.
        frame_shift: Seconds per encoder frame.
    """

    def __init__(self, model_dir, num_threads: int = 1):
        model_dir = Path(model_dir)
        if not (model_dir / GRAPHS["encoder"]).is_file():
            raise FileNotFoundError(
                f"model_dir {model_dir} has no {GRAPHS['encoder']}: not an exported "
                "model (python -m espnet_multiblank.bin.export_onnx writes one)"
            )
        if isinstance(num_threads, bool) or not isinstance(num_threads, int):
            raise TypeError(f"num_threads must be an int >= 1, got {num_threads!r}")
        if num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads}")
        ort = _import_onnxruntime()
        self.model_dir = model_dir
        options = ort.SessionOptions()
        options.intra_op_num_threads = num_threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL

        def session(name: str):
            return ort.InferenceSession(
                str(model_dir / GRAPHS[name]),
                options,
                providers=["CPUExecutionProvider"],
            )

        self._encoder = session("encoder")
        props = dict(self._encoder.get_modelmeta().custom_metadata_map)
        self.info = ModelInfo.from_props(props, str(model_dir / GRAPHS["encoder"]))
        self.lattice = self.info.lattice_object()
        self._decoder = session("decoder")
        self._joint = session("joint")
        self._frontend = self._chunk = None
        if self.info.streaming:
            self._frontend = session("frontend")
            self._chunk = session("encoder_chunk")
        self.tokens = read_tokens(model_dir / TOKENS)
        if len(self.tokens) != self.info.vocab_size:
            raise ValueError(
                f"{model_dir / TOKENS} has {len(self.tokens)} tokens, the model "
                f"{self.info.vocab_size}"
            )
        self._state_names = [i.name for i in self._decoder.get_inputs()[1:]]
        info = self.info
        self.framing = info.framing_object()
        self.frame_shift = info.subsampling * self.framing.shift / info.sample_rate
        self.num_tokens = info.joint_size - len(info.tdt_durations)

    # ------------------------------------------------------------ encoder
    def encode(
        self,
        speech: np.ndarray,
        lengths: np.ndarray,
        chunk_size: int = 0,
    ) -> Tuple[np.ndarray, np.ndarray]:
        """Encode a padded batch of waveforms, each as if alone.

        Args:
            speech: (B, L) float32 samples (padding after each is ignored).
            lengths: (B,) int64 valid samples (each >= ``info.min_samples``).
            chunk_size: Encoder frames per attention chunk of a ``chunk_conformer``
                (0: full context; the frames a stream of that chunk size gives).

        Returns:
            (B, T, J) float32 projected encoder frames, (B,) int64 frames.
        """
        feed = {
            "speech": np.ascontiguousarray(speech, np.float32),
            "speech_lengths": np.asarray(lengths, np.int64),
        }
        if self.info.encoder_type == "chunk_conformer":
            feed["chunk_size"] = np.array(int(chunk_size), np.int64)
        elif chunk_size:
            raise ValueError(
                f"chunk_size = {chunk_size}: only chunk_conformer models decode at "
                f"a chunk size (this model's encoder is {self.info.encoder_type})"
            )
        _, proj, lens = self._encoder.run(
            ["encoder_out", "encoder_proj", "encoder_lengths"], feed
        )
        return proj, lens

    def features(self, samples: np.ndarray) -> np.ndarray:
        """(F, M) normalised features of a segment of samples whose first frame
        starts at its first sample (no centring; streaming models only)."""
        feats, _ = self._frontend.run(
            None,
            {
                "samples": np.ascontiguousarray(samples, np.float32)[None],
                "sample_lengths": np.array([samples.size], np.int64),
            },
        )
        return feats[0]

    def encode_chunk(self, feats, keys, values, convs, cache_mask, chunk_frames):
        """One chunk of B streams (``encoder_chunk.onnx``; see
        :class:`~espnet_multiblank.export.encoder.ChunkEncoderStep` for the shapes).

        Returns:
            (B, C, J) projected frames, (N, B, H, C, d_k) new keys and values,
            (N, B, D, K - 1) convolution caches.
        """
        _, proj, k, v, c = self._chunk.run(
            None,
            {
                "feats": feats,
                "key_cache": keys,
                "value_cache": values,
                "conv_cache": convs,
                "cache_mask": cache_mask,
                "chunk_frames": chunk_frames,
            },
        )
        return proj, k, v, c

    # ----------------------------------------------- prediction and joint
    def initial_state(self, rows: int) -> State:
        """Zero states of the prediction network for ``rows`` rows."""
        shape = (self.info.decoder_layers, rows, self.info.decoder_hidden)
        return tuple(np.zeros(shape, np.float32) for _ in self._state_names)

    def step(self, labels: np.ndarray, state: State) -> Tuple[np.ndarray, State]:
        """The prediction network after ``labels`` (N,) int64 from ``state``:
        (N, J) projected outputs and the new state."""
        feed = {"labels": np.asarray(labels, np.int64)}
        feed.update(zip(self._state_names, state))
        out = self._decoder.run(None, feed)
        return out[0], tuple(out[1:])

    def log_probs(self, enc_proj: np.ndarray, dec_proj: np.ndarray) -> np.ndarray:
        """(N, V') log-probabilities of (N or 1, J) encoder and (N or 1, J)
        prediction rows (one side may have one row)."""
        return self._joint.run(
            None, {"encoder_proj": enc_proj, "decoder_proj": dec_proj}
        )[0]

    # -------------------------------------------------------------- text
    def text(self, labels: Sequence[int]) -> str:
        """The text of a label sequence (ESPnet's token types: ``word`` joined by
        spaces, ``char`` with ``<space>``, ``bpe``/SentencePiece with ``▁``)."""
        tokens = [self.tokens[k] for k in labels]
        kind = self.info.token_type
        if kind == "char":
            return "".join(" " if t == "<space>" else t for t in tokens)
        if kind == "bpe":
            return "".join(tokens).replace("\u2581", " ").strip()
        return " ".join(tokens)

    def select_state(self, state: State, rows) -> State:
        return tuple(s[:, rows] for s in state)

    @staticmethod
    def concat_states(states: List[State]) -> State:
        return tuple(np.concatenate(parts, 1) for parts in zip(*states))


def load(model_dir, num_threads: int = 1) -> ExportedModel:
    """:class:`ExportedModel` of ``model_dir``."""
    return ExportedModel(model_dir, num_threads)


__all__ = ["ExportedModel", "State", "load"]
