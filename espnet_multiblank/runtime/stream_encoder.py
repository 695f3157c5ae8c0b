"""One stream's waveform pieces in, projected encoder frames out (``chunk_conformer``
exports; NumPy + ONNX Runtime).

As the plug-in's streaming encoder (``espnet_multiblank.espnet.inference.
stream_encoder``): feature frame j reads the samples the front end's
:class:`~espnet_multiblank.framing.Framing` says (the centred STFT: ``j hop -
n_fft / 2 .. j hop + n_fft / 2 - 1``; samples before the first and after the last
are reflected, the latter once the stream has ended) and is computed by
``frontend.onnx`` as soon as they have arrived; a chunk of C encoder frames runs
``encoder_chunk.onnx`` once the feature frames it reads have arrived (the
subsampling's look-ahead), and the last, shorter chunk when the stream ends. The
caches (keys and values of the earlier frames per block, the convolution's left
context) stay in NumPy between chunks. Every computation depends only on the
waveform and the chunk size, not on how the waveform was cut into pieces.

:meth:`StreamEncoder.run` encodes the ready chunks of many streams in one call per
round: streams with fewer cached frames are padded at the front and masked (the
relative positions do not change), shorter last chunks are padded at the end.

Notation: S subsampling, RF the subsampling's receptive field in feature frames, C
chunk, N blocks, H heads, L cached frames, J joint space.
"""

from typing import List, Optional

import numpy as np

from espnet_multiblank.runtime.model import ExportedModel


