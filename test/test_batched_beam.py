"""Batched beam search (``search_batch_nbest``), both pruning rules (``beam_sync``).

``beam_sync: "frame"``: against the one-utterance frame-synchronous beam search
(``BeamSearch.search``), itself tested against the documented rule written again,
exhaustive path enumeration and LM oracles
(test_decoding_search.py, test_tdt_search.py, test_decoding_lm.py): the same n-best
lists (labels, scores to float rounding, big blanks, frames skipped, label timing),
utterance by utterance, for every lattice (standard, multi-blank, TDT with and without
durations 0 and 1, both end rules), both blank decisions, beams 1..8, utterances of 0
and 1 frames in the batch, with and without LMs. Wide n-best lists (nbest > beam)
reach the hypotheses below a frame's K best, which the batched search keeps in its
overflow.

``beam_sync: "step"``: against the step rule written again here, one hypothesis at a
time with the networks called directly (:func:`reference_step_beam`), beam 1 against
the greedy searches, a wide beam against exhaustive enumeration.

Both: one joint and one prediction-network call per step. With ``beam_sync: "label"``
too (its own oracles in test_label_sync_beam.py): batch 32 == batch 1, an utterance
without paths leaves the others alone, half precision, CUDA == CPU.
"""

import math

import pytest
import torch
from search_cases import enc_batch
from search_cases import make_mb_model as mb_make_model
from search_cases import make_tdt_model as tdt_make_model
from search_oracles import TDTOracle, brute_force_sequences, enumerate_paths
from test_decoding_search import one_thread  # noqa: F401 (autouse fixture)

from espnet_multiblank.decoding import BeamSearch, GreedySearch, JointStepper
from espnet_multiblank.espnet.inference.search import build_transducer_search
from espnet_multiblank.lattice import MultiblankLattice, TDTLattice

pytestmark = pytest.mark.timeout(600)

LENS = [13, 1, 11, 0, 9, 12]


def mb_search(model, cls=BeamSearch, **kwargs):
    return cls(
        JointStepper(model.decoder, model.joint_network),
        MultiblankLattice.create(model.blank_id, model.big_blank_durations),
        **kwargs,
    )


def tdt_search(model, cls=BeamSearch, **kwargs):
    V = model.decoder.odim
    return cls(
        JointStepper(model.decoder, model.joint_network, V + len(model.tdt_durations)),
        TDTLattice.create(model.blank_id, model.tdt_durations),
        **kwargs,
    )


# (name, model factory, search factory, encoder batch)
def mb_case(durations):
    def make(seed):
        blank = len(durations)
        model = mb_make_model(seed, blank_id=blank, durations=durations, vocab=7)
        with torch.no_grad():  # labels and blanks compete: wide n-best lists
            model.joint_network.lin_out.bias[: blank + 1] -= 2.5
        return model

    return make, mb_search, enc_batch


def tdt_case(durations):
    def make(seed):
        return tdt_make_model(seed, durations=durations, blank_bias=-0.5)

    return make, tdt_search, enc_batch


CASES = {
    "standard": mb_case(()),
    "multiblank": mb_case((2, 4, 8)),
    "tdt": tdt_case((0, 1, 2, 3, 4)),
    "tdt_no_0": tdt_case((1, 2, 3)),
    "tdt_no_1": tdt_case((0, 2, 3)),
}


def assert_same_nbest(got, want, T):
    """Labels, scores (float rounding), statistics and timing of two n-best lists."""
    assert [h.yseq for h in got] == [h.yseq for h in want]
    for g, w in zip(got, want):
        assert g.score == pytest.approx(w.score, rel=1e-6, abs=1e-5)
        assert g.frame == w.frame == T
        assert (g.big_blank_emissions, g.frames_skipped) == (
            w.big_blank_emissions,
            w.frames_skipped,
        )
        assert [x[:2] for x in g.timing] == [x[:2] for x in w.timing]
        for (_, _, lp_g), (_, _, lp_w) in zip(g.timing, w.timing):
            assert lp_g == pytest.approx(lp_w, rel=1e-5, abs=1e-5)


def check_batched_equals_reference(search, enc, lens):
    got = search.search_batch_nbest(enc, torch.tensor(lens))
    assert len(got) == len(lens)
    for b, T in enumerate(lens):
        assert_same_nbest(got[b], search.search(enc[b, :T]), T)
    return got


