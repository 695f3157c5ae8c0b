"""Batched beam search with fused language models (ESPnet LSTM and transformer LMs,
KenLM n-grams, both at once), for both pruning rules.

Oracles: ``beam_sync: "frame"``: the one-utterance beam search with the same fusion
(tested against LM oracles in test_decoding_lm.py); ``beam_sync: "step"``: the step
rule written again (test_batched_beam.py's reference) with each label's weighted LM
score from the LM run on the whole prefix, and the end-of-sentence score once at T.
Also: the LMs are stepped once per search step for every utterance, LM weight 0
gives the LM-free hypotheses, an n-gram's states in a batch.
"""

import pytest
import torch
from search_cases import enc_batch
from test_batched_beam import mb_arcs  # noqa: I100
from test_batched_beam import assert_same_nbest, reference_step_beam, tdt_arcs
from test_decoding_lm import arpa  # noqa: F401 (fixture: an ARPA file, kenlm)
from test_decoding_lm import (
    OracleLM,
    lm_tokens_for,
    make_rnnlm,
    mb_setup,
    search,
    tdt_setup,
)
from test_decoding_search import one_thread  # noqa: F401 (autouse fixture)

import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)

# isort: split
from espnet2.lm.transformer_lm import TransformerLM

from espnet_multiblank.decoding import ShallowFusion
from espnet_multiblank.espnet.inference.search import lattice_from_model

pytestmark = pytest.mark.timeout(600)

LENS = [14, 0, 9, 1, 12]


def setups(kind, lm_kind="lstm"):
    model, lm, lm_tokens, oracle = (mb_setup if kind == "mb" else tdt_setup)(
        seed=1, weight=0.7
    )
    if lm_kind == "transformer":
        torch.manual_seed(0)
        lm = TransformerLM(
            len(lm_tokens), embed_unit=8, att_unit=8, head=2, unit=16, layer=2
        ).eval()
        blank_ids = lattice_from_model(model).blank_ids
        oracle = OracleLM(lm, model.token_list, lm_tokens, blank_ids, 0.7)
    return model, lm, lm_tokens, oracle, enc_batch


def beam(model, lm, lm_tokens, weight, kind, sync, **kwargs):
    return search(
        model,
        lm,
        lm_tokens,
        weight,
        search_type="mb_beam" if kind == "mb" else "tdt_beam",
        beam_sync=sync,
        **kwargs,
    )


@pytest.mark.parametrize("kind", ["mb", "tdt"])
@pytest.mark.parametrize("lm_kind", ["lstm", "transformer"])
def test_frame_rule_with_an_lm_equals_one_utterance_search(kind, lm_kind):
    model, lm, lm_tokens, _, enc_batch = setups(kind, lm_kind)
    fused = beam(model, lm, lm_tokens, 0.7, kind, "frame", beam_size=3, nbest=5)
    enc, _ = enc_batch(3, LENS)
    got = fused.search_batch_nbest(enc, torch.tensor(LENS))
    for b, T in enumerate(LENS):
        assert_same_nbest(got[b], fused.search(enc[b, :T]), T)
    assert sum(len(h.labels) for n in got for h in n) > 0


def with_lm(arcs, oracle, blanks):
    """The arcs of the step rule's reference with each label's weighted LM score
    (from the LM run on the whole prefix) added; the hypothesis's labels are passed
    as the prediction network's output is: through ``out``."""

    def fused(enc_t, out, n, max_sym, room):
        dec_out, labels = out
        bonus, _ = oracle(list(labels))
        return [
            (k, e, lp + (0.0 if k in blanks else bonus[k]))
            for k, e, lp in arcs(enc_t, dec_out, n, max_sym, room)
        ]

    return fused


class _Out:
    """``out[0, 0]`` of a prediction step: (the network's output, the labels)."""

    def __init__(self, value):
        self.value = value

    def __getitem__(self, index):
        return self.value


class LabelsTracked:
    """A prediction network whose output also carries the labels so far (so that
    the reference's arcs can ask the LM oracle)."""

    def __init__(self, dec, blank):
        self.dec, self.blank, self.odim = dec, blank, dec.odim

    def embed(self, k):
        return k

    def init_state(self, batch):
        return (self.dec.init_state(batch), ())

    def rnn_forward(self, k, state):
        (inner, labels), label = state, int(k[0, 0])
        out, inner = self.dec.rnn_forward(self.dec.embed(k), inner)
        if label != self.blank:  # the start symbol is not a label
            labels = labels + (label,)
        return _Out((out[0, 0], labels)), (inner, labels)


