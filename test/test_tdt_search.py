"""TDT greedy (one utterance and batched) and beam search on tiny random models.

The oracles call ESPnet's prediction and joint networks directly, one hypothesis at a
time, and follow the rules of docs/decoding.md ("TDT searches"): an arc is a token and
a duration scored ``log_softmax(z[:V])[k] + log_softmax(z[V:])[j]``; from frame t of T
a blank takes a duration 1 <= e <= T - t, a label e < T - t (e >= 1 once
``max_sym_per_frame`` labels stayed at that frame); where nothing is allowed (duration
sets without 1) the blank takes any duration, clipped at T. ``blank_decision``
"symbol" emits the most probable arc; "total" the token whose allowed arcs are the
most probable together, with its most probable duration, scoring that total.
"""

import math
from types import SimpleNamespace

import pytest
import torch

import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)

# isort: split
from espnet2.asr.decoder.transducer_decoder import TransducerDecoder
from espnet2.asr_transducer.joint_network import JointNetwork

from espnet_multiblank.decoding import (
    JointStepper,
    MultiblankBeamSearch,
    MultiblankGreedySearch,
    TDTBeamSearch,
    TDTGreedySearch,
)
from espnet_multiblank.espnet.inference.search import (
    build_transducer_search,
    lattice_from_model,
    resolve_search_type,
)
from espnet_multiblank.lattice import MultiblankLattice, TDTLattice

D_ENC = 8
DURS = (0, 1, 2, 3, 4)
pytestmark = pytest.mark.timeout(600)  # a search that never ends fails, not hangs


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: threads only add overhead (shared CPUs)
    yield
    torch.set_num_threads(n)


def make_model(seed=0, durations=DURS, blank=0, vocab=6, blank_bias=1.0, scale=3.0):
    """Random TransducerDecoder (V tokens, ESPnet's pad 0) + JointNetwork with V + D
    outputs, as the plug-in's TDT model has them."""
    torch.manual_seed(seed)
    decoder = TransducerDecoder(vocab, hidden_size=12, embed_pad=0).eval()
    joint = JointNetwork(vocab + len(durations), D_ENC, 12, joint_space_size=12).eval()
    with torch.no_grad():
        joint.lin_out.weight.mul_(scale)
        joint.lin_out.bias[blank] += blank_bias
    return SimpleNamespace(
        decoder=decoder,
        joint_network=joint,
        blank_id=blank,
        tdt_durations=tuple(durations),
        big_blank_durations=(),
        token_list=[f"t{i}" for i in range(vocab)],
    )


def core(model, cls, **kwargs):
    V = model.decoder.odim
    stepper = JointStepper(
        model.decoder, model.joint_network, V + len(model.tdt_durations)
    )
    return cls(
        stepper, TDTLattice.create(model.blank_id, model.tdt_durations), **kwargs
    )


def enc_batch(seed, lens):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(len(lens), max(lens), D_ENC, generator=g), torch.tensor(lens)


