"""Label-synchronous beam search for every lattice (NumPy + ONNX Runtime).

The plug-in's ``beam_sync: label`` rule (``mb_beam_label.yaml``,
``tdt_beam_label.yaml``; the rule its recipe recommends): a hypothesis is a label
sequence, scored with the sum over all of its alignments, exactly as the losses
score it, so big blanks and TDT durations never split a sequence's probability
between hypotheses. One step adds one label to every hypothesis:

    beam_b = the K best prefixes of utterance b (at first the empty one)
    for every prefix y, on every frame t < T_b (one joint-network call for all):
        alpha_y(t) = LSE( entry_y(t), alpha_y(t - n) + blank arc (t - n, n) )
        end_y      = LSE over blank arcs landing on T_b of alpha_y(t) + arc
        y joins b's ended hypotheses with score end_y
        score(y + l) = log sum_t' entry_{y+l}(t'), entry_{y+l}(t') = LSE over
            label moves (n frames, t' = t + n < T_b) of alpha_y(t) + arc(l, n)
    beam_b = the K best y + l that can beat b's nbest-th ended hypothesis;
    b finishes when none can (or after max_sym_per_frame x T_b labels)

``score(y + l)`` bounds every hypothesis that starts with y + l, so the search
stops as soon as no prefix can win. The arcs come from the lattice
(``blank_arcs``, ``label_moves``). The timing of a returned hypothesis (the frame
each label is emitted at) is that of its most probable alignment
(:func:`best_alignment`).

Shapes: B utterances, K beam, A live prefixes, T frames, V' joint outputs (V tokens,
D durations), NB blank arcs, NM label moves, L labels (the non-blank tokens).
"""

from dataclasses import dataclass, field
from typing import List, Tuple

import numpy as np

from espnet_multiblank.runtime.model import ExportedModel, State

NEG = -np.inf


def _lse(stack: np.ndarray, axis: int = 0) -> np.ndarray:
    """log sum exp along ``axis`` (max-shifted; -inf when every term is)."""
    top = np.max(stack, axis=axis)
    safe = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.sum(np.exp(stack - np.expand_dims(safe, axis)), axis=axis)
        return np.where(np.isfinite(top), np.log(s) + safe, NEG)


@dataclass
class BeamHypothesis:
    """A complete hypothesis: labels, score (log P(y | x) over all alignments) and
    the timing, frames skipped and big-blank count of its best alignment."""

    labels: List[int]
    score: float
    timing: List[Tuple[int, int, float]] = field(default_factory=list)
    frames_skipped: int = 0
    big_blank_emissions: int = 0


class LatticeColumns:
    """The arcs of a lattice as columns of ``joint.onnx``'s log-probabilities."""

    def __init__(self, lattice, joint_size: int):
        D = lattice.num_duration_outputs
        self.V = joint_size - D
        self.tdt = D > 0
        arcs, moves = lattice.blank_arcs, lattice.label_moves
        V = self.V
        self.blank_tok = np.array([a.token for a in arcs])
        self.blank_dur = np.array([V + (a.slot or 0) for a in arcs])
        self.blank_frames = np.array([a.frames for a in arcs])
        self.move_dur = np.array([V + (m.slot or 0) for m in moves])
        self.move_frames = np.array([m.frames for m in moves])
        blanks = set(lattice.blank_ids)
        self.labels = np.array([k for k in range(V) if k not in blanks])

    def blank_weights(self, lp: np.ndarray) -> np.ndarray:
        """(..., NB) log-probability of each blank arc."""
        w = lp[..., self.blank_tok]
        return w + lp[..., self.blank_dur] if self.tdt else w

    def move_weights(self, lp: np.ndarray) -> np.ndarray:
        """(..., NM) log-probability of each label move's duration (0 without)."""
        if self.tdt:
            return lp[..., self.move_dur]
        return np.zeros(lp.shape[:-1] + (1,), lp.dtype)