# ------------------------------------------------- beam_sync "frame": the reference


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("decision", ["symbol", "total"])
@pytest.mark.parametrize("beam", [1, 2, 4])
def test_frame_rule_batched_equals_one_utterance_search(case, decision, beam):
    make, build, enc_batch = CASES[case]
    search = build(
        make(beam),
        beam_size=beam,
        nbest=beam + 4,  # below the K best too
        max_sym_per_frame=2,
        blank_decision=decision,
    )
    assert search.beam_sync == "frame"
    enc, _ = enc_batch(beam + 10, LENS)
    got = check_batched_equals_reference(search, enc, LENS)
    assert any(len(h.yseq) > 1 for nbest in got for h in nbest)


@pytest.mark.parametrize("decision", ["symbol", "total"])
def test_frame_rule_tdt_clip_end_rule(decision):
    """end_rule "clip": arcs of one expansion land together on T (merged before
    they are queued)."""
    model = tdt_make_model(3, durations=(0, 2, 4), blank_bias=-0.5)
    search = tdt_search(
        model, beam_size=3, nbest=8, blank_decision=decision, end_rule="clip"
    )
    enc, _ = enc_batch(5, LENS)
    check_batched_equals_reference(search, enc, LENS)


@pytest.mark.parametrize("case", ["multiblank", "tdt"])
def test_frame_rule_wide_beams_and_many_labels_per_frame(case):
    """Beam 8, up to 3 labels per frame, every hypothesis of the final frame."""
    make, build, enc_batch = CASES[case]
    search = build(make(2), beam_size=8, nbest=1000, max_sym_per_frame=3)
    enc, _ = enc_batch(7, [10, 3, 8])
    check_batched_equals_reference(search, enc, [10, 3, 8])


def test_frame_rule_overflow_and_node_pool_grow(monkeypatch):
    """Tiny first capacities: the overflow and the label nodes are grown."""
    monkeypatch.setattr(BeamSearch, "initial_overflow", 1)
    monkeypatch.setattr(BeamSearch, "initial_nodes", 2)
    make, build, enc_batch = CASES["multiblank"]
    search = build(make(1), beam_size=3, nbest=50, max_sym_per_frame=2)
    enc, _ = enc_batch(2, LENS)
    check_batched_equals_reference(search, enc, LENS)


# ------------------------------------------------------ beam_sync "step": the rule


def mb_arcs(model, decision):
    """[(symbol, frames, score)] of the arcs a multi-blank hypothesis may take, the
    networks called directly (docs/decoding.md: labels stay, big blanks that would
    pass T not allowed; "total": one blank, the best, with the blanks' total)."""
    blank, durations = model.blank_id, model.big_blank_durations
    frames = {blank: 1}
    frames.update({blank - 1 - i: d for i, d in enumerate(durations)})
    V = model.decoder.odim

    def arcs(enc_t, out, n, max_sym, room):
        logp = torch.log_softmax(model.joint_network(enc_t, out), -1).double()
        blanks = [k for k, f in frames.items() if f <= room]
        labels = [k for k in range(V) if k not in frames] if n < max_sym else []
        got = [(k, 0, float(logp[k])) for k in labels]
        if decision == "total":
            best = max(blanks, key=lambda k: float(logp[k]))
            got.append((best, frames[best], float(torch.logsumexp(logp[blanks], 0))))
        else:
            got += [(k, frames[k], float(logp[k])) for k in blanks]
        return got

    return arcs, set(frames)


def tdt_arcs(model, decision):
    o = TDTOracle(model)

    def arcs(enc_t, out, n, max_sym, room):
        got = o.arcs(enc_t, out, n, max_sym, room, decision)
        return [(k, min(o.durations[j], room), lp) for (k, j), lp in got.items()]

    return arcs, {model.blank_id}


