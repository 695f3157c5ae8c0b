"""A fourth lattice kind, defined here, decoded by the package's searches unchanged.

docs/architecture.md ("Adding a lattice kind") says a new kind touches lattice.py,
one symbol table and the tests. This file is that recipe carried out for a toy kind:
a multi-blank lattice whose labels also move, each covering ``label_frames`` >= 1
frames (a monotonic multi-blank transducer: at most one label per frame). Its class
below is all the kind adds: the label arcs (``label_moves``), the longest arc
(``max_frames``) and which symbols are blanks (``is_blank``, ``frames``). The table
change it needed was made once, in the one-softmax ``SymbolTable``: labels that
cover frames, read from the lattice with the rest (``room_cap``, the end rule: a
label never lands on T). No search knows the kind.

Every search of the package is then checked against oracles written here from the
kind's rules alone, with the networks called directly: greedy (one utterance,
batched, label-looping, streamed) against the greedy rule, and the beam searches
that prune nothing against every path's probability summed per label sequence.
"""

from dataclasses import dataclass

import pytest
import search_cases as sc
import torch
from one_loop import one_loop_projected
from search_oracles import _predict

from espnet_multiblank.decoding import (
    BeamSearch,
    GreedySearch,
    JointStepper,
    LabelLoopingGreedySearch,
)
from espnet_multiblank.decoding.streaming import (
    StreamingGreedySearch,
    StreamingRowGreedySearch,
)
from espnet_multiblank.decoding.tables import SymbolTable, early_choice
from espnet_multiblank.lattice import LabelMove, MultiblankLattice

pytestmark = pytest.mark.timeout(600)


@dataclass(frozen=True)
class SkippingLabelsLattice(MultiblankLattice):
    """A multi-blank lattice whose every label covers ``label_frames`` frames."""

    label_frames: int = 1

    kind = "skipping-labels"

    @property
    def label_moves(self):
        return (LabelMove(None, self.label_frames),)

    @property
    def max_frames(self) -> int:
        return max(super().max_frames, self.label_frames)

    def frames(self, symbol: int) -> int:
        return super().frames(symbol) if self.is_blank(symbol) else self.label_frames

    def is_blank(self, symbol: int) -> bool:
        return symbol in self.blank_ids


#: (blank, big blank durations, label frames, vocabulary): the toy lattices
TOYS = [
    (1, (), 1, 4),  # a monotonic standard RNN-T
    (2, (2,), 1, 5),  # with a big blank over 2 frames
    (2, (3,), 2, 5),  # labels over 2 frames, a big blank over 3
]


def _toy(blank, durations, label_frames, vocab, seed=0, blank_bias=0.0):
    lattice = SkippingLabelsLattice(blank, durations, label_frames)
    model = sc.make_mb_model(
        seed, blank_id=blank, durations=durations, blank_bias=blank_bias, vocab=vocab
    )
    stepper = JointStepper(model.decoder, model.joint_network, vocab)
    return lattice, model, stepper


def _blanks(lattice):
    """{blank symbol: frames}, from the kind's definition (not the lattice's arcs)."""
    out = {lattice.blank: 1}
    for i, d in enumerate(lattice.big_blank_durations):
        out[lattice.blank - 1 - i] = d
    return out


def _allowed(lattice, t, T, V):
    """The symbols allowed at frame t of T: a blank that does not pass T, a label
    that lands before T (a blank ends every path)."""
    blanks = _blanks(lattice)
    return [
        k
        for k in range(V)
        if (t + blanks[k] <= T if k in blanks else t + lattice.label_frames < T)
    ]


def oracle_sequences(lattice, model, enc):
    """{labels: log P(labels)}: every path of the toy lattice enumerated."""
    blanks, pred = _blanks(lattice), _predict(model.decoder)
    T, V = enc.size(0), model.decoder.odim
    paths = {}

    def rec(t, y, out, state, lp):
        if t == T:
            paths.setdefault(y, []).append(lp)
            return
        logp = torch.log_softmax(model.joint_network(enc[t], out), -1).double()
        for k in _allowed(lattice, t, T, V):
            if k in blanks:
                rec(t + blanks[k], y, out, state, lp + logp[k])
            else:
                new_out, new_state = pred(k, state)
                rec(
                    t + lattice.label_frames, y + (k,), new_out, new_state, lp + logp[k]
                )

    with torch.no_grad():
        out, state = pred(lattice.blank, model.decoder.init_state(1))
        rec(0, (), out, state, torch.tensor(0.0, dtype=torch.float64))
    return {y: float(torch.logsumexp(torch.stack(v), 0)) for y, v in paths.items()}


