"""Multi-blank greedy (batched and single) and beam search on tiny random models."""

import math
from types import SimpleNamespace

import pytest
import torch

import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)

# isort: split
from espnet2.asr.decoder.transducer_decoder import TransducerDecoder
from espnet2.asr.transducer.beam_search_transducer import BeamSearchTransducer
from espnet2.asr_transducer.joint_network import JointNetwork

from espnet_multiblank.decoding import (
    JointStepper,
    MultiblankBeamSearch,
    MultiblankGreedySearch,
)
from espnet_multiblank.espnet.inference.search import (
    build_transducer_search,
    lattice_from_model,
    resolve_search_type,
)
from espnet_multiblank.lattice import MultiblankLattice

V = 10
D_ENC = 8
DURS = (2, 4, 8)
BLANK = 3  # <blank8>, <blank4>, <blank2>, <blank>, labels 4..9


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: threads only add overhead (shared CPUs)
    yield
    torch.set_num_threads(n)


def make_model(seed=0, blank_id=BLANK, durations=DURS, blank_bias=2.0, vocab=V):
    """Random TransducerDecoder + JointNetwork; decoder built like ESPnet (pad 0)."""
    torch.manual_seed(seed)
    decoder = TransducerDecoder(vocab, hidden_size=12, embed_pad=0).eval()
    joint = JointNetwork(vocab, D_ENC, 12, joint_space_size=12).eval()
    with torch.no_grad():  # blanks likely enough that hypotheses stay short
        joint.lin_out.bias[blank_id - len(durations) : blank_id + 1] += blank_bias
        joint.lin_out.weight.mul_(3.0)
    return SimpleNamespace(
        decoder=decoder,
        joint_network=joint,
        blank_id=blank_id,
        big_blank_durations=tuple(durations),
        big_blank_ids=tuple(blank_id - 1 - i for i in range(len(durations))),
        token_list=[f"t{i}" for i in range(vocab)],
    )


def core_beam(model, **kwargs):
    """The core beam search on a ``make_model`` model (no ESPnet glue)."""
    return MultiblankBeamSearch(
        JointStepper(model.decoder, model.joint_network),
        MultiblankLattice.create(model.blank_id, model.big_blank_durations),
        **kwargs,
    )


def enc_batch(seed, lens):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(len(lens), max(lens), D_ENC, generator=g), torch.tensor(lens)


@pytest.mark.parametrize("durations", [DURS, ()])
@pytest.mark.parametrize("seed", [0, 1])
def test_batched_greedy_equals_one_at_a_time(durations, seed):
    blank_id = BLANK if durations else 0
    model = make_model(seed, blank_id=blank_id, durations=durations)
    search = build_transducer_search(model, search_type="mb_greedy")
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


@pytest.mark.parametrize("blank_decision", ["total", "symbol"])
def test_greedy_uses_big_blanks_and_labels(blank_decision):
    """The fixture model really exercises labels, big blanks and standard blanks."""
    model = make_model(0, blank_bias=0.5)
    search = build_transducer_search(
        model, search_type="mb_greedy", blank_decision=blank_decision
    )
    enc, lens = enc_batch(0, [40] * 4)
    hyps = search.search_batch(enc, lens)
    assert sum(len(h.yseq) - 1 for h in hyps) > 0
    assert sum(h.big_blank_emissions for h in hyps) > 0
    for h in hyps:
        assert all(k > BLANK for k in h.yseq[1:])  # never a blank in the output


def reference_greedy(model, enc, blank_decision, max_sym, lm=None):
    """Greedy search of docs/decoding.md written again for one utterance, with the
    decoder and joint network called directly. Returns (labels, score, big blanks).

    ``lm(labels) -> ({label: weighted LM score of it next}, weighted end score)``:
    shallow fusion, every label's log-probability plus its LM score, the end score
    added once at the end."""
    blank, durations = model.blank_id, model.big_blank_durations
    dec, joint = model.decoder, model.joint_network
    frames = {blank: 1}
    frames.update({blank - 1 - i: d for i, d in enumerate(durations)})
    T, V = enc.size(0), dec.odim

    def pred(k, state):
        out, state = dec.rnn_forward(dec.embed(torch.tensor([[k]])), state)
        return out[0, 0], state

    out, state = pred(blank, dec.init_state(1))
    t, n, labels, score, big = 0, 0, [], 0.0, 0
    with torch.no_grad():
        while t < T:
            logp = torch.log_softmax(joint(enc[t], out), -1).double().tolist()
            if lm is not None:
                bonus, _ = lm(labels)
                logp = [v + bonus.get(k, 0.0) for k, v in enumerate(logp)]
            blanks = [k for k, f in frames.items() if t + f <= T]
            allowed = blanks + (
                [k for k in range(V) if k not in frames] * (n < max_sym)
            )
            k = max(allowed, key=lambda k: logp[k])
            step = logp[k]
            if blank_decision == "total":
                total = math.log(sum(math.exp(logp[b]) for b in blanks))
                if k not in frames and logp[k] <= total:
                    k = max(blanks, key=lambda b: logp[b])
                if k in frames:
                    step = total
            score += step
            if k in frames:
                t, n, big = t + frames[k], 0, big + (frames[k] > 1)
            else:
                labels.append(k)
                n += 1
                out, state = pred(k, state)
    if lm is not None:
        score += lm(labels)[1]
    return labels, score, big


