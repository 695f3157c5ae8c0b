"""LM shallow fusion in the plug-in's searches, on tiny random models.

Oracles, independent of the searches and of the LM adapters' incremental states:

* the LM: ESPnet's ``SequentialRNNLM`` / ``TransformerLM`` run from scratch on the
  whole prefix ``<sos> y_1 .. y_n`` for every query, token ids mapped by text;
* greedy searches: the reference greedy rules of test_decoding_search.py and
  test_tdt_search.py with every label's log-probability plus its weighted LM score
  (``lm=``), the end-of-sentence score added once;
* beam searches: every label sequence's acoustic log-probability from the exhaustive
  path enumerations of those files (and from the loss, where no frame can hold more
  labels than ``max_sym_per_frame``), plus the weighted LM log-probability of the
  whole sentence ``y </s>``.
"""

import math

import pytest
import torch
from test_decoding_search import brute_force_sequences  # noqa: I100
from test_decoding_search import one_thread  # noqa: F401 (autouse fixture)
from test_decoding_search import enc_batch as mb_enc_batch
from test_decoding_search import make_model as mb_make_model
from test_decoding_search import reference_greedy as mb_reference_greedy
from test_tdt_search import enc_batch as tdt_enc_batch
from test_tdt_search import enumerate_paths
from test_tdt_search import make_model as tdt_make_model
from test_tdt_search import reference_greedy as tdt_reference_greedy

import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)

# isort: split
from espnet2.lm.seq_rnn_lm import SequentialRNNLM
from espnet2.lm.transformer_lm import TransformerLM

from espnet_multiblank import multiblank_rnnt_loss, tdt_loss
from espnet_multiblank.decoding import (
    LabelLoopingGreedySearch,
    ShallowFusion,
    TokenLM,
)
from espnet_multiblank.espnet.inference.lm_fusion import (
    RNNLM,
    BatchScorerLM,
    build_fusion,
    lm_token_ids,
)
from espnet_multiblank.espnet.inference.search import (
    build_transducer_search,
    lattice_from_model,
)

pytestmark = pytest.mark.timeout(600)


def lm_tokens_for(asr_tokens, blank_ids, seed=0):
    """An LM token list with the ASR model's labels in another order (ids differ)."""
    labels = [t for k, t in enumerate(asr_tokens) if k not in set(blank_ids)]
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(labels), generator=g).tolist()
    return ["<blank>", "<unk>"] + [labels[i] for i in order] + ["<sos/eos>"]


def make_rnnlm(vocab, seed=0, scale=2.0, layers=1, rnn_type="lstm"):
    torch.manual_seed(seed)
    lm = SequentialRNNLM(vocab, unit=8, nlayers=layers, rnn_type=rnn_type).eval()
    with torch.no_grad():
        lm.decoder.weight.mul_(scale)
    return lm


class OracleLM:
    """Weighted LM scores from the LM run on the whole prefix (no state reuse)."""

    def __init__(self, lm, asr_tokens, lm_tokens, blank_ids, weight):
        self.lm, self.weight = lm, weight
        self.index = {t: i for i, t in enumerate(lm_tokens)}
        self.blanks = set(blank_ids)
        self.asr_tokens = asr_tokens
        self.sos = len(lm_tokens) - 1

    def lm_id(self, k):
        return self.index[self.asr_tokens[k]]

    @torch.no_grad()
    def logp(self, labels):
        """(V_lm,) float64 log P(. | <sos> labels) by a full forward pass."""
        ys = torch.tensor([[self.sos] + [self.lm_id(k) for k in labels]])
        out, _ = self.lm(ys, None)
        return out[0, -1].double().log_softmax(-1)

    def __call__(self, labels):
        lp = self.logp(labels)
        bonus = {
            k: self.weight * float(lp[self.lm_id(k)])
            for k in range(len(self.asr_tokens))
            if k not in self.blanks
        }
        return bonus, self.weight * float(lp[self.sos])

    def sentence(self, labels):
        """Weighted log P(labels </s>)."""
        total = 0.0
        for n in range(len(labels) + 1):
            lp = self.logp(labels[:n])
            nxt = self.sos if n == len(labels) else self.lm_id(labels[n])
            total += float(lp[nxt])
        return self.weight * total