@pytest.mark.parametrize("kind", ["mb", "tdt"])
def test_step_rule_with_an_lm_follows_the_rule_written_again(kind):
    model, lm, lm_tokens, oracle, enc_batch = setups(kind)
    fused = beam(model, lm, lm_tokens, 0.7, kind, "step", beam_size=3, nbest=3)
    arcs, blanks = (mb_arcs if kind == "mb" else tdt_arcs)(model, "symbol")
    ref_model = type(model)(**vars(model))
    ref_model.decoder = LabelsTracked(model.decoder, model.blank_id)
    enc, _ = enc_batch(4, LENS)
    got = fused.search_batch_nbest(enc, torch.tensor(LENS))
    for b, T in enumerate(LENS):
        want = reference_step_beam(
            ref_model,
            with_lm(arcs, oracle, blanks),
            blanks,
            enc[b, :T],
            3,
            10,
            end=lambda labels: oracle(list(labels))[1],
        )
        assert [h.labels for h in got[b]] == [list(w["y"]) for w in want]
        for h, w in zip(got[b], want):
            assert h.score == pytest.approx(w["s"], rel=1e-5, abs=1e-4)
    assert sum(len(h.labels) for n in got for h in n) > 0


@pytest.mark.parametrize("sync", ["frame", "step"])
def test_lm_weight_zero_and_batch_exact(sync):
    model, lm, lm_tokens, _, enc_batch = setups("tdt")
    plain = beam(model, None, None, 0.0, "tdt", sync, beam_size=3, nbest=3)
    zero = beam(model, lm, lm_tokens, 0.0, "tdt", sync, beam_size=3, nbest=3)
    fused = beam(model, lm, lm_tokens, 0.7, "tdt", sync, beam_size=3, nbest=3)
    enc, _ = enc_batch(5, LENS)
    lens = torch.tensor(LENS)
    want = plain.search_batch_nbest(enc, lens)
    got = zero.search_batch_nbest(enc, lens)
    batch = fused.search_batch_nbest(enc, lens)
    for b, T in enumerate(LENS):
        assert_same_nbest(got[b], want[b], T)
        alone = fused.search_batch_nbest(enc[b : b + 1, :T], torch.tensor([T]))[0]
        assert_same_nbest(batch[b], alone, T)
    assert [n[0].labels for n in batch] != [n[0].labels for n in want]


class CountingFusion(ShallowFusion):
    calls = 0

    def step(self, labels, state):
        CountingFusion.calls += 1
        return super().step(labels, state)


@pytest.mark.parametrize("sync", ["frame", "step"])
def test_the_lm_is_stepped_once_per_search_step(sync, monkeypatch):
    from espnet_multiblank.decoding.beam_run import BeamRun

    model, lm, lm_tokens, _, enc_batch = setups("mb")
    fused = beam(model, lm, lm_tokens, 0.7, "mb", sync, beam_size=4)
    fused.fusion.__class__ = CountingFusion
    steps = []
    expand = BeamRun.expand
    monkeypatch.setattr(
        BeamRun, "expand", lambda run, *a, **k: steps.append(1) or expand(run, *a, **k)
    )
    enc, _ = enc_batch(2, LENS)
    CountingFusion.calls = 0
    fused.search_batch_nbest(enc, torch.tensor(LENS))
    assert 0 < CountingFusion.calls <= len(steps)


@pytest.mark.parametrize("sync", ["frame", "step"])
def test_ngram_and_neural_lm_together(arpa, sync):  # noqa: F811 (the fixture)
    from search_cases import make_tdt_model as tdt_make_model

    from espnet_multiblank.espnet.inference.search import build_transducer_search

    model = tdt_make_model(2, durations=(0, 1, 2), vocab=3, blank_bias=0.0)
    model.token_list = ["<blank>", "t5", "t8"]
    blank_ids = lattice_from_model(model).blank_ids
    lm_tokens = lm_tokens_for(model.token_list, blank_ids)
    both = build_transducer_search(
        model,
        search_type="tdt_beam",
        beam_size=3,
        nbest=3,
        lm=make_rnnlm(len(lm_tokens), 3),
        lm_token_list=lm_tokens,
        lm_weight=0.5,
        ngram_file=str(arpa),
        ngram_weight=0.7,
        beam_sync=sync,
    )
    enc, _ = enc_batch(4, LENS)
    got = both.search_batch_nbest(enc, torch.tensor(LENS))
    for b, T in enumerate(LENS):
        assert_same_nbest(got[b], both.search(enc[b, :T]), T)