class StreamEncoder:
    """The encoder of one stream (module docstring).

    Args:
        model: A streaming export (``info.streaming``).
        chunk: C, encoder frames per chunk (>= 1).
    """

    def __init__(self, model: ExportedModel, chunk: int):
        info = model.info
        if not info.streaming:
            raise ValueError(
                f"streaming needs a chunk_conformer model (this export's encoder is "
                f"{info.encoder_type}): decode it offline"
            )
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise ValueError(
                f"chunk must be an int >= 1 (encoder frames), got {chunk!r}"
            )
        self.model = model
        self.chunk = chunk
        self.framing = model.framing
        self.S, self.RF = info.subsampling, info.receptive_field
        c = info.chunk
        N, H, dk = c["layers"], c["heads"], c["head_dim"]
        self.keep = -1 if c["num_left_chunks"] < 0 else c["num_left_chunks"] * chunk
        self.keys = np.zeros((N, H, 0, dk), np.float32)
        self.values = np.zeros((N, H, 0, dk), np.float32)
        self.conv = np.zeros((N, info.encoder_size, c["conv_context"]), np.float32)
        self._samples = np.zeros(0, np.float32)
        self._base = 0  # index of _samples[0] in the stream
        self.received = 0
        self.final = False
        self.frames = 0  # encoder frames computed
        self._done = 0  # feature frames computed
        self._tail: Optional[np.ndarray] = None  # features the next chunk re-reads

    # ------------------------------------------------------------ samples
    def accept(self, samples: np.ndarray, final: bool = False) -> None:
        """Append (n,) float32 samples (checked by the caller); ``final``: the
        stream ends after them."""
        if self.final:
            raise ValueError("the stream has ended: no samples after input_finished()")
        self._samples = np.concatenate([self._samples, samples.astype(np.float32)])
        self.received += samples.size
        self.final = bool(final)

    def finish(self) -> None:
        self.final = True

    def total_feature_frames(self) -> int:
        return self.framing.total_frames(self.received)

    def total_frames(self) -> int:
        """Encoder frames of the whole stream (once it has ended)."""
        F = self.total_feature_frames()
        return (F - self.RF) // self.S + 1 if F >= self.RF else 0

    def available(self) -> int:
        """Feature frames whose samples have all arrived."""
        if self.final:
            return self.total_feature_frames()
        return self.framing.complete_frames(self.received)

    def _segment(self, first: int, stop: int) -> np.ndarray:
        """The samples feature frames ``first .. stop - 1`` read, reflected at the
        ends of the waveform as the front end reflects them."""
        lo, hi = self.framing.segment(first, stop)
        pos = self.framing.reflect(np.arange(lo, hi), self.received)
        return self._samples[pos - self._base]

    def _features(self, first: int, stop: int) -> np.ndarray:
        feats = self.model.features(self._segment(first, stop))
        # the next frame reads from its first sample on; the end reflection of the
        # last frame reaches up to a frame's length further back
        keep = self.framing.segment(stop, stop + 1)[0] - self.framing.length
        drop = max(keep, 0) - self._base
        if drop > 4096:
            self._samples = self._samples[drop:]
            self._base += drop
        return feats

    # ------------------------------------------------------------- chunks
    def ready_chunk(self) -> Optional[np.ndarray]:
        """The feature frames of the next chunk, (F, M), when they have all arrived
        (and computes them), else None."""
        c = self.chunk
        if self.final:
            c = min(c, self.total_frames() - self.frames)
            if c <= 0:
                return None
        need = self.S * (self.frames + c - 1) + self.RF
        if need > self.available():
            return None
        new = self._features(self._done, need)
        feats = new if self._tail is None else np.concatenate([self._tail, new])
        self._done = need
        self._tail = feats[self.S * c :]
        return feats

    @property
    def ended(self) -> bool:
        """Every frame of an ended stream has been encoded."""
        return self.final and self.frames >= self.total_frames()

    @staticmethod
    def run(streams: List["StreamEncoder"]) -> List[np.ndarray]:
        """Encode every ready chunk of ``streams`` (batched per round).

        Returns:
            Per stream, the (n, J) float32 projected frames computed now (n >= 0).
        """
        out = [[] for _ in streams]
        while True:
            ready = []
            for i, s in enumerate(streams):
                feats = s.ready_chunk()
                if feats is not None:
                    ready.append((i, feats))
            if not ready:
                break
            StreamEncoder._run_chunks(
                [streams[i] for i, _ in ready],
                [f for _, f in ready],
                [out[i] for i, _ in ready],
            )
        J = streams[0].model.info.joint_space if streams else 0
        return [np.concatenate(o) if o else np.zeros((0, J), np.float32) for o in out]

    @staticmethod
    def _run_chunks(streams, feats, outs) -> None:
        model = streams[0].model
        B = len(streams)
        S, RF = streams[0].S, streams[0].RF
        frames = np.array([(f.shape[0] - RF) // S + 1 for f in feats], np.int64)
        F = max(f.shape[0] for f in feats)
        M = feats[0].shape[1]
        x = np.zeros((B, F, M), np.float32)
        for b, f in enumerate(feats):
            x[b, : f.shape[0]] = f
        L = max(s.keys.shape[2] for s in streams)
        N, H, _, dk = streams[0].keys.shape
        keys = np.zeros((N, B, H, L, dk), np.float32)
        values = np.zeros((N, B, H, L, dk), np.float32)
        mask = np.zeros((B, L), bool)
        for b, s in enumerate(streams):
            n = s.keys.shape[2]
            if n:
                keys[:, b, :, L - n :] = s.keys
                values[:, b, :, L - n :] = s.values
                mask[b, L - n :] = True
        convs = np.stack([s.conv for s in streams], 1)
        proj, k, v, c = model.encode_chunk(x, keys, values, convs, mask, frames)
        for b, s in enumerate(streams):
            n = int(frames[b])
            outs[b].append(proj[b, :n])
            s.keys = np.concatenate([s.keys, k[:, b, :, :n]], 2)
            s.values = np.concatenate([s.values, v[:, b, :, :n]], 2)
            if s.keep >= 0 and s.keys.shape[2] > s.keep:
                s.keys = s.keys[:, :, -s.keep :] if s.keep else s.keys[:, :, :0]
                s.values = s.values[:, :, -s.keep :] if s.keep else s.values[:, :, :0]
            s.conv = c[:, b]
            s.frames += n