def mb_setup(seed=0, weight=0.7, blank_bias=0.5, lm_seed=0):
    model = mb_make_model(seed, blank_bias=blank_bias)
    lattice = lattice_from_model(model)
    lm_tokens = lm_tokens_for(model.token_list, lattice.blank_ids, lm_seed)
    lm = make_rnnlm(len(lm_tokens), lm_seed)
    oracle = OracleLM(lm, model.token_list, lm_tokens, lattice.blank_ids, weight)
    return model, lm, lm_tokens, oracle


def tdt_setup(seed=0, weight=0.7, durations=(0, 1, 2, 3, 4), lm_seed=0):
    model = tdt_make_model(seed, durations=durations)
    lattice = lattice_from_model(model)
    lm_tokens = lm_tokens_for(model.token_list, lattice.blank_ids, lm_seed)
    lm = make_rnnlm(len(lm_tokens), lm_seed)
    oracle = OracleLM(lm, model.token_list, lm_tokens, lattice.blank_ids, weight)
    return model, lm, lm_tokens, oracle


def search(model, lm, lm_tokens, weight, **kwargs):
    return build_transducer_search(
        model, lm=lm, lm_token_list=lm_tokens, lm_weight=weight, **kwargs
    )


# ----------------------------------------------------------------- the pieces


class ConstantLM(TokenLM):
    """Scores every token (blanks included) with fixed values; no state."""

    def __init__(self, labels, end):
        self.vocab_size = len(labels)
        self.labels, self.end = torch.tensor(labels), torch.tensor(end)

    def _out(self, n):
        return self.labels.expand(n, -1).clone(), self.end.expand(n).clone(), [0] * n

    def start(self, batch, device):
        return self._out(batch)

    def step(self, labels, state):
        return self._out(labels.numel())

    def select_state(self, state, idx):
        return [state[i] for i in idx.tolist()]

    def cat_states(self, states):
        return [s for st in states for s in st]

    def scatter_state(self, state, idx, rows):
        for i, r in zip(idx.tolist(), rows):
            state[i] = r


def test_fusion_sums_weights_and_never_scores_a_blank():
    inf = float("-inf")
    a = ConstantLM([5.0, -1.0, -2.0, inf], -3.0)
    b = ConstantLM([7.0, -4.0, -0.5, -1.0], -1.0)
    fusion = ShallowFusion([a, b], [0.5, 2.0], blank_ids=[0])
    st = fusion.start(2, torch.device("cpu"))
    assert st.labels.tolist() == [[0.0, -8.5, -2.0, inf]] * 2
    assert st.end.tolist() == [-3.5, -3.5]
    # weight 0: a model's scores are not multiplied (0 * -inf would be NaN)
    st = ShallowFusion([a, b], [0.0, 1.0], [0]).start(1, torch.device("cpu"))
    assert st.labels.tolist() == [[0.0, -4.0, -0.5, -1.0]]
    off = ShallowFusion([a], [0.0], [0])
    st = off.step(torch.tensor([2]), off.start(1, torch.device("cpu")))
    assert st.labels.tolist() == [[0.0] * 4] and st.end.tolist() == [0.0]
    with pytest.raises(ValueError, match="finite"):
        ShallowFusion([a], [float("nan")], [0])
    with pytest.raises(TypeError, match="TokenLM"):
        ShallowFusion([object()], [1.0], [0])
    with pytest.raises(ValueError, match="different vocabularies"):
        ShallowFusion([a, ConstantLM([0.0] * 5, 0.0)], [1.0, 1.0], [0])


def test_search_refuses_a_fusion_that_does_not_fit():
    model, lm, lm_tokens, _ = mb_setup()
    lattice = lattice_from_model(model)
    fusion = build_fusion(lattice.blank_ids[:1], model.token_list, lm, lm_tokens)
    from espnet_multiblank.decoding import GreedySearch, JointStepper

    stepper = JointStepper(model.decoder, model.joint_network)
    with pytest.raises(ValueError, match="leave every blank"):
        GreedySearch(stepper, lattice, fusion=fusion)
    small = ShallowFusion([ConstantLM([0.0] * 5, 0.0)], [1.0], [0])
    with pytest.raises(ValueError, match="score 5 tokens, the model has 10"):
        GreedySearch(stepper, lattice, fusion=small)