def oracle_greedy(lattice, model, enc, decision):
    """(labels, score, frames of each label) of the greedy rule: the most probable
    allowed symbol ("symbol"), or a label only when it beats the allowed blanks
    together, else the most probable allowed blank scored with their total
    ("total")."""
    blanks, pred = _blanks(lattice), _predict(model.decoder)
    T, V = enc.size(0), model.decoder.odim
    out, state = pred(lattice.blank, model.decoder.init_state(1))
    t, labels, frames, score = 0, [], [], 0.0
    with torch.no_grad():
        while t < T:
            logp = torch.log_softmax(model.joint_network(enc[t], out), -1).tolist()
            allowed = _allowed(lattice, t, T, V)
            k = max(allowed, key=lambda s: logp[s])
            blank_lp = float(
                torch.logsumexp(
                    torch.tensor([logp[b] for b in allowed if b in blanks]), 0
                )
            )
            if decision == "total" and (k in blanks or logp[k] <= blank_lp):
                k = max((b for b in allowed if b in blanks), key=lambda s: logp[s])
                score += blank_lp
            else:
                score += logp[k]
            if k in blanks:
                t += blanks[k]
            else:
                labels.append(k)
                frames.append(t)
                out, state = pred(k, state)
                t += lattice.label_frames
    return labels, score, frames


def _enc(seed, lens):
    return sc.enc_batch(seed, lens)


@pytest.mark.parametrize("toy", TOYS)
def test_the_kind_is_its_own(toy):
    """The toy lattice answers the searches' questions from its own arcs: labels
    move, the cap on the frames left counts a label's frames plus one."""
    lattice, _, _ = _toy(*toy)
    assert lattice.labels_move and not lattice.factorised
    assert lattice.room_cap == max(lattice.max_frames, toy[2] + 1)
    assert lattice.kind == "skipping-labels"