def level_forward(entry, blank_w, blank_frames, lens):
    """Forward sums of A prefixes (module docstring).

    Args:
        entry: (A, T) float64.
        blank_w: (A, T, NB) float32 blank-arc log-probabilities.
        blank_frames: (NB,) frames of each blank arc.
        lens: (A,) T_a.

    Returns:
        alpha (A, T) float64 (-inf from T_a on), end (A,) float64.
    """
    A, T = entry.shape
    alpha = np.full((A, T), NEG)
    bw = blank_w.astype(np.float64)
    for t in range(T):
        terms = [entry[:, t]]
        for j, n in enumerate(blank_frames):
            if t >= n:
                terms.append(alpha[:, t - n] + bw[:, t - n, j])
        col = _lse(np.stack(terms)) if len(terms) > 1 else entry[:, t]
        alpha[:, t] = np.where(t < lens, col, NEG)
    rows = np.arange(A)
    terms = []
    for j, n in enumerate(blank_frames):
        s = lens - n
        ok = s >= 0
        sc = np.clip(s, 0, T - 1)
        terms.append(np.where(ok, alpha[rows, sc] + bw[rows, sc, j], NEG))
    return alpha, _lse(np.stack(terms))


def child_entry(alpha_p, tok_l, move_w, move_frames, length):
    """(T,) entries of a prefix y + l from y's ``alpha_p`` (T,), the label's
    token log-probabilities ``tok_l`` (T,) and the moves' (T, NM) weights."""
    T = alpha_p.shape[0]
    terms = []
    for i, n in enumerate(move_frames):
        src = alpha_p + tok_l + move_w[:, i]  # arcs starting at t, landing t + n
        shifted = np.full(T, NEG)
        if n < T:
            shifted[n:] = src[: T - n]
        terms.append(shifted)
    out = _lse(np.stack(terms))
    out[length:] = NEG
    return out


def _same(a: float, b: float) -> bool:
    """Whether a recomputed path score is the node's best (the same float sums in
    another order may differ in the last bits)."""
    return abs(a - b) <= 1e-9 * max(1.0, abs(b))


def _viterbi(bw, blank_frames, tok, mw, move_frames, T: int, U: int) -> np.ndarray:
    """(T + 1, U + 1) best-path scores of the lattice of one label sequence.

    ``best[t, u]``: the most probable path to frame t with u labels emitted; blank
    arcs land on t <= T (on T only after the last label), label arcs before T. Per
    frame, the arcs that move (n >= 1) come from earlier frames (one vector over u);
    a label that keeps its frame chains along u, solved with a running maximum:
    ``best[t, u] = C[u] + max_{k <= u} (base[k] - C[k])``, C the cumulative sums of
    those labels' weights.
    """
    best = np.full((T + 1, U + 1), NEG)
    zero = [i for i, n in enumerate(move_frames) if n == 0]
    for t in range(T + 1):
        base = np.full(U + 1, NEG)
        if t == 0:
            base[0] = 0.0
        for j, n in enumerate(blank_frames):
            s = t - n
            if s >= 0:
                cand = best[s] + bw[s, :, j]
                if t == T:
                    cand[:U] = NEG  # only after the last label
                base = np.maximum(base, cand)
        if t < T and U:
            for i, n in enumerate(move_frames):
                s = t - n
                if n >= 1 and s >= 0:
                    cand = best[s, :U] + tok[s, :U] + mw[s, :U, i]
                    base[1:] = np.maximum(base[1:], cand)
            if zero:
                w = tok[t, :U] + mw[t, :U, zero[0]]  # label u + 1 at frame t
                C = np.concatenate([[0.0], np.cumsum(w)])
                with np.errstate(invalid="ignore"):
                    run = np.maximum.accumulate(np.where(base > NEG, base - C, NEG))
                    base = np.where(run > NEG, run + C, NEG)
        best[t] = base
    return best


@dataclass
class _Prefix:
    labels: Tuple[int, ...]
    entry: np.ndarray  # (T,) float64
    dec_proj: np.ndarray  # (J,)
    state: State