def test_token_ids_are_matched_by_text():
    asr = ["<blank8>", "<blank>", "one", "two", "zz", "<sos/eos>"]
    lm = ["<blank>", "<unk>", "two", "one", "<sos/eos>"]
    assert lm_token_ids(asr, lm, blank_ids=[0, 1]) == [-1, -1, 3, 2, 1, 4]
    with pytest.raises(ValueError, match=r"lacks \['zz'\]"):
        lm_token_ids(asr, ["<blank>", "two", "one", "<sos/eos>"], [0, 1])


@pytest.mark.parametrize("kind", ["lstm", "gru", "transformer"])
def test_lm_adapters_equal_scoring_the_whole_prefix(kind):
    """start / step / select / cat / where of the adapters against full forwards."""
    model, _, lm_tokens, _ = mb_setup()
    blank_ids = lattice_from_model(model).blank_ids
    if kind == "transformer":
        torch.manual_seed(0)
        lm = TransformerLM(
            len(lm_tokens), embed_unit=8, att_unit=8, head=2, unit=16, layer=2
        ).eval()
    else:
        lm = make_rnnlm(len(lm_tokens), 1, layers=2, rnn_type=kind)
    fusion = build_fusion(blank_ids, model.token_list, lm, lm_tokens, lm_weight=1.0)
    adapter = fusion.lms[0]
    assert isinstance(adapter, BatchScorerLM if kind == "transformer" else RNNLM)
    oracle = OracleLM(lm, model.token_list, lm_tokens, blank_ids, 1.0)
    prefixes = [[], [], []]
    st = fusion.start(3, torch.device("cpu"))
    for step_labels in ([4, 5, 9], [9, 9, 6], [7, 4, 5]):
        new = fusion.step(torch.tensor(step_labels), st)
        keep = torch.tensor([True, False, True])  # row 1 keeps its old state
        st = fusion.where(keep, new, st)
        for b, k in enumerate(step_labels):
            if keep[b]:
                prefixes[b].append(k)
        for b, p in enumerate(prefixes):
            bonus, end = oracle(p)
            for k, v in bonus.items():
                assert float(st.labels[b, k]) == pytest.approx(v, abs=1e-5)
            assert float(st.end[b]) == pytest.approx(end, abs=1e-5)
            assert st.labels[b, list(blank_ids)].tolist() == [0.0] * len(blank_ids)
    # rows gathered and concatenated continue as they were
    two = fusion.cat(
        [fusion.select(st, torch.tensor([2])), fusion.select(st, torch.tensor([0]))]
    )
    two = fusion.step(torch.tensor([8, 8]), two)
    for row, b in enumerate((2, 0)):
        bonus, _ = oracle(prefixes[b] + [8])
        assert float(two.labels[row, 5]) == pytest.approx(bonus[5], abs=1e-5)


# ------------------------------------------------------------- greedy searches


def mb_greedy_searches(model, lm, lm_tokens, weight, decision, max_sym):
    """The frame-looping and label-looping greedy searches with the same fusion."""
    frame = search(
        model,
        lm,
        lm_tokens,
        weight,
        search_type="mb_greedy",
        blank_decision=decision,
        max_sym_per_frame=max_sym,
    )
    loops = [
        LabelLoopingGreedySearch(
            frame.stepper,
            frame.lattice,
            max_sym_per_frame=max_sym,
            blank_decision=decision,
            window=w,
            max_inner=k,
            fusion=frame.fusion,
        )
        for w, k in ((1, None), (4, 2))
    ]
    return frame, loops


@pytest.mark.parametrize("decision", ["total", "symbol"])
@pytest.mark.parametrize("seed", [0, 1])
def test_fused_mb_greedy_equals_the_reference_rule(seed, decision):
    model, lm, lm_tokens, oracle = mb_setup(seed, weight=0.3, blank_bias=0.0)
    frame, loops = mb_greedy_searches(model, lm, lm_tokens, 0.3, decision, 2)
    lens = [19, 33, 0, 7]
    enc, enc_lens = mb_enc_batch(seed + 60, lens)
    plain = build_transducer_search(
        model, search_type="mb_greedy", blank_decision=decision, max_sym_per_frame=2
    )
    changed = 0
    results = [frame.search_batch(enc, enc_lens)]
    results += [loop.search_batch(enc, enc_lens) for loop in loops]
    # fused hypotheses with labels: the LM state after a label matters
    assert sum(len(h.labels) for h in results[0]) >= 4
    for b, T in enumerate(lens):
        labels, score, big = mb_reference_greedy(model, enc[b, :T], decision, 2, oracle)
        alone = [loop.search(enc[b, :T])[0] for loop in loops]  # one utterance
        for h in [frame.search_one(enc[b, :T])] + [r[b] for r in results] + alone:
            assert h.labels == labels
            assert h.big_blank_emissions == big
            assert h.score == pytest.approx(score, rel=1e-5, abs=1e-4)
        changed += plain.search_one(enc[b, :T]).labels != labels
    assert changed  # the LM changes hypotheses on these cases


