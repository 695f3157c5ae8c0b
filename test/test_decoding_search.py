"""Greedy (batched and single) and beam searches of every lattice (standard,
multi-blank, TDT) on tiny random models, then the multi-blank lattice's own rules.

The test bodies that hold for every lattice take a ``lattice`` record
(``helpers/search_cases.py``): its tiny model, its searches and its references,
written one hypothesis at a time with the networks called directly
(``helpers/search_oracles.py``, the rules of docs/decoding.md). The TDT's own rules
(durations, labels that move, the end rules) are in test_tdt_search.py.
"""

import math
from types import SimpleNamespace

import pytest
import search_cases as sc
import torch
from search_cases import enc_batch  # noqa: F401  (also used by test_decoding_lm)
from search_oracles import brute_force_sequences  # noqa: F401  (test_decoding_lm)
from search_oracles import mb_reference_greedy as reference_greedy  # noqa: F401

import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)

# isort: split
from espnet2.asr.decoder.transducer_decoder import TransducerDecoder
from espnet2.asr.transducer.beam_search_transducer import BeamSearchTransducer
from espnet2.asr_transducer.joint_network import JointNetwork

from espnet_multiblank.decoding import GreedySearch, JointStepper
from espnet_multiblank.espnet.inference.search import (
    build_transducer_search,
    lattice_from_model,
    resolve_search_type,
)

V = sc.MB_V
D_ENC = sc.D_ENC
DURS = sc.MB_DURS
BLANK = sc.MB_BLANK  # <blank8>, <blank4>, <blank2>, <blank>, labels 4..9
#: the multi-blank model maker (also used by test_decoding_lm)
make_model = sc.make_mb_model
#: TDT duration sets: with 0 and 1, without 0, without 1, unsorted, the recipe's
TDT_SETS = [sc.TDT_DURS, (1, 2, 4), (0, 2, 3), (3, 0, 1, 2), tuple(range(9))]
pytestmark = pytest.mark.timeout(600)  # a search that never ends fails, not hangs


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: threads only add overhead (shared CPUs)
    yield
    torch.set_num_threads(n)


class CountingStepper(JointStepper):
    """JointStepper that records the rows of every joint-network evaluation."""

    def __init__(self, *args):
        super().__init__(*args)
        self.rows = []

    def joint(self, enc_proj, dec_proj):
        self.rows.append(enc_proj.size(0))
        return super().joint(enc_proj, dec_proj)


# ------------------------------------------------------- every lattice: greedy search


@pytest.mark.parametrize(
    "lattice",
    sc.params(sc.standard(), sc.multiblank())
    + sc.params(*(sc.tdt(d, blank=1) for d in TDT_SETS)),
)
@pytest.mark.parametrize("seed", [0, 1])
def test_batched_greedy_equals_one_at_a_time(lattice, seed):
    model = lattice.model(seed)
    search = lattice.greedy(model, max_sym_per_frame=3)
    assert type(search) is lattice.greedy_class
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
        # ESPnet interface
        assert search(enc[b, :T])[0].yseq == one.yseq


@pytest.mark.parametrize("lattice", sc.params(sc.multiblank(blank_bias=0.5), sc.tdt()))
@pytest.mark.parametrize("decision", ["total", "symbol"])
def test_the_fixture_exercises_every_kind_of_arc(lattice, decision):
    """The fixture model really exercises labels, long (big) blanks and standard
    blanks, and, in a TDT, labels that move."""
    model = lattice.model(0)
    search = lattice.greedy(model, blank_decision=decision)
    enc, lens = enc_batch(0, [40] * 6)
    hyps = search.search_batch(enc, lens)
    assert sum(len(h.labels) for h in hyps) > 10
    assert sum(h.big_blank_emissions for h in hyps) > 0
    if lattice.is_tdt:  # frames skipped by labels too
        assert sum(h.frames_skipped for h in hyps) > sum(
            h.big_blank_emissions for h in hyps
        )
    for h in hyps:  # never a blank in the output
        assert h.yseq[0] == lattice.blank
        assert not set(h.labels) & set(lattice.lattice.blank_ids)


