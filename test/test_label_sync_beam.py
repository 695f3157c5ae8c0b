"""Label-synchronous batched beam search (``beam_sync: "label"``).

Oracles, independent of the search's kernels:

* every returned hypothesis scores log P(y | x) as the float64 pure-PyTorch loss
  (``reference_costs`` / ``tdt_reference_costs``) computes it on the same networks'
  outputs, plus the weighted LM log P(y </s>) of an LM run on the whole sentence;
* a beam that prunes nothing returns the model's exact n-best: the n most probable
  of every label sequence up to a length, each scored by the loss;
* the timing and path statistics are those of the most probable path of the labels,
  found by enumerating every path of the lattice (Python recursion);
* the forward-sum kernels against their recursions written out term by term
  (torch.logsumexp, float64);
* ``frame_prune`` only removes paths and keeps the best hypothesis where it is
  probable; the batch, bad-input, half-precision and CUDA checks are
  test_batched_beam.py's, parametrised by rule.
"""

import itertools
import math

import pytest
import torch
from search_cases import enc_batch
from search_cases import make_mb_model as mb_make_model
from search_cases import make_tdt_model as tdt_make_model
from test_batched_beam import CASES, LENS, assert_same_nbest, mb_search, tdt_search
from test_decoding_lm import mb_setup, search, tdt_setup
from test_decoding_search import one_thread  # noqa: F401 (autouse fixture)

from espnet_multiblank.espnet.inference.search import build_transducer_search
from espnet_multiblank.lattice import TDTLattice
from espnet_multiblank.loss import (
    make_options,
    make_tdt_options,
    reference_costs,
    tdt_reference_costs,
)

pytestmark = pytest.mark.timeout(600)


def lattice_logits(search, enc, labels):
    """(T, U + 1, V') float64 joint-network logits of ``labels`` on ``enc`` (T, D)."""
    stepper = search.stepper
    with torch.no_grad():
        proj, state = search.start(1, enc.device)
        projs = [proj]
        for k in labels:
            proj, state = stepper.step(torch.tensor([k]), state)
            projs.append(proj)
        dec = torch.cat(projs, 0)  # (U + 1, J)
        enc_proj = stepper.project_enc(enc)  # (T, J)
        return stepper.joint(enc_proj.unsqueeze(1), dec.unsqueeze(0)).double()


def exact_log_prob(search, enc, labels) -> float:
    """log P(labels | enc) by the pure-PyTorch loss (float64)."""
    T = enc.size(0)
    if T == 0:
        return 0.0 if not labels else -math.inf
    acts = lattice_logits(search, enc, labels).unsqueeze(0)
    ys = torch.tensor([list(labels) or [0]])
    args = (ys, torch.tensor([T]), torch.tensor([len(labels)]))
    lattice = search.lattice
    if isinstance(lattice, TDTLattice):
        opts = make_tdt_options(lattice.blank, lattice.durations, "none")
        cost = tdt_reference_costs(acts, *args, opts)
    else:
        opts = make_options(lattice.blank, lattice.big_blank_durations, "none")
        cost = reference_costs(acts, *args, opts)
    return -float(cost[0])


def best_path(search, enc, labels):
    """The most probable path of ``labels``, by enumerating every path: (its
    log-probability, per label (frame, frames covered, arc log-prob), big blanks,
    frames skipped)."""
    lattice, T = search.lattice, enc.size(0)
    z = lattice_logits(search, enc, labels).float()
    tdt = isinstance(lattice, TDTLattice)
    if tdt:
        V = search.num_tokens
        tok = torch.log_softmax(z[..., :V], -1).tolist()
        dur = torch.log_softmax(z[..., V:], -1).tolist()
        blanks = [(e, j) for j, e in enumerate(lattice.durations) if e >= 1]
        label_durs = list(enumerate(lattice.durations))
    else:
        lp = torch.log_softmax(z, -1).tolist()
        blanks = [(1, lattice.blank)] + list(
            zip(lattice.big_blank_durations, lattice.big_blank_ids)
        )
    U, best = len(labels), [None]

    def rec(t, u, score, arcs, big, skipped):
        if t == T:
            if u == U and (best[0] is None or score > best[0][0]):
                best[0] = (score, arcs, big, skipped)
            return
        for d, k in blanks:
            if t + d <= T:
                w = tok[t][u][lattice.blank] + dur[t][u][k] if tdt else lp[t][u][k]
                rec(t + d, u, score + w, arcs, big + (d > 1), skipped + d - 1)
        if u < U:
            if tdt:
                for j, e in label_durs:
                    if t + e < T:
                        w = tok[t][u][labels[u]] + dur[t][u][j]
                        rec(
                            t + e,
                            u + 1,
                            score + w,
                            arcs + [(t, e, w)],
                            big,
                            skipped + max(e - 1, 0),
                        )
            else:
                w = lp[t][u][labels[u]]
                rec(t, u + 1, score + w, arcs + [(t, 0, w)], big, skipped)

    rec(0, 0, 0.0, [], 0, 0)
    return best[0]