@pytest.mark.parametrize("decision", ["total", "symbol"])
@pytest.mark.parametrize("durations", [(0, 1, 2, 3, 4), (0, 2, 3)])
def test_fused_tdt_greedy_equals_the_reference_rule(durations, decision):
    model, lm, lm_tokens, oracle = tdt_setup(0, weight=0.3, durations=durations)
    frame = search(
        model, lm, lm_tokens, 0.3, search_type="tdt_greedy", blank_decision=decision
    )
    loop = LabelLoopingGreedySearch(
        frame.stepper, frame.lattice, blank_decision=decision, fusion=frame.fusion
    )
    plain = build_transducer_search(
        model, search_type="tdt_greedy", blank_decision=decision
    )
    lens = [21, 4, 0, 30]
    enc, enc_lens = tdt_enc_batch(3, lens)
    batch, looped = frame.search_batch(enc, enc_lens), loop.search_batch(enc, enc_lens)
    assert sum(len(h.labels) for h in batch) >= 4  # labels: the LM state matters
    changed = 0
    for b, T in enumerate(lens):
        labels, score, skipped, _ = tdt_reference_greedy(
            model, enc[b, :T], 10, decision, oracle
        )
        alone = loop.search(enc[b, :T])[0]  # one utterance
        for h in (frame.search_one(enc[b, :T]), batch[b], looped[b], alone):
            assert h.labels == labels
            assert h.frames_skipped == skipped
            assert h.score == pytest.approx(score, rel=1e-5, abs=1e-4)
        changed += plain.search_one(enc[b, :T]).labels != labels
    assert changed


def test_espnet_greedy_type_with_an_lm_runs_fused_with_espnets_rule():
    """search_type greedy on a standard model: ESPnet's greedy search would not use
    the LM; with one it runs as mb_greedy with one label per frame and the arg-max
    symbol (ESPnet's rule), fused."""
    model = mb_make_model(0, blank_id=0, durations=(), blank_bias=0.0)
    blank_ids = lattice_from_model(model).blank_ids
    lm_tokens = lm_tokens_for(model.token_list, blank_ids)
    lm = make_rnnlm(len(lm_tokens))
    oracle = OracleLM(lm, model.token_list, lm_tokens, blank_ids, 1.0)
    s = search(model, lm, lm_tokens, 1.0, search_type="greedy")
    assert type(s).__name__ == "GreedySearch" and s.fusion is not None
    assert (s.max_sym_per_frame, s.blank_decision) == (1, "symbol")
    enc, _ = mb_enc_batch(5, [25])
    labels, score, _ = mb_reference_greedy(model, enc[0], "symbol", 1, oracle)
    assert len(labels) >= 3
    (h,) = s(enc[0])
    assert h.labels == labels and h.score == pytest.approx(score, abs=1e-4)


# --------------------------------------------------------------- beam searches


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fused_wide_mb_beam_equals_acoustic_plus_lm_rescoring(seed):
    """A beam that prunes nothing: every label sequence with its exact acoustic
    log-probability plus the weighted LM log-probability of the sentence, ranked by
    that fused score (the n-best list)."""
    model = mb_make_model(seed, blank_id=1, durations=(2,), vocab=4, blank_bias=0.0)
    blank_ids = lattice_from_model(model).blank_ids
    lm_tokens = lm_tokens_for(model.token_list, blank_ids, seed)
    lm = make_rnnlm(len(lm_tokens), seed)
    oracle = OracleLM(lm, model.token_list, lm_tokens, blank_ids, 0.8)
    enc, _ = mb_enc_batch(seed, [3])
    acoustic = brute_force_sequences(model, enc[0], max_sym=2)
    wide = search(
        model,
        lm,
        lm_tokens,
        0.8,
        search_type="mb_beam",
        beam_size=100000,
        nbest=100000,
        max_sym_per_frame=2,
        blank_decision="symbol",
    )
    got = assert_exact_fused_nbest(wide(enc[0]), acoustic, oracle.sentence)
    # the loss as a second acoustic oracle, where max_sym_per_frame excludes no path
    for y in [y for y in got if len(y) <= 2]:
        logits = mb_logits(model, enc[0], list(y))
        loss = multiblank_rnnt_loss(
            logits,
            torch.tensor(list(y), dtype=torch.long).view(1, -1),
            torch.tensor([3]),
            torch.tensor([len(y)]),
            blank=1,
            big_blank_durations=[2],
            reduction="none",
        )
        fused = -float(loss[0]) + oracle.sentence(list(y))
        assert got[y] == pytest.approx(fused, rel=1e-5, abs=1e-5)