class LabelSyncBeamSearch:
    """The label-synchronous beam search (module docstring).

    Args:
        model: The exported model.
        beam_size: K.
        nbest: Hypotheses returned per utterance (the best first).
        max_sym_per_frame: At most this many times T labels per hypothesis.
    """

    def __init__(
        self,
        model: ExportedModel,
        beam_size: int = 4,
        nbest: int = 1,
        max_sym_per_frame: int = 10,
    ):
        for name, value in (
            ("beam_size", beam_size),
            ("nbest", nbest),
            ("max_sym_per_frame", max_sym_per_frame),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        self.model = model
        self.K, self.M = beam_size, nbest
        self.max_sym = max_sym_per_frame
        self.cols = LatticeColumns(model.lattice, model.info.joint_size)

    def start(self, count: int):  # streams of a beam recognizer keep no run
        return [None] * count

    def search(self, enc_proj: np.ndarray, lengths: np.ndarray):
        """The best hypothesis of each utterance (B, T, J), (B,) (its n-best:
        :meth:`search_nbest`)."""
        return [nbest[0] for nbest in self.search_nbest(enc_proj, lengths)]

    def search_nbest(self, enc_proj, lengths) -> List[List[BeamHypothesis]]:
        model, cols, K, M = self.model, self.cols, self.K, self.M
        B, T, J = enc_proj.shape
        lens = np.asarray(lengths, np.int64)
        dec, state = model.step(
            np.full(B, model.info.blank_id, np.int64), model.initial_state(B)
        )
        beams: List[List[_Prefix]] = []
        for b in range(B):
            entry = np.full(T, NEG)
            if lens[b] > 0:
                entry[0] = 0.0
            beams.append(
                [_Prefix((), entry, dec[b], model.select_state(state, slice(b, b + 1)))]
                if lens[b] > 0
                else []
            )
        ended: List[List[Tuple[float, Tuple[int, ...]]]] = [[] for _ in range(B)]
        labels_left = lens * self.max_sym
        while any(beams):
            rows = [(b, p) for b in range(B) for p in beams[b]]
            A = len(rows)
            b_of = np.array([b for b, _ in rows])
            enc = enc_proj[b_of].reshape(A * T, J)
            decp = np.repeat(np.stack([p.dec_proj for _, p in rows]), T, 0)
            lp = model.log_probs(enc, decp).reshape(A, T, -1)
            row_lens = lens[b_of]
            entry = np.stack([p.entry for _, p in rows])
            alpha, end = level_forward(
                entry, cols.blank_weights(lp), cols.blank_frames, row_lens
            )
            for (b, p), score in zip(rows, end):
                if score > NEG:
                    ended[b].append((float(score), p.labels))
            for b in range(B):
                ended[b].sort(key=lambda e: -e[0])
                del ended[b][M:]
            scores = self._prefix_scores(alpha, lp, row_lens)  # (A, L)
            children = []
            start = 0
            for b in range(B):
                n = len(beams[b])
                if not n:
                    continue
                floor = ended[b][M - 1][0] if len(ended[b]) >= M else NEG
                grid = scores[start : start + n].ravel()
                if labels_left[b] <= 0:
                    grid = np.full_like(grid, NEG)
                order = np.argsort(-grid, kind="stable")[:K]
                for idx in order:
                    if grid[idx] > floor and grid[idx] > NEG:
                        r, li = divmod(int(idx), len(cols.labels))
                        children.append((b, start + r, int(cols.labels[li])))
                start += n
            labels_left = labels_left - 1
            beams = self._children(rows, children, alpha, lp, row_lens, B)
        return [
            [
                self.best_alignment(enc_proj[b], int(lens[b]), labels, score)
                for score, labels in ended[b]
            ]
            or [BeamHypothesis([], NEG)]
            for b in range(B)
        ]

    def _prefix_scores(self, alpha, lp, lens) -> np.ndarray:
        """(A, L) float64: log sum_t' entry_{y+l}(t') for every label l."""
        cols = self.cols
        A, T = alpha.shape
        top = np.max(alpha, 1, keepdims=True)
        top = np.where(np.isfinite(top), top, 0.0)
        weight = np.exp(alpha - top)  # (A, T)
        if cols.tdt:
            t = np.arange(T)
            lands = (t[None, :, None] + cols.move_frames[None, None, :]) < lens[
                :, None, None
            ]
            fits = np.where(lands, np.exp(cols.move_weights(lp)), 0.0).sum(-1)
            weight = weight * fits
        probs = np.exp(lp[..., cols.labels].astype(np.float64))  # (A, T, L)
        mass = np.einsum("at,atl->al", weight, probs)
        with np.errstate(divide="ignore"):
            return np.where(
                np.isfinite(np.max(alpha, 1, keepdims=True)), top + np.log(mass), NEG
            )

    def _children(self, rows, children, alpha, lp, lens, B) -> List[List[_Prefix]]:
        beams: List[List[_Prefix]] = [[] for _ in range(B)]
        if not children:
            return beams
        model, cols = self.model, self.cols
        move_w = cols.move_weights(lp).astype(np.float64)
        entries = []
        for b, r, label in children:
            tok = lp[r, :, label].astype(np.float64)
            entries.append(
                child_entry(alpha[r], tok, move_w[r], cols.move_frames, int(lens[r]))
            )
        labels = np.array([label for _, _, label in children], np.int64)
        state = model.concat_states([rows[r][1].state for _, r, _ in children])
        dec, state = model.step(labels, state)
        for i, (b, r, label) in enumerate(children):
            parent = rows[r][1]
            beams[b].append(
                _Prefix(
                    parent.labels + (label,),
                    entries[i],
                    dec[i],
                    model.select_state(state, slice(i, i + 1)),
                )
            )
        return beams

    def best_alignment(self, enc, length: int, labels, score) -> BeamHypothesis:
        """The hypothesis with the timing of its most probable alignment.

        Runs the prediction network over ``labels`` and the joint network on every
        (frame, label position), then a Viterbi pass over the lattice."""
        model, cols = self.model, self.cols
        U = len(labels)
        T = length
        seq = np.array((model.info.blank_id,) + tuple(labels), np.int64)
        state = model.initial_state(1)
        decs = []
        for k in seq:
            d, state = model.step(np.array([k]), state)
            decs.append(d[0])
        dec = np.stack(decs)  # (U + 1, J)
        lp = model.log_probs(
            np.repeat(enc[:T], U + 1, 0), np.tile(dec, (T, 1))
        ).reshape(T, U + 1, -1)
        bw = cols.blank_weights(lp).astype(np.float64)  # (T, U + 1, NB)
        mw = cols.move_weights(lp).astype(np.float64)  # (T, U + 1, NM)
        tok = np.zeros((T, U + 1))
        if U:
            tok[:, :U] = lp[:, np.arange(U), np.array(labels)]
        best = _viterbi(bw, cols.blank_frames, tok, mw, cols.move_frames, T, U)
        return self._backtrack(best, bw, tok, mw, labels, score, T, U)

    def _backtrack(self, best, bw, tok, mw, labels, score, T, U) -> BeamHypothesis:
        """The arcs of the best alignment, from (T, U) back to (0, 0): at each node
        the predecessor arc whose sum gives the node's best score."""
        cols = self.cols
        timing = [None] * U
        skipped = big = 0
        t, u = T, U
        while (t, u) != (0, 0) and best[t, u] > NEG:
            found = None
            for j, n in enumerate(cols.blank_frames):
                s = t - n
                if s >= 0 and (t < T or u == U):
                    if _same(best[s, u] + bw[s, u, j], best[t, u]):
                        found = (0, j, s)
                        break
            if found is None and u > 0 and t < T:
                for i, n in enumerate(cols.move_frames):
                    s = t - n
                    if s >= 0 and _same(
                        best[s, u - 1] + tok[s, u - 1] + mw[s, u - 1, i], best[t, u]
                    ):
                        found = (1, i, s)
                        break
            if found is None:  # cannot happen: best[t, u] came from some arc
                raise RuntimeError(f"no arc reaches node ({t}, {u}) of the alignment")
            kind, j, s = found
            if kind == 0:
                n = int(cols.blank_frames[j])
                if n > 1:
                    skipped += n - 1
                    big += 1
            else:
                n = int(cols.move_frames[j])
                if n > 1:
                    skipped += n - 1
                u -= 1
                timing[u] = (s, n, float(tok[s, u] + mw[s, u, j]))
            t = s
        return BeamHypothesis(list(labels), score, timing, skipped, big)