def label_search(case, seed=0, **kwargs):
    make, build, _ = CASES[case]
    return build(make(seed), beam_sync="label", **kwargs)


@pytest.mark.parametrize("case", sorted(CASES))
def test_scores_are_the_losses_log_probability(case):
    search = label_search(case, beam_size=4, nbest=4)
    enc, _ = enc_batch(1, LENS)
    got = search.search_batch_nbest(enc, torch.tensor(LENS))
    assert len(got) == len(LENS)
    for b, T in enumerate(LENS):
        if case == "tdt_no_1" and T == 1:  # no blank lands on T: no path at all
            assert got[b] == [] and exact_log_prob(search, enc[b, :T], []) == -math.inf
            continue
        assert got[b], f"utterance {b} kept no hypothesis"
        assert len({tuple(h.labels) for h in got[b]}) == len(got[b])  # distinct
        scores = [h.score for h in got[b]]
        assert scores == sorted(scores, reverse=True)
        for h in got[b]:
            assert h.frame == T and h.yseq[0] == search.blank_id
            assert h.score == pytest.approx(
                exact_log_prob(search, enc[b, :T], h.labels), rel=1e-6, abs=1e-6
            )
    assert got[3][0].labels == [] and got[3][0].score == 0.0  # T = 0
    assert sum(len(h.labels) for n in got for h in n) > 0


def all_sequences(num_labels_of, max_len):
    for n in range(max_len + 1):
        yield from itertools.product(num_labels_of, repeat=n)


