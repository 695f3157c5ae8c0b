"""Label timing (``Hypothesis.timing``) of every search, and word times / CTM lines.

A scripted model with a known alignment: its joint network puts almost all the
probability on the arc of a script (label k at frame t, covering e frames; between
the labels the longest blank that fits: big blanks of 2, 4, 8 frames, or a TDT blank
of the largest duration that fits), so every search, greedy and beam, batched or not,
must return the script's labels with the script's frames, and frames skipped as the
script's blanks skip them. Word times: tokens grouped into words by the token type,
seconds from frames; CTM lines.
"""

import math
from typing import List, Tuple

import pytest
import torch

from espnet_multiblank.decoding import (
    BeamSearch,
    GreedySearch,
    LabelLoopingGreedySearch,
    Stepper,
)
from espnet_multiblank.espnet.inference.timestamps import (
    ctm_header,
    ctm_lines,
    word_spans,
    word_times,
)
from espnet_multiblank.lattice import MultiblankLattice, TDTLattice

SURE = 20.0  # logit of the scripted arc (the others: 0)
BIG = (2, 4, 8)
BLANK = 3  # <blank8> <blank4> <blank2> <blank> labels 4..7
V = 8
TDT_DURATIONS = (0, 1, 2, 3, 5)

# utterance -> (T, [(frame, label, frames covered)])
MB_SCRIPTS = {
    0: (30, [(0, 4, 0), (0, 5, 0), (9, 6, 0), (22, 7, 0)]),
    1: (17, [(16, 4, 0)]),
    2: (11, []),
    3: (25, [(3, 5, 0), (12, 5, 0), (12, 4, 0), (13, 7, 0)]),
}
TDT_SCRIPTS = {
    0: (30, [(0, 4, 0), (0, 5, 2), (9, 6, 1), (22, 7, 3)]),
    1: (17, [(15, 4, 1)]),
    2: (11, []),
    3: (25, [(3, 5, 5), (12, 5, 0), (12, 4, 1), (14, 7, 0)]),
}


class ScriptedStepper(Stepper):
    """A stepper whose arcs follow a script. Encoder frames are ``(t, utterance)``;
    the prediction state counts the labels emitted."""

    def __init__(self, scripts, vocab, blank, tdt=False):
        self.scripts, self.blank, self.tdt = scripts, blank, tdt
        self.num_tokens = vocab
        self.vocab_size = vocab + (len(TDT_DURATIONS) if tdt else 0)

    def project_enc(self, enc_out):
        return enc_out

    def init_state(self, batch):
        return torch.zeros(1, batch, 1), None

    def step(self, labels, state):
        h = state[0] + (labels != self.blank).float().view(1, -1, 1)
        # (A, 2) like the encoder frames: (labels so far, 0)
        return torch.cat([h[0], torch.zeros_like(h[0])], 1), (h, None)

    def joint(self, enc_proj, dec_proj):
        out = torch.zeros(enc_proj.size(0), self.vocab_size)
        rows = zip(enc_proj.tolist(), dec_proj[:, 0].tolist())
        for a, ((t, u), n) in enumerate(rows):
            T, script = self.scripts[int(u)]
            t, n = int(t), int(n)
            if n < len(script) and script[n][0] == t:
                _, label, covered = script[n]
                out[a, label] = SURE
                if self.tdt:
                    out[a, self.num_tokens + TDT_DURATIONS.index(covered)] = SURE
                continue
            gap = (script[n][0] if n < len(script) else T) - t
            if self.tdt:
                out[a, self.blank] = SURE
                e = max([1] + [d for d in TDT_DURATIONS if 1 <= d <= gap])
                out[a, self.num_tokens + TDT_DURATIONS.index(e)] = SURE
            else:
                d = max([1] + [d for d in BIG if d <= gap])
                out[a, self.blank if d == 1 else self.blank - 1 - BIG.index(d)] = SURE
        return out

    def select_state(self, state, idx):
        return state[0][:, idx], None

    def cat_states(self, states):
        return torch.cat([s[0] for s in states], 1), None

    def scatter_state(self, state, idx, rows):
        state[0][:, idx] = rows[0]

    def where_state(self, mask, new, old):
        return torch.where(mask.view(1, -1, 1), new[0], old[0]), None


def encoder(scripts) -> Tuple[torch.Tensor, torch.Tensor]:
    lens = [T for T, _ in scripts.values()]
    enc = torch.zeros(len(lens), max(lens), 2)
    for u, T in enumerate(lens):
        enc[u, :, 0] = torch.arange(max(lens))
        enc[u, :, 1] = u
    return enc, torch.tensor(lens)


def skipped(T: int, script, tdt: bool) -> int:
    """Frames the script's path never evaluates."""
    total, t, n = 0, 0, 0
    while t < T:
        if n < len(script) and script[n][0] == t:
            covered = script[n][2]
            total += max(covered - 1, 0)
            t, n = t + covered, n + 1
            continue
        gap = (script[n][0] if n < len(script) else T) - t
        moves = [d for d in (TDT_DURATIONS if tdt else (1,) + BIG) if 1 <= d <= gap]
        total += max(moves) - 1
        t += max(moves)
    return total