class Oracle:
    """The networks called directly: prediction-network steps and arc log-probs."""

    def __init__(self, model):
        self.dec, self.joint = model.decoder, model.joint_network
        self.V = model.decoder.odim
        self.blank = model.blank_id
        self.durations = model.tdt_durations

    def pred(self, k, state):
        out, state = self.dec.rnn_forward(self.dec.embed(torch.tensor([[k]])), state)
        return out[0, 0], state

    def start(self):
        return self.pred(self.blank, self.dec.init_state(1))

    def allowed(self, k, e, n_stayed, max_sym, room):
        if k == self.blank:
            return 1 <= e <= room
        return e < room and (e >= 1 or n_stayed < max_sym)

    def arcs(
        self, enc_t, dec_out, n_stayed, max_sym, room, decision="symbol", bonus=None
    ):
        """{(k, j): score} of every allowed arc ("symbol": its log-prob) or of the
        best arc of every token ("total": the token's allowed arcs' total); ``bonus``
        ({label: weighted LM score}) is added to the labels' token log-probs."""
        z = self.joint(enc_t, dec_out).double()
        tok, dur = z[: self.V].log_softmax(-1), z[self.V :].log_softmax(-1)
        if bonus:
            tok = tok + torch.tensor(
                [bonus.get(k, 0.0) for k in range(self.V)], dtype=torch.float64
            )
        ok = {
            (k, j)
            for k in range(self.V)
            for j, e in enumerate(self.durations)
            if self.allowed(k, e, n_stayed, max_sym, room)
        }
        if not ok:  # nothing fits: any blank, clipped
            ok = {(self.blank, j) for j, e in enumerate(self.durations) if e >= 1}
        if decision == "symbol":
            return {(k, j): float(tok[k] + dur[j]) for k, j in ok}
        out = {}
        for k in range(self.V):
            slots = [j for j in range(len(self.durations)) if (k, j) in ok]
            if slots:
                best = max(slots, key=lambda j: float(dur[j]))
                out[k, best] = float(tok[k] + torch.logsumexp(dur[slots], 0))
        return out


def reference_greedy(model, enc, max_sym, decision="total", lm=None):
    """The best candidate (``Oracle.arcs``) at every step, by enumerating them all.

    ``lm(labels) -> ({label: weighted LM score of it next}, weighted end score)``:
    shallow fusion (the labels' token log-probs plus their LM score, the end score
    added once at the end)."""
    o = Oracle(model)
    T = enc.size(0)
    t, n, y, score, skipped, long_blanks = 0, 0, [], 0.0, 0, 0
    with torch.no_grad():
        out, state = o.start()
        while t < T:
            bonus = None if lm is None else lm(y)[0]
            arcs = o.arcs(enc[t], out, n, max_sym, T - t, decision, bonus)
            (k, j), lp = max(arcs.items(), key=lambda a: a[1])
            score += lp
            frames = min(o.durations[j], T - t)
            if k != o.blank:
                y.append(k)
                out, state = o.pred(k, state)
            if frames == 0:
                n += 1
                continue
            t, n = t + frames, 0
            skipped += frames - 1
            long_blanks += int(frames > 1 and k == o.blank)
    if lm is not None:
        score += lm(y)[1]
    return y, score, skipped, long_blanks


# durations with 0 and 1, without 0, without 1, unsorted, the recipe's
DURATION_SETS = [DURS, (1, 2, 4), (0, 2, 3), (3, 0, 1, 2), tuple(range(9))]


@pytest.mark.parametrize("decision", ["total", "symbol"])
@pytest.mark.parametrize("durations", DURATION_SETS)
@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_follows_the_documented_rule(durations, seed, decision):
    model = make_model(seed, durations=durations, blank=seed % 3)
    search = core(model, TDTGreedySearch, max_sym_per_frame=2, blank_decision=decision)
    enc, lens = enc_batch(seed, [21, 2, 1])
    batch = search.search_batch(enc, lens)
    for b, T in enumerate(lens.tolist()):
        y, score, skipped, long_blanks = reference_greedy(
            model, enc[b, :T], max_sym=2, decision=decision
        )
        for got in (search.search_one(enc[b, :T]), batch[b]):
            assert got.yseq == [model.blank_id] + y
            assert got.score == pytest.approx(score, rel=1e-5, abs=1e-4)
            assert (got.frames_skipped, got.big_blank_emissions) == (
                skipped,
                long_blanks,
            )
            assert got.frame == T


def test_the_decisions_differ_on_the_fixture():
    """The two rules give different hypotheses here: the test above can tell them
    apart."""
    model = make_model(0)
    enc, lens = enc_batch(0, [40] * 4)
    hyps = {
        d: [
            h.yseq
            for h in core(model, TDTGreedySearch, blank_decision=d).search_batch(
                enc, lens
            )
        ]
        for d in ("total", "symbol")
    }
    assert hyps["total"] != hyps["symbol"]