@pytest.mark.parametrize("lattice", sc.params(sc.multiblank(blank_bias=0.5), sc.tdt()))
def test_the_decisions_differ_on_the_fixture(lattice):
    """The two blank decisions give different hypotheses here: the test below can
    tell them apart (on a standard lattice, with one blank, they are the same)."""
    model = lattice.model(0)
    enc, lens = enc_batch(0, [40] * 4)
    hyps = {
        d: [
            h.yseq
            for h in lattice.greedy(model, blank_decision=d).search_batch(enc, lens)
        ]
        for d in ("total", "symbol")
    }
    assert hyps["total"] != hyps["symbol"]


def _greedy_reference_params():
    """(lattice, seed): the TDT duration sets with the blank at 0, 1 or 2."""
    out = [(sc.standard(blank_bias=1.0), s) for s in (0, 1)]
    for bias in (0.0, 1.0):
        out += [(sc.multiblank(blank_bias=bias), s) for s in (0, 1, 2)]
    for i, durations in enumerate(TDT_SETS):
        out += [(sc.tdt(durations, blank=i % 3), s) for s in (0, 1)]
    return [pytest.param(*p, id=f"{p[0].id}-seed{p[1]}") for p in out]


@pytest.mark.parametrize("lattice, seed", _greedy_reference_params())
@pytest.mark.parametrize("decision", ["total", "symbol"])
def test_greedy_follows_the_documented_rule(lattice, seed, decision):
    """Both blank decisions, one utterance and batched, against the reference."""
    model = lattice.model(seed)
    search = lattice.greedy(model, max_sym_per_frame=2, blank_decision=decision)
    lens = [21, 33, 7, 2, 1]
    enc, enc_lens = enc_batch(seed + 60, lens)
    batch = search.search_batch(enc, enc_lens)
    for b, T in enumerate(lens):
        labels, score, skipped, long_blanks = lattice.reference_greedy(
            model, enc[b, :T], max_sym=2, decision=decision
        )
        for got in (search.search_one(enc[b, :T]), batch[b]):
            assert got.yseq == [lattice.blank] + labels
            assert got.score == pytest.approx(score, rel=1e-5, abs=1e-4)
            assert (got.frames_skipped, got.big_blank_emissions) == (
                skipped,
                long_blanks,
            )
            assert got.frame == T


# --------------------------------------------------------- every lattice: beam search