def reference_step_beam(model, arcs, blanks, enc, beam, max_sym, end=None):
    """The step rule of docs/decoding.md written again, one hypothesis at a time:
    every hypothesis short of T takes each of its arcs, one that has reached T
    competes as it is; the K best candidates stay; those that arrived at the same
    frame (by a move, or at T) with the same labels merge into the best of them
    (log-add). ``end(labels)``: a score added where a hypothesis reaches T (the
    end of the sentence of fused LMs). Returns the final hypotheses, best first:
    dicts with y (labels), s (score), big, skip, tim ((frame, frames covered) per
    label)."""
    dec = model.decoder
    T = enc.size(0)

    def pred(k, state):
        out, state = dec.rnn_forward(dec.embed(torch.tensor([[k]])), state)
        return out[0, 0], state

    out, state = pred(model.blank_id, dec.init_state(1))
    hyps = [dict(y=(), s=0.0, t=0, n=0, out=out, st=state, big=0, skip=0, tim=())]
    if end is not None and T == 0:
        hyps[0]["s"] += end(())
    with torch.no_grad():
        while any(h["t"] < T for h in hyps):
            cands = []
            for a, h in enumerate(hyps):
                if h["t"] == T:
                    cands.append((h["s"], a, None, 0))
                    continue
                room = T - h["t"]
                for k, e, lp in arcs(enc[h["t"]], h["out"], h["n"], max_sym, room):
                    cands.append((h["s"] + lp, a, k, e))
            kept = []
            for s, a, k, e in sorted(cands, key=lambda c: -c[0])[:beam]:
                h = hyps[a]
                c = dict(h, arrived=True)
                if k is not None:
                    c.update(s=s, t=h["t"] + e, arrived=e > 0)
                    c["n"] = 0 if e else h["n"] + 1
                    c["skip"] += max(e - 1, 0)
                    if k in blanks:
                        c["big"] += e > 1
                    else:
                        c["out"], c["st"] = pred(k, h["st"])
                        c["y"], c["tim"] = h["y"] + (k,), h["tim"] + ((h["t"], e),)
                    if end is not None and c["t"] == T:
                        c["s"] += end(c["y"])
                same = [
                    m
                    for m in kept
                    if c["arrived"]
                    and m["arrived"]
                    and (m["y"], m["t"]) == (c["y"], c["t"])
                ]
                if same:
                    same[0]["s"] = float(
                        torch.logaddexp(
                            torch.tensor(same[0]["s"]), torch.tensor(c["s"])
                        )
                    )
                else:
                    kept.append(c)
            hyps = kept
    return sorted(hyps, key=lambda h: -h["s"])


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("decision", ["symbol", "total"])
@pytest.mark.parametrize("beam", [2, 3])
def test_step_rule_follows_the_rule_written_again(case, decision, beam):
    make, build, enc_batch = CASES[case]
    model = make(beam)
    arcs, blanks = (tdt_arcs if case.startswith("tdt") else mb_arcs)(model, decision)
    search = build(
        model,
        beam_size=beam,
        nbest=beam,
        max_sym_per_frame=2,
        blank_decision=decision,
        beam_sync="step",
    )
    lens = [9, 1, 0, 7]
    enc, _ = enc_batch(beam + 20, lens)
    got = search.search_batch_nbest(enc, torch.tensor(lens))
    labels = 0
    for b, T in enumerate(lens):
        want = reference_step_beam(model, arcs, blanks, enc[b, :T], beam, 2)
        assert [h.labels for h in got[b]] == [list(w["y"]) for w in want]
        for h, w in zip(got[b], want):
            assert h.score == pytest.approx(w["s"], rel=1e-5, abs=1e-5)
            assert (h.big_blank_emissions, h.frames_skipped) == (w["big"], w["skip"])
            assert [x[:2] for x in h.timing] == [list(x) for x in w["tim"]] or [
                tuple(x[:2]) for x in h.timing
            ] == list(w["tim"])
            labels += len(h.labels)
    assert labels > 0


# ------------------------------------------------------------------- both rules

#: the rules, and the label rule with frame_prune (its floor: each utterance's greedy
#: path, so batches must still equal one utterance alone)
SYNCS = ["frame", "step", "label", "label-prune"]


def sync_args(sync: str) -> dict:
    if sync == "label-prune":
        return dict(beam_sync="label", frame_prune=6.0)
    return dict(beam_sync=sync)


@pytest.mark.parametrize("sync", SYNCS)
@pytest.mark.parametrize("case", ["standard", "multiblank", "tdt"])
def test_batch_32_equals_batch_1(case, sync):
    make, build, enc_batch = CASES[case]
    search = build(make(4), beam_size=4, nbest=3, **sync_args(sync))
    lens = [(7 * i) % 11 + 1 for i in range(32)]
    enc, _ = enc_batch(3, lens)
    batch = search.search_batch_nbest(enc, torch.tensor(lens))
    for b, T in enumerate(lens):
        alone = search.search_batch_nbest(enc[b : b + 1, :T], torch.tensor([T]))[0]
        assert_same_nbest(batch[b], alone, T)
        if sync != "frame":  # search() is the batched search on one utterance
            assert_same_nbest(search.search(enc[b, :T]), alone, T)