@pytest.mark.parametrize("durations", DURATION_SETS)
@pytest.mark.parametrize("seed", [0, 1])
def test_batched_greedy_equals_one_at_a_time(durations, seed):
    model = make_model(seed, durations=durations, blank=1)
    search = core(model, TDTGreedySearch, max_sym_per_frame=3)
    lens = [23, 1, 17, 9, 0, 30]
    enc, enc_lens = enc_batch(seed, lens)
    batch = search.search_batch(enc, enc_lens)
    for b, T in enumerate(lens):
        one = search.search_one(enc[b, :T])
        got = batch[b]
        assert got.yseq == one.yseq
        assert got.frame == one.frame == T
        assert got.big_blank_emissions == one.big_blank_emissions
        assert got.frames_skipped == one.frames_skipped
        assert math.isclose(got.score, one.score, rel_tol=1e-5, abs_tol=1e-4)
        assert search(enc[b, :T])[0].yseq == one.yseq  # ESPnet's interface


def test_the_fixture_exercises_every_kind_of_arc():
    """Labels that stay, labels that move, long blanks, and clipped arcs occur."""
    model = make_model(0)
    search = core(model, TDTGreedySearch)
    enc, lens = enc_batch(0, [40] * 6)
    hyps = search.search_batch(enc, lens)
    assert sum(len(h.labels) for h in hyps) > 10
    assert sum(h.big_blank_emissions for h in hyps) > 0
    labels_moving = sum(h.frames_skipped for h in hyps) > sum(
        h.big_blank_emissions for h in hyps
    )
    assert labels_moving
    for h in hyps:
        assert model.blank_id not in h.labels