@pytest.mark.parametrize(
    "lattice",
    sc.params(
        sc.standard(blank=1, blank_bias=0.5),
        sc.multiblank(blank_bias=0.5),
        sc.multiblank((3,), blank_bias=0.5),
    )
    + sc.params(*(sc.tdt(d) for d in (sc.TDT_DURS, (1, 2, 4), (0, 2, 3)))),
)
@pytest.mark.parametrize("decision", ["total", "symbol"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_size_one_equals_greedy(lattice, seed, decision):
    model = lattice.model(seed)
    greedy = lattice.greedy(model, max_sym_per_frame=2, blank_decision=decision)
    beam1 = lattice.beam(model, 1, max_sym_per_frame=2, blank_decision=decision)
    assert type(beam1) is lattice.beam_class
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


def _beam_vs_greedy_params():
    """(lattice, seed, decision): the TDT with its beam search's default decision
    ("symbol": path log-probabilities on both sides)."""
    out = []
    for lattice in (
        sc.multiblank(blank_bias=2.0),
        sc.multiblank(blank_bias=0.5),  # greedy emits labels
    ):
        out += [(lattice, s, d) for s in range(4) for d in ("total", "symbol")]
    out += [(sc.tdt(blank_bias=0.0), s, "symbol") for s in range(3)]
    return [pytest.param(*p, id=f"{p[0].id}-seed{p[1]}-{p[2]}") for p in out]


@pytest.mark.parametrize("lattice, seed, decision", _beam_vs_greedy_params())
def test_beam_score_not_below_greedy(lattice, seed, decision):
    """Same blank decision (the scores mean the same then)."""
    model = lattice.model(seed)
    greedy = lattice.greedy(model, blank_decision=decision)
    enc, lens = enc_batch(100 + seed, [25, 12])
    for beam_size in (2, 4, 8):
        beam = lattice.beam(model, beam_size, blank_decision=decision)
        for b, T in enumerate(lens.tolist()):
            g = greedy.search_one(enc[b, :T])
            (h,) = beam(enc[b, :T])
            assert h.frame == T
            assert h.score >= g.score - 1e-6


def _exhaustive_params():
    """(lattice, seed, max_sym, T): T small enough to enumerate every path."""
    mb = sc.multiblank((2,), blank=1, vocab=4, blank_bias=0.0)
    out = [(mb, seed, 1, 5) for seed in range(3)]
    out += [(mb, seed, 2, 3) for seed in range(3)]
    for durations in [(0, 1, 2), (1, 3), (0, 2)]:
        lattice = sc.tdt(durations, vocab=3, blank_bias=0.0)
        out += [(lattice, seed, 1, 4) for seed in range(2)]
    return [
        pytest.param(*p, id=f"{p[0].id}-seed{p[1]}-max_sym{p[2]}-T{p[3]}") for p in out
    ]


@pytest.mark.parametrize("lattice, seed, max_sym, T", _exhaustive_params())
def test_wide_beam_equals_exhaustive_search(lattice, seed, max_sym, T):
    """A beam that prunes nothing returns every label sequence with its exact total
    probability (all alignments merged), best first; narrower beams never
    over-estimate it."""
    model = lattice.model(seed)
    enc, _ = enc_batch(seed, [T])
    exact = lattice.exhaustive(model, enc[0], max_sym)
    wide = lattice.beam(
        model,
        100000,
        nbest=100000,
        max_sym_per_frame=max_sym,
        blank_decision="symbol",
    )
    hyps = wide(enc[0])
    got = {tuple(h.labels): h.score for h in hyps}
    assert set(got) == set(exact)
    for y, score in exact.items():
        assert got[y] == pytest.approx(score, rel=1e-5, abs=1e-5)
    assert tuple(hyps[0].labels) == max(exact, key=exact.get)
    for beam_size in (1, 2, 4):
        narrow = lattice.beam(
            model,
            beam_size,
            nbest=8,
            max_sym_per_frame=max_sym,
            blank_decision="symbol",
        )
        for h in narrow(enc[0]):
            assert h.score <= exact[tuple(h.labels)] + 1e-5


def _small_beam_params():
    """(lattice, beam_size, seed): labels and blanks compete (wide n-best lists)."""
    out = []
    for lattice in (
        sc.multiblank((2, 4), blank=2, vocab=6, blank_bias=0.5),
        sc.multiblank((3,), blank=2, vocab=6, blank_bias=0.5),
        sc.standard(vocab=6, blank_bias=0.5),
    ):
        out += [(lattice, b, s) for b in (1, 2, 3, 4) for s in (0, 1, 2)]
    for durations in (sc.TDT_DURS, (1, 2), (0, 3)):
        lattice = sc.tdt(durations, vocab=5, blank_bias=-0.5)
        out += [(lattice, b, s) for b in (2, 3, 4) for s in (0, 1)]
    return [pytest.param(*p, id=f"{p[0].id}-beam{p[1]}-seed{p[2]}") for p in out]


@pytest.mark.parametrize("lattice, beam_size, seed", _small_beam_params())
@pytest.mark.parametrize("decision", ["total", "symbol"])
def test_small_beams_follow_the_documented_rule(lattice, beam_size, seed, decision):
    """Exact n-best (labels, scores, long blanks, frames skipped) and the number of
    hypotheses expanded at every step, against an independent implementation of the
    documented rule (per-frame top-B cut, B best candidates per expansion, labels
    that stay below the B-th best hypothesis queued at t + 1 dropped, merging by
    log-add)."""
    model = lattice.model(seed)
    enc, _ = enc_batch(seed + 40, [11])
    want, want_expansions = lattice.reference_beam(
        model, enc[0], beam_size, max_sym=2, decision=decision
    )
    stepper = CountingStepper(
        model.decoder, model.joint_network, lattice.joint_size(model)
    )
    search = lattice.core_beam(
        model,
        stepper,
        beam_size=beam_size,
        nbest=1000,
        max_sym_per_frame=2,
        blank_decision=decision,
    )
    got = search(enc[0])
    assert stepper.rows == want_expansions
    want.sort(key=lambda w: -w[1])
    assert len(want) > 1 or beam_size == 1
    assert [tuple(h.labels) for h in got] == [w[0] for w in want]
    for h, (_, score, big, skip) in zip(got, want):
        assert h.score == pytest.approx(score, rel=1e-6, abs=1e-6)
        assert (h.big_blank_emissions, h.frames_skipped) == (big, skip)


@pytest.mark.parametrize(
    "lattice", sc.params(sc.multiblank(blank_bias=0.0), sc.tdt(blank_bias=1.0))
)
@pytest.mark.parametrize("how", ["core", "transducer_conf"])
def test_score_norm_ranks_by_score_per_symbol(lattice, how):
    """score_norm: the final n-best is ordered by score / len(yseq) (in the search and
    when set through transducer_conf); the hypotheses themselves do not change, and
    nbest cuts the normalised list."""
    differ = 0
    for seed in range(6):
        model = lattice.model(seed)
        enc, _ = enc_batch(9 + seed, [14])
        plain = lattice.core_beam(model, beam_size=4, nbest=100)(enc[0])
        if how == "core":
            normed = lattice.core_beam(model, beam_size=4, nbest=100, score_norm=True)
        else:
            normed = lattice.beam(model, 4, nbest=100, score_norm=True)
        want = sorted(plain, key=lambda h: h.score / len(h.yseq), reverse=True)
        got = normed(enc[0])
        assert [(h.yseq, h.score) for h in got] == [(h.yseq, h.score) for h in want]
        differ += [h.yseq for h in want] != [h.yseq for h in plain]
        normed.nbest = 2
        assert [h.yseq for h in normed(enc[0])] == [h.yseq for h in want[:2]]
    assert differ  # the cases tell the two rankings apart


@pytest.mark.parametrize("lattice", sc.params(sc.multiblank(), sc.tdt()))
def test_nbest_sorted_and_distinct(lattice):
    model = lattice.model(1)
    enc, _ = enc_batch(1, [20])
    for nbest in (4, 100):
        hyps = lattice.beam(model, 6, nbest=nbest)(enc[0])
        assert 1 <= len(hyps) <= nbest
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.yseq) for h in hyps}) == len(hyps)