@pytest.mark.parametrize("blank_bias", [0.0, 1.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_blank_decisions_against_reference(seed, blank_bias):
    """Both blank decisions, one utterance and batched, against the reference; on
    these models the two decisions give different results."""
    model = make_model(seed, blank_bias=blank_bias)
    lens = [19, 33, 7]
    enc, enc_lens = enc_batch(seed + 60, lens)
    outputs = {}
    for decision in ("total", "symbol"):
        search = build_transducer_search(
            model, search_type="mb_greedy", max_sym_per_frame=3, blank_decision=decision
        )
        batch = search.search_batch(enc, enc_lens)
        for b, T in enumerate(lens):
            labels, score, big = reference_greedy(model, enc[b, :T], decision, 3)
            for h in (search.search_one(enc[b, :T]), batch[b]):
                assert h.labels == labels
                assert h.big_blank_emissions == big
                assert h.score == pytest.approx(score, rel=1e-5, abs=1e-5)
            outputs[decision, b] = labels
    assert any(outputs["total", b] != outputs["symbol", b] for b in range(len(lens)))


@pytest.mark.parametrize("blank_decision", ["total", "symbol"])
@pytest.mark.parametrize("durations", [DURS, (3,), ()])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_size_one_equals_greedy(durations, seed, blank_decision):
    blank_id = 3 if durations else 1
    model = make_model(seed, blank_id=blank_id, durations=durations, blank_bias=0.5)
    greedy = build_transducer_search(
        model, search_type="mb_greedy", blank_decision=blank_decision
    )
    beam1 = build_transducer_search(
        model, search_type="mb_beam", beam_size=1, blank_decision=blank_decision
    )
    assert isinstance(beam1, MultiblankBeamSearch)
    enc, lens = enc_batch(seed + 10, [31, 5, 18])
    for b, T in enumerate(lens.tolist()):
        g = greedy.search_one(enc[b, :T])
        (h,) = beam1(enc[b, :T])
        assert h.yseq == g.yseq
        assert h.big_blank_emissions == g.big_blank_emissions
        assert h.frames_skipped == g.frames_skipped
        assert math.isclose(h.score, g.score, rel_tol=1e-6, abs_tol=1e-5)


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
        if isinstance(search, MultiblankGreedySearch):
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
        if isinstance(search, MultiblankGreedySearch):
            assert math.isclose(h.score, expected, rel_tol=1e-5)
        else:  # beam merges alignments of the same (empty) label sequence
            assert h.score >= expected - 1e-5


def test_big_blank_never_overshoots():
    model = always_big_blank_model(2)  # prefers <blank8>
    search = build_transducer_search(model, search_type="mb_greedy")
    enc, lens = enc_batch(0, [5, 8, 13])
    for h, T in zip(search.search_batch(enc, lens), lens.tolist()):
        assert h.frame == T


@pytest.mark.parametrize("blank_decision", ["total", "symbol"])
@pytest.mark.parametrize("blank_bias", [2.0, 0.5])
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("beam_size", [2, 4, 8])
def test_beam_score_not_below_greedy(seed, beam_size, blank_bias, blank_decision):
    """Same blank decision (the scores mean the same then)."""
    model = make_model(seed, blank_bias=blank_bias)  # 0.5: greedy emits labels
    greedy = build_transducer_search(
        model, search_type="mb_greedy", blank_decision=blank_decision
    )
    beam = build_transducer_search(
        model,
        search_type="mb_beam",
        beam_size=beam_size,
        blank_decision=blank_decision,
    )
    enc, lens = enc_batch(100 + seed, [25, 12])
    for b, T in enumerate(lens.tolist()):
        g = greedy.search_one(enc[b, :T])
        (h,) = beam(enc[b, :T])
        assert h.frame == T
        assert h.score >= g.score - 1e-6


def test_beam_merges_alignments_exactly():
    """With a beam wide enough to keep everything, the score of the empty label
    sequence is the total probability of all its blank alignments."""
    durations = (2, 3)
    model = make_model(5, blank_id=2, durations=durations, vocab=4)
    with torch.no_grad():
        model.joint_network.lin_out.weight.zero_()  # context-free probabilities
    T = 6
    enc, _ = enc_batch(0, [T])
    search = core_beam(model, beam_size=50, nbest=50, blank_decision="symbol")
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


def brute_force_sequences(model, enc, max_sym):
    """log P(y | x) for every label sequence y, by enumerating every path.

    Independent of the searches: ESPnet's decoder and joint network called directly,
    one path at a time, with the lattice rules of ``docs/lattice.md`` (labels stay,
    blank +1, big blank i + d_i, no overshoot) and at most ``max_sym`` labels per frame.
    """
    blank, durations = model.blank_id, model.big_blank_durations
    dec, joint = model.decoder, model.joint_network
    labels = [k for k in range(dec.odim) if k > blank or k < blank - len(durations)]
    T = enc.size(0)
    paths = {}

    def step(k, state):
        out, state = dec.rnn_forward(dec.embed(torch.tensor([[k]])), state)
        return out[0, 0], state

    def rec(t, y, n_sym, dec_out, state, lp):
        if t == T:
            paths.setdefault(y, []).append(lp)
            return
        logp = torch.log_softmax(joint(enc[t], dec_out), dim=-1).double()
        rec(t + 1, y, 0, dec_out, state, lp + logp[blank])
        for i, d in enumerate(durations):
            if t + d <= T:
                rec(t + d, y, 0, dec_out, state, lp + logp[blank - 1 - i])
        if n_sym < max_sym:
            for k in labels:
                out, new_state = step(k, state)
                rec(t, y + (k,), n_sym + 1, out, new_state, lp + logp[k])

    with torch.no_grad():
        out, state = step(blank, dec.init_state(1))
        rec(0, (), 0, out, state, torch.tensor(0.0, dtype=torch.float64))
    return {y: float(torch.logsumexp(torch.stack(v), 0)) for y, v in paths.items()}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("max_sym", [1, 2])
def test_wide_beam_equals_exhaustive_search(seed, max_sym):
    """A beam that prunes nothing returns every label sequence with its exact total
    probability (all alignments merged); narrower beams never over-estimate it."""
    durations = (2,)
    model = make_model(seed, blank_id=1, durations=durations, vocab=4, blank_bias=0.0)
    enc, _ = enc_batch(seed, [5 if max_sym == 1 else 3])  # keeps enumeration fast
    exact = brute_force_sequences(model, enc[0], max_sym)
    wide = core_beam(
        model,
        beam_size=100000,
        nbest=100000,
        max_sym_per_frame=max_sym,
        blank_decision="symbol",
    )
    got = {tuple(h.yseq[1:]): h.score for h in wide(enc[0])}
    assert set(got) == set(exact)
    for y, score in exact.items():
        assert got[y] == pytest.approx(score, rel=1e-5, abs=1e-5)
    best = max(exact, key=exact.get)
    assert tuple(wide(enc[0])[0].yseq[1:]) == best
    for beam_size in (1, 2, 4):
        narrow = build_transducer_search(
            model,
            search_type="mb_beam",
            beam_size=beam_size,
            nbest=8,
            max_sym_per_frame=max_sym,
            blank_decision="symbol",
        )
        for h in narrow(enc[0]):
            assert h.score <= exact[tuple(h.yseq[1:])] + 1e-5


def test_nbest_sorted_and_distinct():
    model = make_model(1)
    beam = build_transducer_search(model, search_type="mb_beam", beam_size=6, nbest=4)
    enc, _ = enc_batch(1, [20])
    hyps = beam(enc[0])
    assert 1 <= len(hyps) <= 4
    scores = [h.score for h in hyps]
    assert scores == sorted(scores, reverse=True)
    assert len({tuple(h.yseq) for h in hyps}) == len(hyps)


# ---------------------------------------------------------------- blank handling


def test_wrong_blank_defect_cannot_occur():
    """ESPnet builds the decoder with blank_id = embed_pad = 0 (<blank8> here)."""
    model = make_model(0)
    assert model.decoder.blank_id == 0  # ESPnet's defect, before any search is built
    for st in ("mb_greedy", "mb_beam", "greedy", "default", "mbg"):
        search = build_transducer_search(model, search_type=st, beam_size=2)
        assert isinstance(search, (MultiblankGreedySearch, MultiblankBeamSearch)), st
        assert search.blank_id == BLANK
        assert search.lattice.big_blank_ids == (2, 1, 0)
        assert model.decoder.blank_id == BLANK
    # every hypothesis starts with the standard blank, never index 0
    enc, lens = enc_batch(0, [12, 6])
    for h in build_transducer_search(model, search_type="mb_greedy").search_batch(
        enc, lens
    ):
        assert h.yseq[0] == BLANK and 0 not in h.yseq
    # ESPnet searches that do not know big blanks are refused on a multi-blank model
    for st in ("tsd", "alsd", "nsc", "maes"):
        with pytest.raises(ValueError, match="big blanks"):
            build_transducer_search(model, search_type=st, beam_size=2)


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


def test_unknown_conf_key_and_lm_without_token_list_rejected():
    model = make_model(0)
    with pytest.raises(ValueError, match="u_max"):
        build_transducer_search(model, search_type="mb_beam", beam_size=2, u_max=5)
    # LM fusion maps tokens by their text: an LM without its token list is refused
    with pytest.raises(ValueError, match="lm_train_config"):
        build_transducer_search(model, search_type="mb_greedy", lm=object())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    model = make_model(1)
    enc, lens = enc_batch(7, [20, 9, 14])
    cpu = {
        st: build_transducer_search(model, search_type=st, beam_size=4)
        for st in ("mb_greedy", "mb_beam")
    }
    want_g = cpu["mb_greedy"].search_batch(enc, lens)
    want_b = [cpu["mb_beam"](enc[b, :T])[0] for b, T in enumerate(lens.tolist())]
    model.decoder.cuda()
    model.joint_network.cuda()
    gpu = build_transducer_search(model, search_type="mb_greedy")
    got_g = gpu.search_batch(enc.cuda(), lens.cuda())
    beam = build_transducer_search(model, search_type="mb_beam", beam_size=4)
    for b, T in enumerate(lens.tolist()):
        assert got_g[b].yseq == want_g[b].yseq
        assert beam(enc[b, :T].cuda())[0].yseq == want_b[b].yseq


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


# ------------------------------------------------- beam search: the documented rule


class CountingStepper(JointStepper):
    """JointStepper that records the rows of every joint-network evaluation."""

    def __init__(self, *args):
        super().__init__(*args)
        self.rows = []

    def log_probs(self, enc_proj, dec_proj):
        self.rows.append(enc_proj.size(0))
        return super().log_probs(enc_proj, dec_proj)


def reference_beam(model, enc, beam, max_sym, blank_decision):
    """The beam search of docs/decoding.md, written again one hypothesis at a time
    with the decoder and joint network called directly (no search code).

    Returns:
        [(labels, score, big_blank_emissions, frames_skipped)] of every complete
        hypothesis, and the number of hypotheses of every expansion, in order.
    """
    blank, durations = model.blank_id, model.big_blank_durations
    dec, joint = model.decoder, model.joint_network
    frames = {blank: 1}
    frames.update({blank - 1 - i: d for i, d in enumerate(durations)})
    T, V = enc.size(0), dec.odim

    def pred(k, state):
        out, state = dec.rnn_forward(dec.embed(torch.tensor([[k]])), state)
        return out[0, 0], state

    def insert(queue, hyp):
        old = queue.get(hyp["y"])
        if old is None:
            queue[hyp["y"]] = hyp
            return
        total = float(torch.logaddexp(torch.tensor(old["s"]), torch.tensor(hyp["s"])))
        if hyp["s"] > old["s"]:
            queue[hyp["y"]] = hyp
        queue[hyp["y"]]["s"] = total

    queues = [dict() for _ in range(T + 1)]
    out, state = pred(blank, dec.init_state(1))
    queues[0][()] = dict(y=(), s=0.0, out=out, st=state, n=0, big=0, skip=0)
    expansions = []
    with torch.no_grad():
        for t in range(T):
            current = sorted(queues[t].values(), key=lambda h: -h["s"])[:beam]
            while current:
                expansions.append(len(current))
                cands = []
                for a, h in enumerate(current):
                    logp = torch.log_softmax(joint(enc[t], h["out"]), -1).double()
                    blanks = []
                    for k in range(V):
                        f = frames.get(k, 0)
                        if (f == 0 and h["n"] >= max_sym) or t + f > T:
                            continue
                        if f and blank_decision == "total":
                            blanks.append(k)
                        else:
                            cands.append((h["s"] + float(logp[k]), a, k))
                    if blanks:  # one candidate: the blanks' total, the best blank
                        total = float(torch.logsumexp(logp[blanks], 0))
                        best = max(blanks, key=lambda b: float(logp[b]))
                        cands.append((h["s"] + total, a, best))
                cands = sorted(cands, key=lambda c: -c[0])[:beam]
                ahead = sorted((h["s"] for h in queues[t + 1].values()), reverse=True)
                floor = ahead[beam - 1] if len(ahead) >= beam else float("-inf")
                nxt = []
                for s, a, k in cands:
                    h, f = current[a], frames.get(k, 0)
                    if f == 0:
                        if s >= floor:
                            out, state = pred(k, h["st"])
                            nxt.append(dict(h, y=h["y"] + (k,), s=s, out=out, st=state))
                            nxt[-1]["n"] = h["n"] + 1
                        continue
                    child = dict(h, s=s, n=0)
                    child["big"] += f > 1
                    child["skip"] += f - 1
                    insert(queues[t + f], child)
                current = nxt
    final = [(h["y"], h["s"], h["big"], h["skip"]) for h in queues[T].values()]
    return final, expansions


@pytest.mark.parametrize("blank_decision", ["total", "symbol"])
@pytest.mark.parametrize("durations", [(2, 4), (3,), ()])
@pytest.mark.parametrize("beam_size", [1, 2, 3, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_small_beams_follow_the_documented_rule(
    durations, beam_size, seed, blank_decision
):
    """Exact n-best (labels, scores, big blanks) and the number of hypotheses expanded
    at every step, against an independent implementation of the documented rule
    (per-frame top-B cut, B best candidates per expansion, labels below the B-th best
    hypothesis queued at t + 1 dropped, merging by log-add)."""
    blank_id = 2 if durations else 0
    model = make_model(seed, blank_id=blank_id, durations=durations, vocab=6)
    with torch.no_grad():  # labels and blanks compete: wide n-best lists
        model.joint_network.lin_out.bias[blank_id - len(durations) :] -= 1.5
    enc, _ = enc_batch(seed + 40, [11])
    want, want_expansions = reference_beam(model, enc[0], beam_size, 2, blank_decision)
    stepper = CountingStepper(model.decoder, model.joint_network)
    search = MultiblankBeamSearch(
        stepper,
        MultiblankLattice.create(blank_id, durations),
        beam_size=beam_size,
        nbest=1000,
        max_sym_per_frame=2,
        blank_decision=blank_decision,
    )
    got = search(enc[0])
    assert stepper.rows == want_expansions
    want.sort(key=lambda w: -w[1])
    assert [tuple(h.labels) for h in got] == [w[0] for w in want]
    for h, (_, score, big, skip) in zip(got, want):
        assert h.score == pytest.approx(score, rel=1e-6, abs=1e-6)
        assert (h.big_blank_emissions, h.frames_skipped) == (big, skip)


@pytest.mark.parametrize("how", ["core", "transducer_conf"])
def test_score_norm_ranks_by_score_per_symbol(how):
    """score_norm: the final n-best is ordered by score / len(yseq) (in the search and
    when set through transducer_conf); the hypotheses themselves do not change."""
    model = make_model(3, blank_bias=0.0)
    enc, _ = enc_batch(9, [14])
    plain = core_beam(model, beam_size=4, nbest=100)(enc[0])
    if how == "core":
        normed = core_beam(model, beam_size=4, nbest=100, score_norm=True)
    else:
        normed = build_transducer_search(
            model, search_type="mb_beam", beam_size=4, nbest=100, score_norm=True
        )
    got = normed(enc[0])
    want = sorted(plain, key=lambda h: h.score / len(h.yseq), reverse=True)
    assert [(h.yseq, h.score) for h in got] == [(h.yseq, h.score) for h in want]
    assert [h.yseq for h in want] != [
        h.yseq for h in plain
    ]  # the case tells them apart
    normed.nbest = 2
    assert [h.yseq for h in normed(enc[0])] == [h.yseq for h in want[:2]]
