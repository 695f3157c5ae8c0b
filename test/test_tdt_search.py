"""The TDT lattice's own search rules on tiny random models: blanks and labels that
move by their durations, the end of the utterance, the label guard, duration sets
without 1, and the search types a TDT takes.

The tests that hold for every lattice (batched greedy, the reference greedy and beam
rules, beam size 1, exhaustive search, score_norm, the factory) run on TDTs too in
test_decoding_search.py; the references are in ``helpers/search_oracles.py``
(docs/decoding.md, "TDT searches").
"""

import math

import pytest
import search_cases as sc
import torch
from search_cases import enc_batch  # noqa: F401  (also used by test_decoding_lm)
from search_oracles import enumerate_paths  # noqa: F401  (test_decoding_lm)
from search_oracles import tdt_reference_greedy as reference_greedy

import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)

# isort: split
from espnet_multiblank.decoding import (
    BeamSearch,
    GreedySearch,
    JointStepper,
    LabelLoopingGreedySearch,
)
from espnet_multiblank.espnet.inference.search import (
    build_transducer_search,
    resolve_search_type,
)
from espnet_multiblank.lattice import MultiblankLattice, TDTLattice

DURS = sc.TDT_DURS
#: the TDT model maker (also used by test_decoding_lm)
make_model = sc.make_tdt_model
pytestmark = pytest.mark.timeout(600)  # a search that never ends fails, not hangs


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: threads only add overhead (shared CPUs)
    yield
    torch.set_num_threads(n)


def core(model, cls, **kwargs):
    """The core search class ``cls`` on a ``make_model`` model (no ESPnet glue)."""
    V = model.decoder.odim
    stepper = JointStepper(
        model.decoder, model.joint_network, V + len(model.tdt_durations)
    )
    return cls(
        stepper, TDTLattice.create(model.blank_id, model.tdt_durations), **kwargs
    )


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
        core(model, GreedySearch, blank_decision=decision),
        core(model, BeamSearch, beam_size=1, blank_decision=decision),
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
        core(model, GreedySearch),
        core(model, GreedySearch, blank_decision="symbol"),
        core(model, BeamSearch, beam_size=1),
    ):
        h = search.search_batch(enc, lens)[0]
        assert h.yseq == [0] + [2] * labels and h.frame == T
        assert h.frames_skipped == skipped
        assert h.big_blank_emissions == int(T == 8)
    h = core(model, GreedySearch, end_rule="clip").search_batch(enc, lens)[0]
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
            core(model, GreedySearch, max_sym_per_frame=max_sym),
            core(model, BeamSearch, beam_size=1, max_sym_per_frame=max_sym),
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
    for search in (core(model, GreedySearch), core(model, BeamSearch)):
        h = search.search_batch(enc, lens)[0]
        assert h.frame == T
    y, *_ = reference_greedy(model, enc[0, :T], max_sym=10)
    assert core(model, GreedySearch).search_one(enc[0, :T]).labels == y


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


def test_searches_take_every_lattice_and_refuse_anything_else():
    """One class per search: every search decodes both lattice kinds (the lattice
    comes from the model); what is not a lattice is refused, naming both kinds."""
    model = make_model(0)
    tdt_stepper = JointStepper(model.decoder, model.joint_network, 6 + len(DURS))
    mb_stepper = JointStepper(model.decoder, model.joint_network, 6)
    for cls in (GreedySearch, BeamSearch, LabelLoopingGreedySearch):
        assert cls(tdt_stepper, TDTLattice.create(0, DURS)).lattice.kind == "tdt"
        mb = cls(mb_stepper, MultiblankLattice.create(0))
        assert mb.lattice.kind == "multiblank"
        refused = f"MultiblankLattice or .*TDTLattice for {cls.__name__}, got tuple"
        with pytest.raises(TypeError, match=refused):
            cls(mb_stepper, (0, ()))
    # the former per-kind names are the same classes
    import espnet_multiblank.decoding as dec

    assert dec.MultiblankGreedySearch is dec.TDTGreedySearch is GreedySearch
    assert dec.MultiblankBeamSearch is dec.TDTBeamSearch is BeamSearch
    assert dec.MultiblankLabelLoopingSearch is LabelLoopingGreedySearch
    assert dec.TDTLabelLoopingSearch is LabelLoopingGreedySearch
    # the joint's output size must be V + D with the blank among the V tokens
    with pytest.raises(ValueError, match=r"stepper\.vocab_size = 5 must be V \+ D"):
        GreedySearch(
            JointStepper(model.decoder, model.joint_network, 5),
            TDTLattice.create(0, DURS),
        )