@pytest.mark.parametrize("case", ["standard", "multiblank", "tdt", "tdt_no_1"])
def test_wide_beam_is_the_models_exact_nbest(case):
    """A beam that prunes nothing returns the n most probable label sequences of the
    model, each with its exact probability (every sequence up to 5 labels scored by
    the loss; the n-best found must not be longer)."""
    if case.startswith("tdt"):
        durations = (0, 1, 2) if case == "tdt" else (0, 2, 3)
        model = tdt_make_model(3, durations=durations, vocab=3, blank_bias=1.0)
        search = tdt_search(model, beam_size=4096, nbest=12, beam_sync="label")
    else:
        durations = () if case == "standard" else (2, 3)
        blank = len(durations)
        model = mb_make_model(
            3, blank_id=blank, durations=durations, vocab=blank + 3, blank_bias=1.0
        )
        search = mb_search(model, beam_size=4096, nbest=12, beam_sync="label")
    labels = [k for k in range(search.num_tokens) if k not in search.lattice.blank_ids]
    lens = [4, 3]
    enc, _ = enc_batch(5, lens)
    got = search.search_batch_nbest(enc, torch.tensor(lens))
    for b, T in enumerate(lens):
        scored = sorted(
            (
                (exact_log_prob(search, enc[b, :T], list(y)), y)
                for y in all_sequences(labels, 5)
            ),
            reverse=True,
        )
        want = [(y, s) for s, y in scored if s > -math.inf][:12]
        assert all(len(h.labels) <= 5 for h in got[b])
        assert [tuple(h.labels) for h in got[b]] == [y for y, _ in want]
        for h, (_, s) in zip(got[b], want):
            assert h.score == pytest.approx(s, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("case", ["standard", "multiblank", "tdt", "tdt_no_0"])
def test_timing_is_the_most_probable_path(case):
    search = label_search(case, seed=2, beam_size=3, nbest=3)
    lens = [7, 5, 8]
    enc, _ = enc_batch(2, lens)
    got = search.search_batch_nbest(enc, torch.tensor(lens))
    checked = 0
    for b, T in enumerate(lens):
        for h in got[b]:
            score, arcs, big, skipped = best_path(search, enc[b, :T], h.labels)
            assert [a[:2] for a in h.timing] == [a[:2] for a in arcs]
            for (_, _, lp_got), (_, _, lp_want) in zip(h.timing, arcs):
                assert lp_got == pytest.approx(lp_want, rel=1e-5, abs=1e-5)
            assert (h.big_blank_emissions, h.frames_skipped) == (big, skipped)
            assert score <= h.score + 1e-6  # one path <= the sum of all
            checked += len(h.labels)
    assert checked > 0


@pytest.mark.parametrize("kind", ["mb", "tdt"])
def test_lm_fusion_scores_the_whole_sentence(kind):
    """Fused score = log P(y | x) + weight x log P_LM(y </s>); weight 0 gives the
    hypotheses without an LM; batches as alone."""
    model, lm, lm_tokens, oracle = (mb_setup if kind == "mb" else tdt_setup)(
        seed=1, weight=0.7
    )
    search_type = "mb_beam" if kind == "mb" else "tdt_beam"
    kw = dict(search_type=search_type, beam_sync="label", beam_size=3, nbest=3)
    fused = search(model, lm, lm_tokens, 0.7, **kw)
    zero = search(model, lm, lm_tokens, 0.0, **kw)
    plain = search(model, None, None, 0.0, **kw)
    lens = [14, 0, 9, 1, 12]
    enc, _ = enc_batch(3, lens)
    got = fused.search_batch_nbest(enc, torch.tensor(lens))
    for b, T in enumerate(lens):
        for h in got[b]:
            want = exact_log_prob(fused, enc[b, :T], h.labels)
            want += oracle.sentence(h.labels)
            assert h.score == pytest.approx(want, rel=1e-5, abs=1e-4)
        alone = fused.search_batch_nbest(enc[b : b + 1, :T], torch.tensor([T]))[0]
        assert_same_nbest(got[b], alone, T)
    without = plain.search_batch_nbest(enc, torch.tensor(lens))
    for b, T in enumerate(lens):
        assert_same_nbest(
            zero.search_batch_nbest(enc, torch.tensor(lens))[b], without[b], T
        )
    assert [[h.labels for h in n] for n in got] != [
        [h.labels for h in n] for n in without
    ]
    assert sum(len(h.labels) for n in got for h in n) > 0


def pruning_models(case):
    """(model, search builder) of each pruning case. ``*_cheap_labels``: the joint
    network favours one label (as a model early in training may), so the most
    probable label sequences have more labels than half the frames and the most
    probable prefixes of a step stand on early frames."""
    if case.startswith("tdt"):
        model, build, label = tdt_make_model(7), tdt_search, 1
    else:
        durations = () if case.startswith("standard") else (2, 4, 8)
        model = mb_make_model(7, blank_id=len(durations), durations=durations)
        build, label = mb_search, len(durations) + 1
    if case.endswith("cheap_labels"):
        with torch.no_grad():
            model.joint_network.lin_out.bias[label] += CHEAP_LABEL_BIAS[case]
    return model, build


#: the bias of the favoured label: the most probable label sequences have more
#: labels than half the frames
CHEAP_LABEL_BIAS = {"standard_cheap_labels": 3.0, "multiblank_cheap_labels": 4.5}
PRUNING_CASES = [
    "standard",
    "multiblank",
    "tdt",
    "standard_cheap_labels",
    "multiblank_cheap_labels",
]


@pytest.mark.parametrize("case", PRUNING_CASES)
def test_frame_pruning_only_removes_paths(case):
    """``frame_prune``: a hypothesis never scores more than with every frame (paths
    are only removed); every utterance keeps the 1-best of the search over every
    frame, its score to 1e-3 (the paths left out add under e**-12 of the greedy
    path's probability per frame), whatever the model favours."""
    model, build = pruning_models(case)
    exact = build(model, beam_size=4, nbest=2, beam_sync="label")
    pruned = build(model, beam_size=4, nbest=2, beam_sync="label", frame_prune=12.0)
    lens = [30, 17, 25, 40, 8, 12, 6, 10]
    enc, _ = enc_batch(7, lens)
    want = exact.search_batch_nbest(enc, torch.tensor(lens))
    got = pruned.search_batch_nbest(enc, torch.tensor(lens))
    for b, T in enumerate(lens):
        assert got[b], (case, b)
        for h in got[b]:
            full = exact_log_prob(exact, enc[b, :T], h.labels)
            assert h.score <= full + 1e-6 * (1 + abs(full))  # float32 log-probs
        assert got[b][0].labels == want[b][0].labels, (case, b)
        assert got[b][0].score == pytest.approx(want[b][0].score, abs=1e-3)
    if case.endswith("cheap_labels"):  # what the case is for: long hypotheses
        assert sum(len(want[b][0].labels) for b in range(len(lens))) > sum(lens) / 2


@pytest.mark.parametrize("case", ["multiblank", "tdt"])
def test_frame_pruning_with_an_lm(case):
    """With a fused LM the floor is the greedy path's fused score: the same 1-best
    and fused score as over every frame; the fused score is the oracle's (loss +
    weighted LM log P(y </s>)) up to the paths left out."""
    setup = mb_setup if case == "multiblank" else tdt_setup
    model, lm, lm_tokens, oracle = setup(3, weight=0.9)
    kind = "mb_beam" if case == "multiblank" else "tdt_beam"
    args = (model, lm, lm_tokens, 0.9)
    exact = search(*args, search_type=kind, beam_size=4, beam_sync="label")
    pruned = search(
        *args, search_type=kind, beam_size=4, beam_sync="label", frame_prune=12.0
    )
    lens = [30, 17, 25, 40, 8, 12]
    enc, _ = enc_batch(3, lens)
    want = exact.search_batch_nbest(enc, torch.tensor(lens))
    got = pruned.search_batch_nbest(enc, torch.tensor(lens))
    for b, T in enumerate(lens):
        h = got[b][0]
        assert h.labels == want[b][0].labels, b
        assert h.score == pytest.approx(want[b][0].score, abs=1e-3)
        fused = exact_log_prob(exact, enc[b, :T], h.labels) + oracle.sentence(h.labels)
        assert h.score <= fused + 1e-5 * (1 + abs(fused))


def test_frame_pruning_evaluates_fewer_frames():
    """With ``frame_prune`` a prefix is evaluated on a window of frames: fewer
    joint-network rows than every frame of every prefix (the greedy path's rows
    counted), the same 1-best here. A standard lattice: on this random multi-blank
    model the greedy path is far less probable than the sum over the alignments of
    its labels, and the floor it sets prunes little."""
    from test_batched_beam import CallCount

    model = mb_make_model(0, blank_id=0, durations=(), blank_bias=2.0)
    rows = []

    class Rows(CallCount):
        """Rows of every joint evaluation: the label rule's wide calls
        (joint_many) and the greedy path's (joint), each counted once."""

        wide = False

        def joint(self, enc_proj, dec_proj):
            if not self.wide:
                rows.append(enc_proj.numel() // enc_proj.shape[-1])
            return super().joint(enc_proj, dec_proj)

        def joint_many(self, enc_proj, dec_proj):
            rows.append(enc_proj.numel() // enc_proj.shape[-1])
            self.wide = True
            try:
                return super().joint_many(enc_proj, dec_proj)
            finally:
                self.wide = False

    def run(**kwargs):
        search = mb_search(model, beam_size=2, beam_sync="label", **kwargs)
        search.stepper = Rows(model.decoder, model.joint_network)
        rows.clear()
        out = search.search_batch_nbest(enc, torch.tensor(lens))
        return out, sum(rows)

    lens = [60, 50]
    enc, _ = enc_batch(1, lens)
    exact, all_rows = run()
    tight, tight_rows = run(frame_prune=8.0)
    assert tight_rows < all_rows
    assert [n[0].labels for n in tight] == [n[0].labels for n in exact]


def test_the_factory_and_its_checks():
    model = mb_make_model(0)
    search = build_transducer_search(
        model, search_type="mb_beam", beam_size=4, beam_sync="label"
    )
    assert search.batched and search.beam_sync == "label"
    tdt = build_transducer_search(
        tdt_make_model(0), search_type="tdt_beam", beam_size=4, beam_sync="label"
    )
    assert tdt.beam_sync == "label"
    with pytest.raises(ValueError, match="beam_sync"):
        build_transducer_search(model, search_type="mb_greedy", beam_sync="label")
    pruned = build_transducer_search(
        model, search_type="mb_beam", beam_sync="label", frame_prune=15
    )
    assert pruned.frame_prune == 15.0
    for bad in (0, -1.0, float("nan"), True, "10"):
        with pytest.raises(ValueError, match="frame_prune must be a number > 0"):
            mb_search(model, beam_sync="label", frame_prune=bad)
    with pytest.raises(ValueError, match="frame_prune applies to beam_sync 'label'"):
        mb_search(model, beam_sync="frame", frame_prune=10.0)
    with pytest.raises(ValueError, match="frame_prune prunes the label-synchronous"):
        build_transducer_search(model, search_type="mb_greedy", frame_prune=10.0)
    with pytest.raises(ValueError, match="end_rule must be 'exact'"):
        tdt_search(tdt_make_model(0), beam_sync="label", end_rule="clip")


_PREPARE_PROBE = """
import sys
sys.path.insert(0, {helpers!r})
import torch
from search_cases import enc_batch, make_mb_model
from espnet_multiblank.decoding import BeamSearch, JointStepper
from espnet_multiblank.decoding import prefix_kernels as pk
from espnet_multiblank.lattice import MultiblankLattice

kernels = (pk.level_forward, pk.child_entries, pk.best_alignments)
model = make_mb_model(0)
lattice = MultiblankLattice.create(model.blank_id, model.big_blank_durations)
stepper = JointStepper(model.decoder, model.joint_network)
BeamSearch(stepper, lattice, beam_size=3, beam_sync="frame")
print([len(k.signatures) for k in kernels])
search = BeamSearch(stepper, lattice, beam_size=3, beam_sync="label")
print([len(k.signatures) for k in kernels])
enc, lens = enc_batch(3, [9, 4, 6])
search.search_batch_nbest(enc, lens)
print([len(k.signatures) for k in kernels])
"""


def test_label_rule_compiles_its_kernels_when_built():
    """Building a label-rule search compiles the Numba kernels (or loads them from
    the cache) for the types the search passes, so that the first decoded batch
    does not pay it; the frame rule does not touch them. A fresh process: kernels
    compiled by earlier tests would hide a missing compilation."""
    import subprocess
    import sys
    from pathlib import Path

    helpers = str(Path(__file__).parent / "helpers")
    out = subprocess.run(
        [sys.executable, "-c", _PREPARE_PROBE.format(helpers=helpers)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()[-3:]
    assert lines == ["[0, 0, 0]", "[1, 1, 1]", "[1, 1, 1]"], out.stdout


def _lse(terms):
    return torch.logsumexp(torch.tensor(terms, dtype=torch.float64), 0).item()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_forward_kernels_match_a_term_by_term_sum(seed):
    """``level_forward`` and ``child_entries`` (max-shifted sums) against their
    recursions written out with torch.logsumexp in float64, on random weights with
    -inf entries and weights (unreachable frames and arcs), rows of length 0, 1 and
    T, duration sets with and without 0, and terms far apart (one term 700 nats
    below another must not turn the sum into -inf or NaN)."""
    import numpy as np

    from espnet_multiblank.decoding import prefix_kernels as pk

    g = torch.Generator().manual_seed(seed)
    A, T = 5, 9
    blank_d = np.array([1, 2, 4], np.int64)
    lens = np.array([T, 0, 1, 6, T], np.int64)
    entry = torch.randn(A, T, generator=g, dtype=torch.float64) * 3 - 2
    entry[torch.rand(A, T, generator=g) < 0.3] = -math.inf
    entry[0, 0] = -700.0  # far below the other terms it meets
    entry[4] = -math.inf  # a row nothing enters
    blank_w = (torch.randn(A, T, 3, generator=g) - 1).float()
    blank_w[torch.rand(A, T, 3, generator=g) < 0.2] = -math.inf
    alpha = np.empty((A, T))
    end = np.empty(A)
    pk.level_forward(entry.numpy(), blank_w.numpy(), blank_d, lens, alpha, end)
    ref = torch.full((A, T), -math.inf, dtype=torch.float64)
    ref_end = []
    for a in range(A):
        for t in range(int(lens[a])):
            terms = [entry[a, t].item()]
            for j, d in enumerate(blank_d):
                if t - d >= 0:
                    terms.append(ref[a, t - d].item() + blank_w[a, t - d, j].item())
            ref[a, t] = _lse(terms)
        ta = int(lens[a])
        terms = [
            ref[a, ta - d].item() + blank_w[a, ta - d, j].item()
            for j, d in enumerate(blank_d)
            if ta - d >= 0
        ]
        ref_end.append(_lse(terms) if terms else -math.inf)
    torch.testing.assert_close(torch.from_numpy(alpha), ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        torch.from_numpy(end), torch.tensor(ref_end, dtype=torch.float64)
    )
    assert not np.isnan(alpha).any() and not np.isnan(end).any()

    for label_d in (np.array([0], np.int64), np.array([0, 1, 3], np.int64)):
        C = 6
        parent = np.array([0, 0, 2, 3, 4, 1], np.int64)
        child_lens = lens[parent]
        label_w = (torch.randn(C, T, len(label_d), generator=g) - 1).float()
        label_w[torch.rand(C, T, len(label_d), generator=g) < 0.2] = -math.inf
        got = np.empty((C, T))
        pk.child_entries(alpha, parent, label_w.numpy(), label_d, child_lens, got)
        want = torch.full((C, T), -math.inf, dtype=torch.float64)
        for c in range(C):
            for t in range(int(child_lens[c])):
                terms = [
                    alpha[parent[c], t - e] + label_w[c, t - e, i].item()
                    for i, e in enumerate(label_d)
                    if t - e >= 0
                ]
                want[c, t] = _lse(terms) if terms else -math.inf
        torch.testing.assert_close(torch.from_numpy(got), want, rtol=1e-12, atol=1e-12)
        assert not np.isnan(got).any()