@pytest.mark.parametrize("decision", ["total", "symbol"])
@pytest.mark.parametrize("durations", [DURS, (1, 2, 4), (0, 2, 3)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_size_one_equals_greedy(durations, seed, decision):
    model = make_model(seed, durations=durations)
    greedy = core(model, TDTGreedySearch, max_sym_per_frame=2, blank_decision=decision)
    beam1 = core(
        model,
        TDTBeamSearch,
        beam_size=1,
        max_sym_per_frame=2,
        blank_decision=decision,
    )
    enc, lens = enc_batch(seed + 10, [31, 5, 18, 1])
    for b, T in enumerate(lens.tolist()):
        g = greedy.search_one(enc[b, :T])
        (h,) = beam1(enc[b, :T])
        assert h.yseq == g.yseq
        assert (h.big_blank_emissions, h.frames_skipped) == (
            g.big_blank_emissions,
            g.frames_skipped,
        )
        assert h.frame == T
        assert math.isclose(h.score, g.score, rel_tol=1e-6, abs_tol=1e-5)


def constant_model(tok_bias, dur_bias, durations=DURS):
    """A joint whose output ignores its input: fixed token and duration logits."""
    model = make_model(0, durations=durations)
    with torch.no_grad():
        model.joint_network.lin_out.weight.zero_()
        model.joint_network.lin_out.bias.copy_(
            torch.tensor(list(tok_bias) + list(dur_bias))
        )
    return model


@pytest.mark.parametrize("decision", ["total", "symbol"])
@pytest.mark.parametrize("T", [1, 3, 10, 11, 12])
def test_blank_durations_and_frames_skipped(T, decision):
    """Blank with duration 3 (0 is most probable but a blank cannot stay), then the
    longest that fits: 3, 3, ..., then 2 or 1 landing on T; frames skipped = T -
    emissions."""
    tok_bias, dur_bias = [4.0, -20, -20, -20, -20, -20], [5.0, 0.0, 1.0, 3.0, 2.0]
    model = constant_model(tok_bias, dur_bias)
    enc, lens = enc_batch(0, [T])
    steps = [min(3, T - t) for t in range(0, T, 3)]
    tok = torch.log_softmax(torch.tensor(tok_bias, dtype=torch.float64), 0)
    dur = torch.log_softmax(torch.tensor(dur_bias, dtype=torch.float64), 0)
    if decision == "symbol":
        expected = sum(float(tok[0] + dur[e]) for e in steps)
    else:  # a blank step scores the blank's allowed durations: 1 .. min(4, T - t)
        expected = sum(
            float(tok[0] + torch.logsumexp(dur[1 : min(4, T - t) + 1], 0))
            for t in range(0, T, 3)
        )
    for search in (
        core(model, TDTGreedySearch, blank_decision=decision),
        core(model, TDTBeamSearch, beam_size=1, blank_decision=decision),
    ):
        h = search.search_batch(enc, lens)[0]
        assert h.yseq == [0] and h.frame == T
        assert h.frames_skipped == sum(s - 1 for s in steps) == T - len(steps)
        assert h.big_blank_emissions == sum(s > 1 for s in steps)
        assert h.score == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("T, labels, skipped", [(7, 3, 3), (8, 3, 4)])
def test_labels_move_by_their_duration_and_a_blank_ends(T, labels, skipped):
    """Label "2" with duration 2 at frames 0, 2, 4; at frame 6 no label may land on or
    past T, so a blank ends the path (T = 8: the blank covers 2 frames). With the
    clip rule the label at frame 6 is emitted and clipped."""
    model = constant_model(
        [math.log(0.4), -20, math.log(0.6), -20, -20, -20], [-3, 0, 3, -3, -3]
    )
    enc, lens = enc_batch(1, [T])
    for search in (
        core(model, TDTGreedySearch),
        core(model, TDTGreedySearch, blank_decision="symbol"),
        core(model, TDTBeamSearch, beam_size=1),
    ):
        h = search.search_batch(enc, lens)[0]
        assert h.yseq == [0] + [2] * labels and h.frame == T
        assert h.frames_skipped == skipped
        assert h.big_blank_emissions == int(T == 8)
    h = core(model, TDTGreedySearch, end_rule="clip").search_batch(enc, lens)[0]
    assert h.yseq == [0] + [2] * (labels + 1) and h.frame == T


@pytest.mark.timeout(120)  # without the guard the search would never end
def test_guard_makes_labels_move():
    """A label with duration 0 is always best: after max_sym_per_frame of them at a
    frame the label takes its best duration >= 1 that lands before T (2, then 1 at
    frame 4 of 6); at frame 5 labels can only stay, and after max_sym_per_frame of
    them the blank (duration 1) ends the path."""
    model = constant_model([0, 0, 0, 4.0, 0, 0], [6.0, 0, 3.0, 1.0, 0])
    enc, lens = enc_batch(2, [6])
    for max_sym in (1, 3):
        want = [0] + [3] * (3 * (max_sym + 1) + max_sym)
        for search in (
            core(model, TDTGreedySearch, max_sym_per_frame=max_sym),
            core(model, TDTBeamSearch, beam_size=1, max_sym_per_frame=max_sym),
        ):
            h = search.search_batch(enc, lens)[0]
            assert h.yseq == want, (max_sym, type(search).__name__)
            assert h.frames_skipped == 2 and h.frame == 6


@pytest.mark.parametrize("T", [1, 2, 5])
def test_durations_without_one_still_end(T):
    """Durations [0, 2, 3]: from T - 1 no blank fits; labels stay up to the guard,
    then the best blank is clipped at T (the documented fallback)."""
    model = constant_model(
        [3.0, 0.5, 0.4, 0.3, 0.2, 0.1], [0.0, 2.0, 1.0], durations=(0, 2, 3)
    )
    enc, lens = enc_batch(3, [T])
    for search in (core(model, TDTGreedySearch), core(model, TDTBeamSearch)):
        h = search.search_batch(enc, lens)[0]
        assert h.frame == T
    y, *_ = reference_greedy(model, enc[0, :T], max_sym=10)
    assert core(model, TDTGreedySearch).search_one(enc[0, :T]).labels == y


# ------------------------------------------------------------ beam: the documented rule


def enumerate_paths(model, enc, max_sym):
    """log P(y) summed over every path of the search lattice, per label sequence."""
    o = Oracle(model)
    T = enc.size(0)
    paths = {}

    def rec(t, y, n, out, state, lp):
        if t == T:
            paths.setdefault(y, []).append(lp)
            return
        for (k, j), a in o.arcs(enc[t], out, n, max_sym, T - t).items():
            frames = min(o.durations[j], T - t)
            new_t, new_n = (t, n + 1) if frames == 0 else (t + frames, 0)
            if k == o.blank:
                rec(new_t, y, new_n, out, state, lp + a)
            else:
                new_out, new_state = o.pred(k, state)
                rec(new_t, y + (k,), new_n, new_out, new_state, lp + a)

    with torch.no_grad():
        out, state = o.start()
        rec(0, (), 0, out, state, 0.0)
    return {
        y: float(torch.logsumexp(torch.tensor(v, dtype=torch.float64), 0))
        for y, v in paths.items()
    }


@pytest.mark.parametrize("durations", [(0, 1, 2), (1, 3), (0, 2)])
@pytest.mark.parametrize("seed", [0, 1])
def test_wide_beam_equals_exhaustive_search(durations, seed):
    """A beam that prunes nothing returns every label sequence with its exact total
    probability; narrower beams never over-estimate it."""
    model = make_model(seed, durations=durations, vocab=3, blank_bias=0.0)
    enc, _ = enc_batch(seed, [4])
    exact = enumerate_paths(model, enc[0], max_sym=1)
    wide = core(model, TDTBeamSearch, beam_size=10**6, nbest=10**6, max_sym_per_frame=1)
    got = {tuple(h.labels): h.score for h in wide(enc[0])}
    assert set(got) == set(exact)
    for y, score in exact.items():
        assert got[y] == pytest.approx(score, rel=1e-5, abs=1e-5)
    for beam_size in (1, 2, 4):
        narrow = core(
            model, TDTBeamSearch, beam_size=beam_size, nbest=8, max_sym_per_frame=1
        )
        for h in narrow(enc[0]):
            assert h.score <= exact[tuple(h.labels)] + 1e-5


def reference_beam(model, enc, beam, max_sym, decision="symbol"):
    """The TDT beam search of docs/decoding.md written again, one hypothesis at a
    time (no search code). Returns [(labels, score, long blanks, frames skipped)]."""
    o = Oracle(model)
    T = enc.size(0)

    def insert(queue, h):
        old = queue.get(h["y"])
        if old is None:
            queue[h["y"]] = h
            return
        total = float(torch.logaddexp(torch.tensor(old["s"]), torch.tensor(h["s"])))
        if h["s"] > old["s"]:
            queue[h["y"]] = h
        queue[h["y"]]["s"] = total

    def moved(h, frames, blank):
        h = dict(h, n=0)
        h["skip"] += max(frames - 1, 0)
        h["big"] += int(blank and frames > 1)
        return h

    queues = [dict() for _ in range(T + 1)]
    with torch.no_grad():
        out, state = o.start()
        queues[0][()] = dict(y=(), s=0.0, out=out, st=state, n=0, big=0, skip=0)
        for t in range(T):
            current = sorted(queues[t].values(), key=lambda h: -h["s"])[:beam]
            while current:
                cands = []
                for a, h in enumerate(current):
                    arcs = o.arcs(enc[t], h["out"], h["n"], max_sym, T - t, decision)
                    for (k, j), lp in arcs.items():
                        cands.append((h["s"] + lp, a, k, j))
                cands = sorted(cands, key=lambda c: -c[0])[:beam]
                ahead = sorted((h["s"] for h in queues[t + 1].values()), reverse=True)
                floor = ahead[beam - 1] if len(ahead) >= beam else float("-inf")
                nxt = []
                for s, a, k, j in cands:
                    h = current[a]
                    frames = min(o.durations[j], T - t)
                    if k == o.blank:
                        insert(queues[t + frames], moved(dict(h, s=s), frames, True))
                        continue
                    if frames == 0 and s < floor:
                        continue
                    out, state = o.pred(k, h["st"])
                    child = dict(h, y=h["y"] + (k,), s=s, out=out, st=state)
                    if frames == 0:
                        child["n"] = h["n"] + 1
                        nxt.append(child)
                    else:
                        insert(queues[t + frames], moved(child, frames, False))
                current = nxt
    return [(h["y"], h["s"], h["big"], h["skip"]) for h in queues[T].values()]


@pytest.mark.parametrize("decision", ["symbol", "total"])
@pytest.mark.parametrize("durations", [DURS, (1, 2), (0, 3)])
@pytest.mark.parametrize("beam_size", [2, 3, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_small_beams_follow_the_documented_rule(durations, beam_size, seed, decision):
    """Exact n-best (labels, scores, long blanks, frames skipped) against the rule
    written again (per-frame top-B cut, B best arcs per expansion, staying labels
    below the B-th best hypothesis queued at t + 1 dropped, merging by log-add)."""
    model = make_model(seed, durations=durations, vocab=5, blank_bias=-0.5)
    enc, _ = enc_batch(seed + 40, [11])
    want = reference_beam(model, enc[0], beam_size, max_sym=2, decision=decision)
    got = core(
        model,
        TDTBeamSearch,
        beam_size=beam_size,
        nbest=1000,
        max_sym_per_frame=2,
        blank_decision=decision,
    )(enc[0])
    want.sort(key=lambda w: -w[1])
    assert len(want) > 1
    assert [tuple(h.labels) for h in got] == [w[0] for w in want]
    for h, (_, score, big, skip) in zip(got, want):
        assert h.score == pytest.approx(score, rel=1e-6, abs=1e-6)
        assert (h.big_blank_emissions, h.frames_skipped) == (big, skip)


@pytest.mark.parametrize("seed", range(3))
def test_beam_score_not_below_greedy(seed):
    model = make_model(seed, blank_bias=0.0)
    # scores of path log-probabilities on both sides
    greedy = core(model, TDTGreedySearch, blank_decision="symbol")
    enc, lens = enc_batch(100 + seed, [25, 12])
    for beam_size in (2, 4, 8):
        beam = core(model, TDTBeamSearch, beam_size=beam_size)
        for b, T in enumerate(lens.tolist()):
            g = greedy.search_one(enc[b, :T])
            (h,) = beam(enc[b, :T])
            assert h.frame == T and h.score >= g.score - 1e-6


def test_score_norm_and_nbest():
    differ = 0
    for seed in range(6):
        model = make_model(seed, blank_bias=1.0)
        enc, _ = enc_batch(9 + seed, [14])
        plain = core(model, TDTBeamSearch, beam_size=4, nbest=100)(enc[0])
        normed = core(model, TDTBeamSearch, beam_size=4, nbest=100, score_norm=True)
        want = sorted(plain, key=lambda h: h.score / len(h.yseq), reverse=True)
        got = normed(enc[0])
        assert [(h.yseq, h.score) for h in got] == [(h.yseq, h.score) for h in want]
        differ += [h.yseq for h in want] != [h.yseq for h in plain]
        scores = [h.score for h in plain]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.yseq) for h in plain}) == len(plain)
    assert differ  # the cases tell the two rankings apart


# ------------------------------------------------------------------- the factory


def test_factory_builds_tdt_searches_and_maps_search_types():
    model = make_model(0, blank=2)
    lattice = lattice_from_model(model)
    assert lattice == TDTLattice(2, DURS)
    for st, beam_size, cls in (
        ("tdt_greedy", 1, TDTGreedySearch),
        ("greedy", 1, TDTGreedySearch),
        ("mbg", 1, TDTGreedySearch),
        ("mb_greedy", 4, TDTGreedySearch),
        ("default", 1, TDTGreedySearch),
        ("tdt_beam", 4, TDTBeamSearch),
        ("default", 4, TDTBeamSearch),
        ("mb_beam", 4, TDTBeamSearch),
    ):
        search = build_transducer_search(model, search_type=st, beam_size=beam_size)
        assert type(search) is cls, st
        assert search.blank_id == 2 and model.decoder.blank_id == 2
        assert search.stepper.vocab_size == 6 + len(DURS)
    for st in ("tsd", "alsd", "nsc", "maes"):
        with pytest.raises(ValueError, match="tdt_greedy or tdt_beam"):
            build_transducer_search(model, search_type=st, beam_size=2)
    with pytest.raises(ValueError, match="u_max"):
        build_transducer_search(model, search_type="tdt_beam", beam_size=2, u_max=3)
    search = build_transducer_search(
        model, search_type="tdt_beam", beam_size=3, max_sym_per_frame=2, nbest=2
    )
    assert (search.beam_size, search.max_sym_per_frame, search.nbest) == (3, 2, 2)


def test_tdt_search_types_refused_on_other_models():
    assert resolve_search_type("tdt_greedy", 1, False, tdt=True) == "tdt_greedy"
    for multiblank in (True, False):
        for st in ("tdt_greedy", "tdt_beam"):
            with pytest.raises(ValueError, match="not one: use mb_greedy or mb_beam"):
                resolve_search_type(st, 4, multiblank)
    mb = make_model(0)
    mb.tdt_durations = ()
    mb.big_blank_durations = (2,)
    mb.blank_id = 1
    with pytest.raises(ValueError, match="transducer_tdt_durations"):
        build_transducer_search(mb, search_type="tdt_greedy")


def test_searches_refuse_the_other_lattice():
    model = make_model(0)
    stepper = JointStepper(model.decoder, model.joint_network, 6 + len(DURS))
    with pytest.raises(TypeError, match="TDTLattice for TDTGreedySearch"):
        TDTGreedySearch(stepper, MultiblankLattice.create(0))
    with pytest.raises(TypeError, match="TDTLattice for TDTBeamSearch"):
        TDTBeamSearch(stepper, MultiblankLattice.create(0))
    with pytest.raises(TypeError, match="MultiblankLattice for MultiblankGreedy"):
        MultiblankGreedySearch(stepper, TDTLattice.create(0, DURS))
    with pytest.raises(TypeError, match="MultiblankLattice for MultiblankBeam"):
        MultiblankBeamSearch(stepper, TDTLattice.create(0, DURS))
    # the joint's output size must be V + D with the blank among the V tokens
    with pytest.raises(ValueError, match=r"stepper\.vocab_size = 5 must be V \+ D"):
        TDTGreedySearch(
            JointStepper(model.decoder, model.joint_network, 5),
            TDTLattice.create(0, DURS),
        )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    model = make_model(1)
    enc, lens = enc_batch(7, [20, 9, 14])
    want_g = core(model, TDTGreedySearch).search_batch(enc, lens)
    beam = core(model, TDTBeamSearch, beam_size=4)
    want_b = [beam(enc[b, :T])[0] for b, T in enumerate(lens.tolist())]
    model.decoder.cuda()
    model.joint_network.cuda()
    greedy = core(model, TDTGreedySearch)
    got_g = greedy.search_batch(enc.cuda(), lens.cuda())
    beam = core(model, TDTBeamSearch, beam_size=4)
    for b, T in enumerate(lens.tolist()):
        assert got_g[b].yseq == want_g[b].yseq
        assert greedy.search_one(enc[b, :T].cuda()).yseq == want_g[b].yseq
        assert beam(enc[b, :T].cuda())[0].yseq == want_b[b].yseq