def assert_exact_fused_nbest(nbest, acoustic, lm_score):
    """A wide beam's n-best list holds every label sequence with its acoustic
    log-probability plus ``lm_score(labels)``, in that fused order. Returns {labels:
    score}."""
    got = {tuple(h.labels): h.score for h in nbest}
    assert set(got) == set(acoustic)
    for y, score in acoustic.items():
        fused = score + lm_score(list(y))
        assert got[y] == pytest.approx(fused, rel=1e-5, abs=1e-5)
    scores = [h.score for h in nbest]
    assert scores == sorted(scores, reverse=True)
    return got


def mb_logits(model, enc, labels):
    """(1, T, U + 1, V) joint-network outputs along every prefix of ``labels``."""
    dec, joint = model.decoder, model.joint_network
    with torch.no_grad():
        ys = torch.tensor([[model.blank_id] + labels])
        out, _ = dec.rnn_forward(dec.embed(ys), dec.init_state(1))  # (1, U + 1, H)
        z = joint(enc[:, None, :], out[0][None, :, :])  # (T, U + 1, V)
    return z[None].float()


@pytest.mark.parametrize("durations", [(0, 1, 2), (1, 3)])
def test_fused_wide_tdt_beam_equals_acoustic_plus_lm_rescoring(durations):
    model = tdt_make_model(1, durations=durations, vocab=3, blank_bias=0.0)
    blank_ids = lattice_from_model(model).blank_ids
    lm_tokens = lm_tokens_for(model.token_list, blank_ids)
    lm = make_rnnlm(len(lm_tokens))
    oracle = OracleLM(lm, model.token_list, lm_tokens, blank_ids, 0.8)
    enc, _ = tdt_enc_batch(1, [4])
    acoustic = enumerate_paths(model, enc[0], max_sym=1)
    wide = search(
        model,
        lm,
        lm_tokens,
        0.8,
        search_type="tdt_beam",
        beam_size=10**6,
        nbest=10**6,
        max_sym_per_frame=1,
    )
    got = assert_exact_fused_nbest(wide(enc[0]), acoustic, oracle.sentence)
    if 0 not in durations:  # no label stays: max_sym_per_frame excludes no path
        for y in got:
            logits = tdt_logits(model, enc[0], list(y))
            loss = tdt_loss(
                logits,
                torch.tensor(list(y), dtype=torch.long).view(1, -1),
                torch.tensor([4]),
                torch.tensor([len(y)]),
                blank=0,
                durations=list(durations),
                reduction="none",
            )
            fused = -float(loss[0]) + oracle.sentence(list(y))
            assert got[y] == pytest.approx(fused, rel=1e-5, abs=1e-5)


def tdt_logits(model, enc, labels):
    dec, joint = model.decoder, model.joint_network
    with torch.no_grad():
        ys = torch.tensor([[model.blank_id] + labels])
        out, _ = dec.rnn_forward(dec.embed(ys), dec.init_state(1))
        z = joint(enc[:, None, :], out[0][None, :, :])
    return z[None].float()


# ------------------------------------------------------ weight 0 and a biased LM


SEARCHES = [
    ("mb", dict(search_type="mb_greedy")),
    ("mb", dict(search_type="mb_greedy", loop_labels=True)),
    ("mb", dict(search_type="mb_beam", beam_size=4, nbest=3)),
    ("mb", dict(search_type="mb_beam", beam_size=3, blank_decision="total")),
    ("tdt", dict(search_type="tdt_greedy")),
    ("tdt", dict(search_type="tdt_greedy", loop_labels=True)),
    ("tdt", dict(search_type="tdt_beam", beam_size=4, nbest=3)),
]