# -------------------------------------------------------- every lattice: the factory


def _factory_types(lattice):
    """(search type, beam size, the search it builds) on a multi-blank or TDT model:
    ESPnet's types and the other lattice's are mapped on the lattice's own."""
    greedy, beam = lattice.greedy_class, lattice.beam_class
    return [
        (lattice.greedy_type, 1, greedy),
        ("greedy", 1, greedy),
        ("greedy", 2, greedy),
        ("mbg", 1, greedy),
        ("mb_greedy", 4, greedy),
        ("default", 1, greedy),
        (lattice.beam_type, 4, beam),
        ("default", 4, beam),
        ("mb_beam", 2, beam),
    ]


@pytest.mark.parametrize("lattice", sc.params(sc.multiblank(), sc.tdt(blank=2)))
def test_factory_builds_the_lattice_searches(lattice):
    """ESPnet builds the decoder with blank_id = embed_pad = 0 (<blank8> of the
    multi-blank model, a label of this TDT): every search type maps on the lattice's
    search, with the decoder's blank fixed before it runs; ESPnet's searches that do
    not know the lattice, keys the search does not take and an LM without its token
    list are refused."""
    model = lattice.model(0)
    assert model.decoder.blank_id == 0  # ESPnet's defect, before any search is built
    assert lattice_from_model(model) == lattice.lattice
    for st, beam_size, cls in _factory_types(lattice):
        search = build_transducer_search(model, search_type=st, beam_size=beam_size)
        assert type(search) is cls, (st, beam_size)
        assert search.blank_id == lattice.blank == model.decoder.blank_id
        assert set(search.lattice.blank_ids) == lattice.blank_ids
        assert search.stepper.vocab_size == lattice.joint_size(model)
    # every hypothesis starts with the blank and holds no blank
    enc, lens = enc_batch(0, [12, 6])
    for h in lattice.greedy(model).search_batch(enc, lens):
        assert h.yseq[0] == lattice.blank and not set(h.labels) & lattice.blank_ids
    refused = "tdt_greedy or tdt_beam" if lattice.is_tdt else "big blanks"
    for st in ("tsd", "alsd", "nsc", "maes"):
        with pytest.raises(ValueError, match=refused):
            build_transducer_search(model, search_type=st, beam_size=2)
    with pytest.raises(ValueError, match="u_max"):
        lattice.beam(model, 2, u_max=5)
    # LM fusion maps tokens by their text: an LM without its token list is refused
    with pytest.raises(ValueError, match="lm_train_config"):
        lattice.greedy(model, lm=object())
    search = lattice.beam(model, 3, max_sym_per_frame=2, nbest=2)
    assert (search.beam_size, search.max_sym_per_frame, search.nbest) == (3, 2, 2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("lattice", sc.params(sc.multiblank(), sc.tdt()))
def test_cuda_matches_cpu(lattice):
    model = lattice.model(1)
    enc, lens = enc_batch(7, [20, 9, 14])
    want_g = lattice.greedy(model).search_batch(enc, lens)
    beam = lattice.beam(model, 4)
    want_b = [beam(enc[b, :T])[0] for b, T in enumerate(lens.tolist())]
    model.decoder.cuda()
    model.joint_network.cuda()
    greedy = lattice.greedy(model)
    got_g = greedy.search_batch(enc.cuda(), lens.cuda())
    beam = lattice.beam(model, 4)
    for b, T in enumerate(lens.tolist()):
        assert got_g[b].yseq == want_g[b].yseq
        assert greedy.search_one(enc[b, :T].cuda()).yseq == want_g[b].yseq
        assert beam(enc[b, :T].cuda())[0].yseq == want_b[b].yseq


# ---------------------------------------------------- the multi-blank lattice's rules


def test_max_symbols_per_frame_guard():
    """A joint that always prefers a label still terminates: blank forced after n."""
    model = make_model(0, blank_bias=-20.0)
    search = build_transducer_search(
        model, search_type="mb_greedy", max_sym_per_frame=3
    )
    enc, lens = enc_batch(0, [7, 4])
    for hyp in search.search_batch(enc, lens):
        blank_emissions = hyp.frame - hyp.frames_skipped
        assert len(hyp.yseq) - 1 == 3 * blank_emissions
    beam = build_transducer_search(
        model, search_type="mb_beam", beam_size=3, max_sym_per_frame=2
    )
    (h,) = beam(enc[1, :4])
    assert len(h.yseq) - 1 == 2 * (4 - h.frames_skipped)


def always_big_blank_model(d_index, durations=DURS):
    """A joint whose output ignores its input: big blank ``d_index`` first, then the
    next-longer-fitting blanks (bias order: chosen big blank > shorter ones > blank)."""
    model = make_model(0, durations=durations)
    joint = model.joint_network
    with torch.no_grad():
        joint.lin_out.weight.zero_()
        joint.lin_out.bias.fill_(-5.0)
        for i, d in enumerate(durations):
            joint.lin_out.bias[BLANK - 1 - i] = 1.0 + (d if i <= d_index else -d)
        joint.lin_out.bias[BLANK] = 0.5
    return model


@pytest.mark.parametrize("blank_decision", ["total", "symbol"])
@pytest.mark.parametrize("T", [1, 7, 8, 16, 21])
def test_big_blank_advances_by_its_duration(T, blank_decision):
    model = always_big_blank_model(1)  # prefers <blank4>, then <blank2>, then <blank>
    enc, lens = enc_batch(3, [T])
    # expected path: as many 4s as fit, then a 2 if it fits, then 1s
    steps, t, exp_big, exp_skip = [], 0, 0, 0
    while t < T:
        d = 4 if t + 4 <= T else (2 if t + 2 <= T else 1)
        steps.append(d)
        t += d
        if d > 1:
            exp_big += 1
            exp_skip += d - 1
    assert exp_skip == T - len(steps)
    for search in (
        build_transducer_search(
            model, search_type="mb_greedy", blank_decision=blank_decision
        ),
        build_transducer_search(
            model, search_type="mb_beam", beam_size=4, blank_decision=blank_decision
        ),
    ):
        if isinstance(search, GreedySearch):
            (h,) = search.search_batch(enc, lens)
        else:
            (h,) = search(enc[0])
        assert h.yseq == [BLANK]
        assert h.frame == T
        assert h.big_blank_emissions == exp_big
        assert h.frames_skipped == exp_skip
        # score = sum of the chosen blanks' log-probs along that path ("symbol"), or
        # of the total log-probability of the blanks that fit at each step ("total")
        logp = torch.log_softmax(model.joint_network.lin_out.bias.detach(), dim=-1)
        sym = {1: BLANK, 2: BLANK - 1, 4: BLANK - 2, 8: BLANK - 3}
        t, expected = 0, 0.0
        for d in steps:
            fits = [sym[e] for e in (1, 2, 4, 8) if t + e <= T]
            step = float(logp[sym[d]])
            if blank_decision == "total":
                step = float(torch.logsumexp(logp[fits], 0))
            expected += step
            t += d
        if isinstance(search, GreedySearch):
            assert math.isclose(h.score, expected, rel_tol=1e-5)
        else:  # beam merges alignments of the same (empty) label sequence
            assert h.score >= expected - 1e-5


def test_big_blank_never_overshoots():
    model = always_big_blank_model(2)  # prefers <blank8>
    search = build_transducer_search(model, search_type="mb_greedy")
    enc, lens = enc_batch(0, [5, 8, 13])
    for h, T in zip(search.search_batch(enc, lens), lens.tolist()):
        assert h.frame == T


def test_beam_merges_alignments_exactly():
    """With a beam wide enough to keep everything, the score of the empty label
    sequence is the total probability of all its blank alignments."""
    durations = (2, 3)
    lattice = sc.multiblank(durations, blank=2, vocab=4)
    model = lattice.model(5)
    with torch.no_grad():
        model.joint_network.lin_out.weight.zero_()  # context-free probabilities
    T = 6
    enc, _ = enc_batch(0, [T])
    search = lattice.core_beam(model, beam_size=50, nbest=50, blank_decision="symbol")
    hyps = search(enc[0])
    empty = [h for h in hyps if h.yseq == [2]][0]
    logp = torch.log_softmax(model.joint_network.lin_out.bias.detach().double(), -1)
    # alignments of the empty sequence: compositions of T into parts {1, 2, 3}
    total = torch.full((T + 1,), float("-inf"), dtype=torch.float64)
    total[0] = 0.0
    for t in range(1, T + 1):
        terms = [total[t - 1] + logp[2]]
        terms += [
            total[t - d] + logp[2 - 1 - i] for i, d in enumerate(durations) if t >= d
        ]
        total[t] = torch.logsumexp(torch.stack(terms), 0)
    assert math.isclose(empty.score, float(total[T]), rel_tol=1e-5)


def test_search_type_resolution():
    assert resolve_search_type("greedy", 1, True) == "mb_greedy"
    assert resolve_search_type("default", 1, True) == "mb_greedy"
    assert resolve_search_type("default", 4, True) == "mb_beam"
    assert resolve_search_type("mbg", 1, False) == "mb_greedy"
    assert resolve_search_type("default", 4, False) == "default"
    assert resolve_search_type("mb_beam", 4, False) == "mb_beam"
    with pytest.raises(ValueError, match="unknown"):
        resolve_search_type("beam", 4, False)


def test_standard_model_uses_espnet_search_with_its_blank():
    model = make_model(2, blank_id=0, durations=())
    search = build_transducer_search(model, search_type="greedy")
    assert isinstance(search, BeamSearchTransducer)
    assert search.blank_id == 0 and search.beam_size == 1
    # ESPnet's greedy emits at most one label per frame: same labels as ours with
    # max_sym_per_frame=1 (independent implementations)
    ours = build_transducer_search(model, search_type="mb_greedy", max_sym_per_frame=1)
    enc, _ = enc_batch(4, [30])
    with torch.no_grad():  # ESPnet's searches rely on Speech2Text's no_grad
        assert search(enc[0])[0].yseq == ours(enc[0])[0].yseq
        beam = build_transducer_search(model, search_type="default", beam_size=3)
        assert isinstance(beam, BeamSearchTransducer) and beam.blank_id == 0
        assert beam(enc[0])[0].yseq[0] == 0


def test_standard_model_blank_not_first():
    """Blank at index 2: the decoder (pad 0) is fixed, ESPnet's greedy uses it, and
    ESPnet's beam searches (which hard-code blank 0) are refused."""
    model = make_model(3, blank_id=2, durations=())
    search = build_transducer_search(model, search_type="greedy")
    assert model.decoder.blank_id == 2 and search.blank_id == 2
    enc, _ = enc_batch(5, [15])
    with torch.no_grad():
        hyp = search(enc[0])[0]
    assert hyp.yseq[0] == 2 and 2 not in hyp.yseq[1:]
    with pytest.raises(ValueError, match="index 0"):
        build_transducer_search(model, search_type="default", beam_size=4)
    mb = build_transducer_search(model, search_type="mb_beam", beam_size=4)
    assert mb(enc[0])[0].yseq[0] == 2


def test_lattice_from_espnet_multiblank_model_and_validation():
    model = make_model(0)
    del model.big_blank_durations
    model.transducer_multi_blank_durations = [2, 4, 8]  # ESPnet's own attribute
    lat = lattice_from_model(model)
    assert lat.big_blank_durations == DURS and lat.big_blank_ids == (2, 1, 0)
    assert lat.blank_ids == (3, 2, 1, 0)
    assert [lat.frames(k) for k in range(5)] == [8, 4, 2, 1, 0]
    model.blank_id = 1
    with pytest.raises(ValueError, match=r"model\.blank_id must be >= len\(model\.big"):
        lattice_from_model(model)
    model.blank_id, model.transducer_multi_blank_durations = 3, [1]
    with pytest.raises(ValueError, match=r"model\.big_blank_durations must .*>= 2"):
        lattice_from_model(model)
    model.transducer_multi_blank_durations = [2, 2]
    with pytest.raises(ValueError, match="distinct"):
        lattice_from_model(model)


@pytest.mark.parametrize("rnn_type", ["lstm", "gru"])
@pytest.mark.parametrize("num_layers", [1, 2])
def test_fused_cell_step_equals_decoder_rnn_forward(rnn_type, num_layers):
    """The searches' one-label step (torch.lstm_cell / gru_cell per layer) gives the
    decoder's own rnn_forward outputs and states, layer by layer."""
    torch.manual_seed(0)
    decoder = TransducerDecoder(
        V, rnn_type=rnn_type, num_layers=num_layers, hidden_size=12, dropout=0.3
    ).eval()
    joint = JointNetwork(V, D_ENC, 12, joint_space_size=12).eval()
    stepper = JointStepper(decoder, joint)
    assert stepper.cells is not None
    labels = torch.tensor([4, 0, 9])
    h = torch.randn(num_layers, 3, 12)
    state = (h, torch.randn_like(h) if rnn_type == "lstm" else None)
    with torch.no_grad():
        fast_proj, fast_state = stepper.step(labels, state)
        emb = decoder.embed(labels.view(-1, 1))
        ref_out, ref_state = decoder.rnn_forward(emb, state)
        ref_proj = joint.lin_dec(ref_out[:, 0])
    torch.testing.assert_close(fast_proj, ref_proj, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fast_state[0], ref_state[0], rtol=1e-5, atol=1e-6)
    if rnn_type == "lstm":
        torch.testing.assert_close(fast_state[1], ref_state[1], rtol=1e-5, atol=1e-6)
    else:
        assert fast_state[1] is None


def test_cell_step_not_used_for_other_decoders_or_training():
    """Anything but TransducerDecoder's one-layer cells, and training mode (dropout is
    active there), goes through the decoder's own rnn_forward."""
    from espnet_multiblank.decoding.stepper import rnn_cells

    assert rnn_cells(SimpleNamespace(embed=None)) is None
    decoder = TransducerDecoder(V, hidden_size=12, dropout=0.5)
    decoder.decoder[0] = torch.nn.LSTM(12, 12, 1, batch_first=True, bias=False)
    assert rnn_cells(decoder) is None
    decoder = TransducerDecoder(V, hidden_size=12, dropout_embed=0.9).train()
    stepper = JointStepper(decoder, JointNetwork(V, D_ENC, 12, joint_space_size=12))
    calls = []
    original = decoder.rnn_forward
    decoder.rnn_forward = lambda *a: calls.append(1) or original(*a)
    stepper.step(torch.tensor([1]), decoder.init_state(1))
    assert calls == [1]


def joint_stepper(seed, activation, dtype):
    """(ESPnet's JointNetwork with ``activation``, a JointStepper on it), in
    ``dtype``."""
    torch.manual_seed(seed)
    decoder = TransducerDecoder(V, hidden_size=12).eval()
    joint = JointNetwork(
        V, D_ENC, 12, joint_space_size=24, joint_activation_type=activation
    ).eval()
    decoder.to(dtype)
    joint.to(dtype)
    return joint, JointStepper(decoder, joint)


@pytest.mark.parametrize("activation", ["tanh", "relu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_joint_many_equals_the_joint_network(activation, dtype):
    """The label rule's wide joint call (tanh as 2 sigmoid(2x) - 1 on float32 CPU
    tensors) gives ESPnet's JointNetwork's logits, large pre-activations included;
    other activations and dtypes go through the network itself, bit for bit."""
    joint, stepper = joint_stepper(0, activation, dtype)
    enc = stepper.project_enc(4 * torch.randn(5, 30, D_ENC, dtype=dtype))
    dec = joint.lin_dec(torch.randn(5, 1, 12, dtype=dtype))
    with torch.no_grad():
        got = stepper.joint_many(enc, dec)
        want = joint(enc, dec, no_projection=True)
    assert got.shape == (5, 30, V) and got.dtype == dtype
    if activation == "tanh" and dtype == torch.float32:
        assert not torch.equal(got, want)  # the fast path ran
        torch.testing.assert_close(got, want, rtol=0, atol=2e-6)
        assert float(enc.abs().max()) > 5  # saturated units covered
    else:
        assert torch.equal(got, want)


@pytest.mark.parametrize("activation", ["tanh", "relu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_joint_equals_the_joint_network_bit_for_bit(activation, dtype):
    """The one-row joint call skips ESPnet's module calls for its tanh joint network
    (the same ops, the same numbers); a forward hook on any of its modules, or
    another activation, sends it through the network (the hook sees the call)."""
    joint, stepper = joint_stepper(1, activation, dtype)
    assert stepper.plain_tanh == (activation == "tanh")
    enc = stepper.project_enc(4 * torch.randn(3, D_ENC, dtype=dtype))
    dec = joint.lin_dec(torch.randn(3, 12, dtype=dtype))
    seen = []
    with torch.no_grad():
        assert torch.equal(stepper.joint(enc, dec), joint(enc, dec, no_projection=True))
        for module in (joint, joint.joint_activation, joint.lin_out):
            handle = module.register_forward_hook(lambda *a: seen.append(1))
            assert torch.equal(
                stepper.joint(enc, dec), joint(enc, dec, no_projection=True)
            )
            handle.remove()
    assert len(seen) == 6  # each hook saw the stepper's call and the reference's