def mb_searches(stepper):
    lattice = MultiblankLattice.create(BLANK, BIG)
    greedy = GreedySearch(stepper, lattice)
    yield "greedy one", lambda enc, T: greedy.search_one(enc[:T])
    yield "greedy batch", greedy.search_batch
    for w in (1, 4):
        ll = LabelLoopingGreedySearch(stepper, lattice, window=w)
        yield f"label-looping w{w}", ll.search_batch
    for sync in ("frame", "step"):
        beam = BeamSearch(stepper, lattice, beam_size=3, beam_sync=sync)
        yield f"beam {sync} one", lambda enc, T, beam=beam: beam.search(enc[:T])[0]
        yield f"beam {sync} batch", beam.search_batch


def tdt_searches(stepper):
    lattice = TDTLattice.create(0, TDT_DURATIONS)
    greedy = GreedySearch(stepper, lattice)
    yield "greedy one", lambda enc, T: greedy.search_one(enc[:T])
    yield "greedy batch", greedy.search_batch
    ll = LabelLoopingGreedySearch(stepper, lattice)
    yield "label-looping", ll.search_batch
    for sync in ("frame", "step"):
        beam = BeamSearch(stepper, lattice, beam_size=3, beam_sync=sync)
        yield f"beam {sync} one", lambda enc, T, beam=beam: beam.search(enc[:T])[0]
        yield f"beam {sync} batch", beam.search_batch


@pytest.mark.parametrize("kind", ["multiblank", "tdt"])
def test_every_search_returns_the_known_alignment(kind):
    tdt = kind == "tdt"
    scripts = TDT_SCRIPTS if tdt else MB_SCRIPTS
    stepper = ScriptedStepper(scripts, V, 0 if tdt else BLANK, tdt)
    enc, lens = encoder(scripts)
    names = []
    for name, run in (tdt_searches if tdt else mb_searches)(stepper):
        if name.endswith("one"):
            hyps = [run(enc[u], T) for u, (T, _) in scripts.items()]
        else:
            hyps = run(enc, lens)
        for u, (T, script) in scripts.items():
            hyp = hyps[u]
            assert hyp.labels == [k for _, k, _ in script], (name, u)
            assert [x[:2] for x in hyp.timing] == [(t, e) for t, _, e in script], (
                name,
                u,
            )
            for _, _, logp in hyp.timing:  # the scripted arcs are near-certain
                assert -1e-3 < logp <= 1e-6, (name, u, logp)
            assert hyp.frames_skipped == skipped(T, script, tdt), (name, u)
        names.append(name)
    assert len(names) >= 7


# --------------------------------------------------------------- word times


def test_word_spans_by_token_type():
    assert word_spans(["one", "two"], "word") == [("one", [0]), ("two", [1])]
    assert word_spans(["\u2581he", "llo", "\u2581w", "orld"], "bpe") == [
        ("hello", [0, 1]),
        ("world", [2, 3]),
    ]
    assert word_spans(["\u2581", "ab", "c", "\u2581d"], "bpe") == [
        ("abc", [0, 1, 2]),
        ("d", [3]),
    ]
    assert word_spans(["a", "b", "<space>", "c"], "char") == [
        ("ab", [0, 1]),
        ("c", [3]),
    ]
    assert word_spans(["<space>", "a", "<space>"], "char") == [("a", [1])]
    assert word_spans([], "bpe") == []


def test_word_times_and_ctm_lines():
    tokens: List[str] = ["\u2581fi", "ve", "\u2581nine"]
    timing = [(10, 0, math.log(0.9)), (12, 2, math.log(0.4)), (30, 0, 0.0)]
    words = word_times(tokens, timing, "bpe", 0.04)
    assert [w.word for w in words] == ["five", "nine"]
    five, nine = words
    # start: first token's frame; end: last token's frame + its frames (>= 1)
    assert (five.start, five.end) == pytest.approx((0.40, (12 + 2) * 0.04))
    assert (nine.start, nine.end) == pytest.approx((1.20, 1.24))
    assert five.confidence == pytest.approx(math.sqrt(0.9 * 0.4))
    assert nine.confidence == pytest.approx(1.0)
    assert ctm_lines("utt1", words) == [
        "utt1 1 0.400 0.160 five 0.6000",
        "utt1 1 1.200 0.040 nine 1.0000",
    ]
    with pytest.raises(ValueError, match="one timing entry per token"):
        word_times(tokens, timing[:2], "bpe", 0.04)


def test_the_ctm_header_says_what_the_times_mean():
    for tdt in (False, True):
        lines = ctm_header(tdt, 0.04)
        assert all(line.startswith(";; ") for line in lines)  # NIST CTM comments
        assert "encoder frame (40 ms)" in lines[1]
        duration = lines[2]
        assert ("the model's own word duration" in duration) == tdt
        assert ("not its length in the audio" in duration) == (not tdt)