@pytest.mark.parametrize("kind, conf", SEARCHES)
def test_weight_zero_gives_exactly_the_lm_free_hypotheses(kind, conf):
    model, lm, lm_tokens, _ = (mb_setup if kind == "mb" else tdt_setup)(0)
    enc_batch = mb_enc_batch if kind == "mb" else tdt_enc_batch
    fused = search(model, lm, lm_tokens, 0.0, **conf)
    plain = build_transducer_search(model, **conf)
    assert fused.fusion is not None
    lens = [17, 0, 26, 9]
    enc, enc_lens = enc_batch(8, lens)
    got = fused.search_batch(enc, enc_lens)
    want = plain.search_batch(enc, enc_lens)
    for g, w in zip(got, want):
        assert (g.yseq, g.score, g.frame) == (w.yseq, w.score, w.frame)
    for b, T in enumerate(lens):
        g, w = fused(enc[b, :T]), plain(enc[b, :T])
        assert [(h.yseq, h.score) for h in g] == [(h.yseq, h.score) for h in w]


def train_skewed_lm(vocab, sentences, steps=300, seed=0):
    """A tiny SequentialRNNLM trained on ``sentences`` (lists of LM ids), ESPnet's
    loss (``ESPnetLanguageModel``)."""
    from espnet2.lm.espnet_model import ESPnetLanguageModel

    torch.manual_seed(seed)
    model = ESPnetLanguageModel(SequentialRNNLM(vocab, unit=16, nlayers=1), vocab)
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    lengths = torch.tensor([len(s) for s in sentences])
    text = torch.nn.utils.rnn.pad_sequence(
        [torch.tensor(s) for s in sentences], batch_first=True
    )
    for _ in range(steps):
        loss, _, _ = model(text, lengths)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.lm.eval()


def test_a_biased_lm_pulls_hypotheses_towards_its_words():
    """An LM trained on skewed text (70% of its words are two labels that the
    acoustic model emits, but not most often): with it the searches emit those two
    more often, and their hypotheses are more probable under the LM."""
    from collections import Counter

    model = mb_make_model(4, blank_bias=0.5)  # emits five different labels
    blank_ids = lattice_from_model(model).blank_ids
    lm_tokens = lm_tokens_for(model.token_list, blank_ids)
    enc, enc_lens = mb_enc_batch(11, [30] * 6)
    plain_greedy = build_transducer_search(model, search_type="mb_greedy")
    counts = Counter(
        k for h in plain_greedy.search_batch(enc, enc_lens) for k in h.labels
    )
    favoured = sorted(k for k, _ in counts.most_common(3)[1:])
    labels = [k for k in range(len(model.token_list)) if k not in set(blank_ids)]
    g = torch.Generator().manual_seed(0)

    def word():
        if float(torch.rand(1, generator=g)) < 0.7:
            k = favoured[int(torch.randint(0, 2, (1,), generator=g))]
        else:
            k = labels[int(torch.randint(0, len(labels), (1,), generator=g))]
        return lm_tokens.index(model.token_list[k])

    sentences = [
        [word() for _ in range(int(n))]
        for n in torch.randint(1, 12, (128,), generator=g)
    ]
    lm = train_skewed_lm(len(lm_tokens), sentences)
    oracle = OracleLM(lm, model.token_list, lm_tokens, blank_ids, 0.5)

    def share(hyps):
        emitted = [k for h in hyps for k in h.labels]
        return sum(k in favoured for k in emitted) / max(len(emitted), 1)

    def lm_logprob(hyps):
        return sum(oracle.sentence(h.labels) for h in hyps)

    for conf in (
        dict(search_type="mb_greedy"),
        dict(search_type="mb_beam", beam_size=4),
    ):
        plain = build_transducer_search(model, **conf).search_batch(enc, enc_lens)
        fused = search(model, lm, lm_tokens, 0.5, **conf).search_batch(enc, enc_lens)
        assert sum(len(h.labels) for h in fused) > 0, conf
        assert share(fused) > share(plain) + 0.3, (conf, share(fused), share(plain))
        assert lm_logprob(fused) > lm_logprob(plain) + 5.0, conf


# ------------------------------------------------------------------ n-gram LMs