@pytest.mark.parametrize("toy", TOYS)
@pytest.mark.parametrize("decision", ["symbol", "total"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_searches_follow_the_kinds_rule(toy, decision, seed):
    """One utterance, batched (frame- and label-looping): the oracle's labels, label
    frames and score."""
    lattice, model, stepper = _toy(*toy, seed=seed, blank_bias=-1.0)
    lens = [7, 3, 5, 1]
    enc, enc_lens = _enc(seed, lens)
    greedy = GreedySearch(stepper, lattice, blank_decision=decision)
    looping = LabelLoopingGreedySearch(stepper, lattice, blank_decision=decision)
    batched = greedy.search_batch(enc, enc_lens)
    looped = looping.search_batch(enc, enc_lens)
    assert any(hyp.labels for hyp in batched)  # labels that move are exercised
    for b, T in enumerate(lens):
        labels, score, frames = oracle_greedy(lattice, model, enc[b, :T], decision)
        one = greedy.search_one(enc[b, :T])
        assert one.labels == labels
        assert [timing[0] for timing in one.timing] == frames
        assert one.score == pytest.approx(score, abs=1e-4)
        assert one.frame == T
        for other in (batched[b], looped[b]):
            assert other.labels == one.labels
            assert other.score == pytest.approx(one.score, abs=1e-5)


@pytest.mark.parametrize("toy", TOYS)
@pytest.mark.parametrize("beam_sync", ["label", "frame"])
@pytest.mark.parametrize("seed", [0, 1])
def test_beams_that_prune_nothing_give_every_sequence_exactly(toy, beam_sync, seed):
    """A beam wider than the lattice returns every label sequence with the sum over
    its paths (the oracle's enumeration), one utterance and batched alike."""
    lattice, model, stepper = _toy(*toy, seed=seed)
    lens = [5, 4]
    enc, enc_lens = _enc(seed, lens)
    wide = BeamSearch(  # wider than the lattice's 121 label sequences at most
        stepper,
        lattice,
        beam_size=256,
        nbest=256,
        blank_decision="symbol",
        beam_sync=beam_sync,
    )
    nbests = wide.search_batch_nbest(enc, enc_lens)
    for b, T in enumerate(lens):
        exact = oracle_sequences(lattice, model, enc[b, :T])
        runs = [nbests[b]] + ([wide.search(enc[b, :T])] if beam_sync == "frame" else [])
        for hyps in runs:
            got = {tuple(h.labels): h.score for h in hyps}
            assert set(got) == set(exact)
            for y, score in exact.items():
                assert got[y] == pytest.approx(score, rel=1e-5, abs=1e-5)
            assert tuple(hyps[0].labels) == max(exact, key=exact.get)


@pytest.mark.parametrize("toy", TOYS)
@pytest.mark.parametrize("one_loop", [True, False])
@pytest.mark.parametrize("decision", ["symbol", "total"])
def test_streamed_greedy_equals_offline(toy, one_loop, decision):
    """Frames fed one at a time: the stream decides each step only when every T
    still possible agrees (the lattice's room cap), so its hypothesis is the
    offline one bit for bit (the offline search's own loop: one utterance at a time
    for the frame-looping search, the batch's for label-looping)."""
    lattice, model, stepper = _toy(*toy, seed=3, blank_bias=-1.0)
    lens = [9, 6]
    enc, enc_lens = _enc(3, lens)
    if one_loop:
        search = GreedySearch(stepper, lattice, blank_decision=decision)
        rows = StreamingRowGreedySearch(search, len(lens), "cpu")
    else:
        search = LabelLoopingGreedySearch(
            stepper, lattice, blank_decision=decision, window=1
        )
        rows = StreamingGreedySearch(search, len(lens), "cpu")
    proj = stepper.project_enc(enc)
    if one_loop:
        offline = one_loop_projected(search, proj, enc_lens)
    else:
        offline = search.search_projected(proj, enc_lens)
    assert any(hyp.labels for hyp in offline)  # labels move in these streams
    rows.reset(range(len(lens)))
    for t in range(max(lens)):
        for b, T in enumerate(lens):
            if t < T:
                rows.append(b, proj[b, t : t + 1], final=t == T - 1)
        rows.advance()
    for b in range(len(lens)):
        got, want = rows.hypothesis(b), offline[b]
        assert (got.labels, got.score, got.timing) == (
            want.labels,
            want.score,
            want.timing,
        )


@pytest.mark.parametrize(
    "lattice",
    [MultiblankLattice(4, (2, 4, 8)), MultiblankLattice(1, ())]
    + [SkippingLabelsLattice(*toy[:3]) for toy in TOYS],
    ids=lambda lattice: f"{lattice.kind}-{lattice.blank}-{lattice.max_frames}",
)
@pytest.mark.parametrize("decision", ["symbol", "total"])
def test_the_tables_early_shortcut_is_the_every_room_rule(lattice, decision):
    """A stream's early step from the widest room's choice alone
    (``SymbolTable.early_choice``) is the general rule's (every room's choice, one by
    one): the same step, or the same wait, with the same score at every room."""
    V = max(lattice.blank + 1, 6)
    table = SymbolTable(lattice, V, torch.device("cpu"))
    C = lattice.room_cap
    gen = torch.Generator().manual_seed(0)
    decided = waited = 0
    for trial in range(400):
        # spread enough that labels and blank totals often come close
        logp = (torch.randn(1, V, generator=gen) * 2.0).log_softmax(-1)
        for guarded in (False, True):
            for room in range(1, C):
                got = table.early_choice(logp, room, guarded, 1, decision, {})
                want = early_choice(table, logp, room, guarded, 1, decision, {})
                assert (got is None) == (want is None), (trial, guarded, room)
                if want is None:
                    waited += 1
                    continue
                decided += 1
                assert got[0][:4] == want[0][:4]
                scores = got[1] or {r: got[0][4] for r in range(room, C + 1)}
                for r, score in want[1].items():
                    assert scores[r] == score, (trial, guarded, room, r)
    if C > 1:
        assert decided and waited  # both outcomes were compared