@pytest.mark.parametrize("sync", ["frame", "step"])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("decision", ["symbol", "total"])
def test_beam_one_equals_greedy(case, decision, sync):
    make, build, enc_batch = CASES[case]
    model = make(5)
    kwargs = dict(max_sym_per_frame=2, blank_decision=decision)
    beam = build(model, beam_size=1, beam_sync=sync, **kwargs)
    greedy = build(model, cls=GreedySearch, **kwargs)
    enc, _ = enc_batch(6, LENS)
    got = beam.search_batch(enc, torch.tensor(LENS))
    want = greedy.search_batch(enc, torch.tensor(LENS))
    for g, w in zip(got, want):
        assert g.yseq == w.yseq
        assert g.score == pytest.approx(w.score, rel=1e-5, abs=1e-4)
        assert [x[:2] for x in g.timing] == [x[:2] for x in w.timing]
    assert sum(len(h.yseq) - 1 for h in got) > 0


@pytest.mark.slow
@pytest.mark.parametrize("sync", ["frame", "step"])
def test_wide_beam_equals_exhaustive_enumeration(sync):
    """A beam that prunes nothing returns every label sequence with its exact
    probability (brute force over the lattice's paths)."""
    model = mb_make_model(1, blank_id=2, durations=(2, 3), vocab=5, blank_bias=0.0)
    search = mb_search(
        model, beam_size=4096, nbest=10**4, max_sym_per_frame=1, beam_sync=sync
    )
    enc, _ = enc_batch(2, [4, 3])
    got = search.search_batch_nbest(enc, torch.tensor([4, 3]))
    for b, T in enumerate([4, 3]):
        want = brute_force_sequences(model, enc[b, :T], 1)
        assert {tuple(h.labels): h.score for h in got[b]} == pytest.approx(
            {tuple(y): lp for y, lp in want.items()}, rel=1e-6
        )
    model = tdt_make_model(2, durations=(0, 1, 2), vocab=3, blank_bias=0.0)
    search = tdt_search(
        model, beam_size=4096, nbest=10**4, max_sym_per_frame=1, beam_sync=sync
    )
    enc, _ = enc_batch(4, [4])
    got = search.search_batch_nbest(enc, torch.tensor([4]))[0]
    want = enumerate_paths(model, enc[0], max_sym=1)
    assert {tuple(h.labels): h.score for h in got} == pytest.approx(
        {tuple(y): lp for y, lp in want.items()}, rel=1e-6
    )


class CallCount(JointStepper):
    """Counts joint-network and prediction-network calls."""

    def __init__(self, *args):
        super().__init__(*args)
        self.joint_calls = self.pred_calls = 0

    def joint(self, enc_proj, dec_proj):
        self.joint_calls += 1
        return super().joint(enc_proj, dec_proj)

    def step(self, labels, state):
        self.pred_calls += 1
        return super().step(labels, state)


@pytest.mark.parametrize("sync", ["frame", "step"])
def test_one_joint_and_one_prediction_call_per_step(sync, monkeypatch):
    from espnet_multiblank.decoding.beam_run import BeamRun

    model = mb_make_model(0, blank_bias=0.0)
    stepper = CallCount(model.decoder, model.joint_network)
    search = BeamSearch(
        stepper,
        MultiblankLattice.create(model.blank_id, model.big_blank_durations),
        beam_size=4,
        beam_sync=sync,
    )
    steps = []
    expand = BeamRun.expand

    def counted(run, *args, **kwargs):
        steps.append(1)
        return expand(run, *args, **kwargs)

    monkeypatch.setattr(BeamRun, "expand", counted)
    enc, lens = enc_batch(0, [20, 5, 17, 1])
    search.search_batch_nbest(enc, lens)
    num_steps = len(steps)
    assert stepper.joint_calls == num_steps
    assert 1 <= stepper.pred_calls - 1 <= num_steps  # - 1: the start symbol
    # a step works on every utterance at once: as many steps as the longest
    alone = []
    for b, T in enumerate(lens.tolist()):
        steps.clear()
        search.search_batch_nbest(enc[b : b + 1, :T], torch.tensor([T]))
        alone.append(len(steps))
    assert num_steps == max(alone)