ARPA = """\\data\\
ngram 1=6
ngram 2=4

\\1-grams:
-1.2\t<unk>\t0
-99\t<s>\t-0.4
-0.9\t</s>\t0
-0.6\tt5\t-0.2
-0.8\tt8\t-0.3
-1.5\tt6\t-0.1

\\2-grams:
-0.2\t<s> t5
-0.3\tt5 t8
-0.25\tt8 </s>
-0.4\tt8 t5

\\end\\
"""


@pytest.fixture
def arpa(tmp_path):
    pytest.importorskip("kenlm", reason="the ngram extra (pip install kenlm)")
    path = tmp_path / "lm.arpa"
    path.write_text(ARPA)
    return path


class KenLMOracle:
    """Weighted next-word scores from kenlm's full-sentence score (ln)."""

    def __init__(self, path, asr_tokens, blank_ids, weight):
        import kenlm

        self.model, self.weight = kenlm.Model(str(path)), weight
        self.tokens, self.blanks = asr_tokens, set(blank_ids)

    def full(self, words, eos):
        return math.log(10) * self.model.score(" ".join(words), bos=True, eos=eos)

    def __call__(self, labels):
        words = [self.tokens[k] for k in labels]
        base = self.full(words, eos=False)
        bonus = {
            k: self.weight * (self.full(words + [t], eos=False) - base)
            for k, t in enumerate(self.tokens)
            if k not in self.blanks
        }
        return bonus, self.weight * (self.full(words, eos=True) - base)


def test_ngram_fused_greedy_equals_the_reference_rule(arpa):
    model = mb_make_model(0, blank_bias=0.0)
    blank_ids = lattice_from_model(model).blank_ids
    oracle = KenLMOracle(arpa, model.token_list, blank_ids, 0.5)
    fused = build_transducer_search(
        model, search_type="mb_greedy", ngram_file=str(arpa), ngram_weight=0.5
    )
    plain = build_transducer_search(model, search_type="mb_greedy")
    lens = [25, 12, 31]
    enc, enc_lens = mb_enc_batch(2, lens)
    batch = fused.search_batch(enc, enc_lens)
    assert sum(len(h.labels) for h in batch) >= 4  # labels: the n-gram state matters
    changed = 0
    for b, T in enumerate(lens):
        labels, score, _ = mb_reference_greedy(model, enc[b, :T], "total", 10, oracle)
        for h in (fused.search_one(enc[b, :T]), batch[b]):
            assert h.labels == labels
            assert h.score == pytest.approx(score, rel=1e-5, abs=1e-4)
        changed += plain.search_one(enc[b, :T]).labels != labels
    assert changed


def test_ngram_and_neural_lm_together_in_a_wide_beam(arpa):
    """Both LMs fused at once: acoustic + w_lm log P_lm(y </s>) + w_ng log P_ng."""
    model = tdt_make_model(2, durations=(1, 2), vocab=3, blank_bias=0.0)
    model.token_list = ["<blank>", "t5", "t8"]
    blank_ids = lattice_from_model(model).blank_ids
    lm_tokens = lm_tokens_for(model.token_list, blank_ids)
    lm = make_rnnlm(len(lm_tokens), 3)
    neural = OracleLM(lm, model.token_list, lm_tokens, blank_ids, 0.5)
    ngram = KenLMOracle(arpa, model.token_list, blank_ids, 0.7)
    enc, _ = tdt_enc_batch(4, [4])
    acoustic = enumerate_paths(model, enc[0], max_sym=1)
    wide = build_transducer_search(
        model,
        search_type="tdt_beam",
        beam_size=10**6,
        nbest=10**6,
        max_sym_per_frame=1,
        lm=lm,
        lm_token_list=lm_tokens,
        lm_weight=0.5,
        ngram_file=str(arpa),
        ngram_weight=0.7,
    )

    def both(labels):
        words = [model.token_list[k] for k in labels]
        return neural.sentence(labels) + 0.7 * ngram.full(words, eos=True)

    assert_exact_fused_nbest(wide(enc[0]), acoustic, both)


def test_ngram_refused_where_it_cannot_apply(arpa):
    """ESPnet's beam search cannot use an n-gram: refused with the option named."""
    model = mb_make_model(0, blank_id=0, durations=())
    with pytest.raises(ValueError, match="--ngram_file"):
        build_transducer_search(
            model, search_type="default", beam_size=4, ngram_file=str(arpa)
        )