@pytest.mark.parametrize("sync", SYNCS)
def test_an_utterance_without_paths_leaves_the_others_alone(sync):
    """Non-finite encoder output for one utterance: no hypothesis for it (the
    decoding loop reports it), the others exactly as alone."""
    model = mb_make_model(0, blank_bias=0.0)
    search = mb_search(model, beam_size=3, nbest=2, **sync_args(sync))
    lens = [12, 9, 7]
    enc, _ = enc_batch(1, lens)
    enc[1, :9] = float("nan")
    got = search.search_batch_nbest(enc, torch.tensor(lens))
    assert got[1] == [] and search.search(enc[1, :9]) == []
    for b in (0, 2):
        assert_same_nbest(got[b], search.search(enc[b, : lens[b]]), lens[b])
    with pytest.raises(ValueError, match="utterance 1 of the batch"):
        search.search_batch(enc, torch.tensor(lens))


def test_bad_arguments_and_empty_batches():
    search = mb_search(mb_make_model(0), beam_size=2)
    enc, _ = enc_batch(0, [5])
    assert search.search_batch_nbest(enc[:0], torch.zeros(0, dtype=torch.long)) == []
    with pytest.raises(ValueError, match="enc_lens must be in"):
        search.search_batch_nbest(enc, torch.tensor([6]))
    with pytest.raises(ValueError, match=r"enc_out must be \(B, T_max, D_enc\)"):
        search.search_batch_nbest(enc[0], torch.tensor([5]))
    with pytest.raises(ValueError, match="beam_sync must be one of"):
        mb_search(mb_make_model(0), beam_sync="time")


@pytest.mark.parametrize("sync", SYNCS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(dtype, sync):
    """In half precision the batched search gives the n-best of one utterance alone
    (networks in the model's dtype, scores in float32 and float64)."""
    make, build, enc_batch = CASES["multiblank"]
    model = make(0)
    model.decoder.to(dtype)
    model.joint_network.to(dtype)
    search = build(model, beam_size=3, nbest=2, **sync_args(sync))
    enc, _ = enc_batch(1, [9, 6, 11])
    got = search.search_batch_nbest(enc.to(dtype), torch.tensor([9, 6, 11]))
    for b, T in enumerate([9, 6, 11]):
        want = search.search(enc[b, :T].to(dtype))
        assert [h.yseq for h in got[b]] == [h.yseq for h in want]
        for g, w in zip(got[b], want):
            assert math.isfinite(g.score)
            assert g.score == pytest.approx(w.score, rel=1e-2, abs=1e-2)


def test_factory_beams_are_batched():
    """The decode configs' beam searches decode batches; ``beam_sync`` from
    transducer_conf (refused with a greedy search)."""
    model = mb_make_model(0)
    for search_type in ("mb_beam", "default"):
        search = build_transducer_search(model, search_type=search_type, beam_size=4)
        assert isinstance(search, BeamSearch) and search.batched
        assert search.beam_sync == "frame"
    search = build_transducer_search(
        model, search_type="mb_beam", beam_size=4, beam_sync="step"
    )
    assert search.beam_sync == "step"
    tdt = tdt_make_model(0)
    search = build_transducer_search(
        tdt, search_type="tdt_beam", beam_size=4, beam_sync="step"
    )
    assert isinstance(search, BeamSearch) and search.batched
    assert search.lattice.kind == "tdt"
    assert search.beam_sync == "step"
    with pytest.raises(ValueError, match="beam_sync"):
        build_transducer_search(model, search_type="mb_greedy", beam_sync="step")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("sync", SYNCS)
def test_cuda_matches_cpu(sync):
    for case in ("multiblank", "tdt"):
        make, build, enc_batch = CASES[case]
        model = make(0)
        search = build(model, beam_size=4, nbest=3, **sync_args(sync))
        enc, _ = enc_batch(1, LENS)
        want = search.search_batch_nbest(enc, torch.tensor(LENS))
        model.decoder.cuda()
        model.joint_network.cuda()
        got = search.search_batch_nbest(enc.cuda(), torch.tensor(LENS).cuda())
        for b, T in enumerate(LENS):
            assert_same_nbest(got[b], want[b], T)
