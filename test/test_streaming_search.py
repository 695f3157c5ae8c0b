"""Streaming searches (decoding/streaming.py) against the offline searches.

The oracle is the offline search on the same projected encoder frames
(``search_projected``, or for the one-utterance loop's streams that loop on each row,
``helpers/one_loop.py``): a stream's final hypothesis must be identical (labels,
score, frames, counts) whatever the chunks the frames arrive in, for every lattice,
window and inner-loop limit, with LM fusion, for rows that start and end at any time
in a batch; its provisional labels must be the offline search's on the frames
received so far. A version of the streaming search that decides one frame too early
is shown to disagree (the look-ahead is needed).
"""

import random

import pytest
import torch
from one_loop import one_loop_projected
from test_decoding_lm import lm_tokens_for, make_rnnlm
from test_label_looping import D_ENC, mb_model, searches, tdt_model

from espnet_multiblank.decoding import BeamSearch, GreedySearch
from espnet_multiblank.decoding.label_looping import LabelLoopingGreedySearch
from espnet_multiblank.decoding.streaming import (
    StreamingBeamSearch,
    StreamingGreedySearch,
    StreamingRowGreedySearch,
    decision_lookahead,
    streamable,
    streaming_rows,
)
from espnet_multiblank.espnet.inference.search import (
    build_transducer_search,
    lattice_from_model,
)

pytestmark = pytest.mark.timeout(600)

MODELS = {
    "standard": lambda seed: mb_model(seed, durations=()),
    "multiblank": lambda seed: mb_model(seed),
    "multiblank_3": lambda seed: mb_model(seed, durations=(3,)),
    "tdt_0_4": lambda seed: tdt_model(seed),
    "tdt_2_3": lambda seed: tdt_model(seed, durations=(2, 3)),
}
LOOPS = [(None, None), (1, 1), (1, 10**6), (3, 2), (5, 10**6)]


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def frames_of(search, lens, seed):
    g = torch.Generator().manual_seed(seed)
    enc = torch.randn(len(lens), max(lens + [1]), D_ENC, generator=g)
    return search.stepper.project_enc(enc)


def same(got, want):
    assert got.yseq == want.yseq
    assert got.score == want.score  # bit for bit: the same arcs in the same order
    assert got.frame == want.frame
    assert got.frames_skipped == want.frames_skipped
    assert got.big_blank_emissions == want.big_blank_emissions
    assert got.num_sym_frame == want.num_sym_frame
    assert torch.equal(got.dec_proj, want.dec_proj)
    # each label's frame, the frames its arc covers, its acoustic log-probability
    assert got.timing == want.timing and len(got.timing) == len(got.yseq) - 1


def offline(search, proj, lens):
    """The oracle of ``search``'s streams on these frames: a label-looping search's
    batch loops (``search_projected``), a greedy search's one-utterance loop on each
    row (what its row streams run)."""
    if isinstance(search, LabelLoopingGreedySearch):
        return search.search_projected(proj, lens)
    return one_loop_projected(search, proj, lens)


def stream_rows(search, proj, lens, seed, check_provisional=False, device="cpu"):
    """Feed each row its frames in random chunks (0-5 frames, the end at a random
    later call), one ``advance`` per round; returns the final hypotheses. A
    frame-looping ``search`` streams through :class:`StreamingRowGreedySearch`
    (:func:`streaming_rows` gives it); ``device`` is where the streams keep their
    state (``proj``'s device)."""
    B = len(lens)
    kind = (
        StreamingGreedySearch
        if isinstance(search, LabelLoopingGreedySearch)
        else StreamingRowGreedySearch
    )
    st = streaming_rows(search, B, device)
    assert type(st) is kind
    rng = random.Random(seed)
    pos, done = [0] * B, [False] * B
    while not all(done):
        for b, T in enumerate(lens):
            if done[b]:
                continue
            n = min(rng.randint(0, 5), T - pos[b])
            st.append(b, proj[b, pos[b] : pos[b] + n])
            pos[b] += n
            if pos[b] == T and rng.random() < 0.6:
                st.end(b)
                done[b] = True
        st.advance()
        if check_provisional:
            got = st.provisional()
            want = offline(search, proj, torch.tensor(pos))
            assert got == [h.labels for h in want]
    return [st.hypothesis(b) for b in range(B)]


@pytest.mark.parametrize("window,max_inner", LOOPS)
@pytest.mark.parametrize("kind", list(MODELS))
def test_final_hypotheses_equal_the_offline_search(kind, window, max_inner):
    lens = [23, 0, 1, 17, 40]
    for seed in range(2):
        _, search = searches(MODELS[kind](seed), window=window, max_inner=max_inner)
        proj = frames_of(search, lens, seed)
        want = offline(search, proj, torch.tensor(lens))
        for got, w in zip(stream_rows(search, proj, lens, seed), want):
            same(got, w)


@pytest.mark.parametrize("window", [1, 4])
@pytest.mark.parametrize("kind", ["standard", "multiblank", "tdt_0_4"])
def test_provisional_labels_are_the_offline_search_on_the_frames_so_far(kind, window):
    lens = [30, 9, 21]
    _, search = searches(MODELS[kind](3), window=window, max_inner=2)
    proj = frames_of(search, lens, 3)
    stream_rows(search, proj, lens, 3, check_provisional=True)


@pytest.mark.parametrize("decision", ["total", "symbol"])
@pytest.mark.parametrize("kind", list(MODELS))
def test_one_utterance_loop_streams_exactly(kind, decision):
    """The one-utterance loop (StreamingRowGreedySearch): final hypotheses equal
    ``search_one`` on the same frames bit for bit, provisional labels equal it on
    the frames so far (and asking for them changes nothing), at max_sym 1 and 3."""
    lens = [23, 0, 1, 17, 40]
    for seed, max_sym in ((0, 1), (1, 3)):
        model = MODELS[kind](seed)
        search, _ = searches(model, max_sym=max_sym, blank_decision=decision)
        if kind.startswith("tdt"):
            search.blank_decision = decision
        proj = frames_of(search, lens, seed)
        want = offline(search, proj, torch.tensor(lens))
        for check in (False, True):
            got = stream_rows(search, proj, lens, seed, check_provisional=check)
            for g, w in zip(got, want):
                same(g, w)


@pytest.mark.parametrize("decision", ["total", "symbol"])
@pytest.mark.parametrize("kind", ["multiblank", "multiblank_3", "tdt_0_4", "tdt_2_3"])
def test_one_utterance_loop_decides_inside_the_lookahead(kind, decision):
    """Fed one frame at a time, the loop takes steps at frames t > N - L where no
    T can change them (some with a score T decides, held back), and what it has
    decided is never taken back: the decided labels are always a prefix of the
    final ones."""
    lens = [40] * 4
    inside = held = 0
    for seed in range(3):
        search, _ = searches(MODELS[kind](seed), max_sym=2, blank_decision=decision)
        if kind.startswith("tdt"):
            search.blank_decision = decision
        proj = frames_of(search, lens, seed)
        want = offline(search, proj, torch.tensor(lens))
        st = StreamingRowGreedySearch(search, len(lens), "cpu")
        L = st.lookahead
        decided = [[] for _ in lens]
        for t in range(40):
            for b in range(len(lens)):
                st.append(b, proj[b, t : t + 1])
            st.advance()
            for b, run in enumerate(st.runs):
                inside += run.hyp.frame > t + 1 - L
                held += bool(run.terms)
                decided[b].append(list(st.tokens[b]))
        for b in range(len(lens)):
            st.end(b)
        st.advance()
        for b in range(len(lens)):
            same(st.hypothesis(b), want[b])
            final = want[b].labels
            assert all(final[: len(d)] == d for d in decided[b])
    assert inside > 0
    if decision == "total":
        assert held > 0


@pytest.mark.parametrize("kind", ["multiblank", "tdt"])
def test_one_utterance_loop_cache_serves_only_the_same_step(kind):
    """A stream's runs share the joint and prediction outputs they compute
    (StepCache); with two or three tokens, frame-by-frame feeding and a provisional
    run after every frame, provisional runs and the decided run reach the same
    frame with other labels: a cache keyed by anything less than the label
    sequence serves the wrong outputs (it did, with the key (t, number of
    labels)), so the streamed hypotheses must still be the offline ones."""
    lens = [30] * 4
    for seed in range(12):
        if kind == "tdt":
            model = tdt_model(seed, vocab=3, blank_bias=0.0)
        else:
            model = mb_model(seed, vocab=6, blank_bias=0.0)
        search, _ = searches(model, max_sym=2)
        proj = frames_of(search, lens, seed)
        want = offline(search, proj, torch.tensor(lens))
        st = StreamingRowGreedySearch(search, len(lens), "cpu")
        for t in range(30):
            for b in range(len(lens)):
                st.append(b, proj[b, t : t + 1])
            st.advance()
            st.provisional()
        for b in range(len(lens)):
            st.end(b)
        st.advance()
        for b in range(len(lens)):
            same(st.hypothesis(b), want[b])


def test_one_utterance_loop_provisional_runs_only_the_rows_asked():
    search, _ = searches(MODELS["multiblank"](0))
    lens = [30, 30]
    proj = frames_of(search, lens, 0)
    st = StreamingRowGreedySearch(search, 2, "cpu")
    for b in range(2):
        st.append(b, proj[b, :16])
    st.advance()
    got = st.provisional([1])
    want = offline(search, proj[:, :16], torch.tensor([16, 16]))
    # (with these frames neither row has decided all of the labels so far)
    assert all(st.tokens[b] != want[b].labels for b in range(2))
    assert got[0] == st.tokens[0]  # not asked: its decided labels
    assert got[1] == want[1].labels
    assert st.provisional() == [h.labels for h in want]


def test_one_utterance_loop_fuses_language_models_exactly():
    for kind, greedy in (("multiblank", "mb_greedy"), ("tdt_0_4", "tdt_greedy")):
        search = fused_search(MODELS[kind](2), greedy, max_sym_per_frame=3)
        assert search.fusion is not None and not isinstance(
            search, LabelLoopingGreedySearch
        )
        lens = [19, 33, 0]
        proj = frames_of(search, lens, 2)
        want = offline(search, proj, torch.tensor(lens))
        for got, w in zip(stream_rows(search, proj, lens, 2, True), want):
            same(got, w)


def test_one_utterance_loop_restarts_rows():
    search, _ = searches(MODELS["multiblank"](1))
    lens = [25, 12]
    proj = frames_of(search, lens, 5)
    want = offline(search, proj, torch.tensor(lens))
    st = StreamingRowGreedySearch(search, 2, "cpu")
    for b in range(2):  # a first stream in each row, left half way
        st.append(b, frames_of(search, lens, 6)[b, :10])
    st.advance()
    st.reset([0, 1])
    for b, T in enumerate(lens):
        st.append(b, proj[b, :T], final=True)
    st.advance()
    assert all(st.done(b) for b in range(2))
    for b in range(2):
        same(st.hypothesis(b), want[b])


def test_rows_restart_and_other_rows_do_not_matter():
    """A row reset for a new stream decodes it as a fresh offline row, whatever
    the other rows hold (the batch's tensors have a fixed size)."""
    _, search = searches(MODELS["multiblank"](1))
    lens = [25, 12, 31]
    proj = frames_of(search, lens, 5)
    other = frames_of(search, lens, 6)
    want = offline(search, proj, torch.tensor(lens))
    st = StreamingGreedySearch(search, 3, "cpu")
    # a first stream in every row (other frames), ended; then the real ones
    for b in range(3):
        st.append(b, other[b, : lens[b] // 2])
        st.end(b)
    st.advance()
    st.reset([0, 1, 2])
    for step in range(0, 32, 3):
        for b, T in enumerate(lens):
            st.append(b, proj[b, min(step, T) : min(step + 3, T)])
        st.advance()
    for b in range(3):
        st.end(b)
    st.advance()
    for b in range(3):
        same(st.hypothesis(b), want[b])


def fused_search(model, search_type, seed=0, **kwargs):
    lattice = lattice_from_model(model)
    lm_tokens = lm_tokens_for(model.token_list, lattice.blank_ids, seed)
    return build_transducer_search(
        model,
        search_type=search_type,
        lm=make_rnnlm(len(lm_tokens), seed),
        lm_token_list=lm_tokens,
        lm_weight=0.5,
        **kwargs,
    )


@pytest.mark.parametrize("kind", ["multiblank", "tdt_0_4"])
def test_language_model_fusion_streams_exactly(kind):
    model = MODELS[kind](2)
    greedy = "tdt_greedy" if kind.startswith("tdt") else "mb_greedy"
    search = fused_search(model, greedy, loop_labels=True, max_sym_per_frame=3)
    assert search.fusion is not None
    lens = [19, 33, 0]
    proj = frames_of(search, lens, 2)
    want = offline(search, proj, torch.tensor(lens))
    for got, w in zip(stream_rows(search, proj, lens, 2), want):
        same(got, w)


def stream_beam(sb, projs, seed, check=()):
    """Reset every row of ``sb`` (a :class:`StreamingBeamSearch`) and feed row b
    the (T_b, J) frames ``projs[b]`` in random chunks (0-4 frames, the end at a
    random later call), one ``advance`` per round; the provisional labels of the
    rows in ``check`` are checked after every round (the offline search on the
    frames so far). Returns each row's n-best list."""
    search, B = sb.search, len(projs)
    sb.reset(range(B))
    rng = random.Random(seed)
    pos, done = [0] * B, [False] * B
    while not all(done):
        for b, proj in enumerate(projs):
            if done[b]:
                continue
            n = min(rng.randint(0, 4), proj.size(0) - pos[b])
            sb.append(b, proj[pos[b] : pos[b] + n])
            pos[b] += n
            if pos[b] == proj.size(0) and rng.random() < 0.5:
                sb.end(b)
                done[b] = True
        sb.advance()
        assert [sb.done(b) for b in range(B)] == done
        if check:
            got = sb.provisional(check)
            for b in check:
                want = search.nbest_projected(projs[b][: pos[b]])[0].labels
                assert got[b] == want
            assert all(got[b] == [] for b in range(B) if b not in check)
    assert sb.tokens == [[]] * B  # a beam decides nothing before its stream ends
    for b in range(B):
        assert sb.hypothesis(b) is sb.hypotheses(b)[0]
    return [sb.hypotheses(b) for b in range(B)]


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("kind", ["standard", "multiblank", "tdt_0_4", "tdt_2_3"])
def test_beam_search_streams_exactly(kind, fused, monkeypatch):
    # frame buffers of 2 frames at first: the 26-frame stream grows them 4 times
    monkeypatch.setattr(StreamingBeamSearch, "initial_frames", 2)
    model = MODELS[kind](4)
    tdt = kind.startswith("tdt")
    search_type = "tdt_beam" if tdt else "mb_beam"
    kwargs = dict(beam_size=3, nbest=3)
    if fused:
        search = fused_search(model, search_type, **kwargs)
    else:
        search = build_transducer_search(model, search_type=search_type, **kwargs)
    assert isinstance(search, BeamSearch)
    assert search.lattice.kind == ("tdt" if tdt else "multiblank")
    g = torch.Generator().manual_seed(4)
    projs = [
        search.stepper.project_enc(torch.randn(T, D_ENC, generator=g))
        for T in (0, 1, 7, 26)
    ]
    want = [
        [(h.yseq, h.score, h.frame, h.timing) for h in search.nbest_projected(p)]
        for p in projs
    ]
    sb = streaming_rows(search, len(projs), "cpu")
    assert type(sb) is StreamingBeamSearch
    # the rows side by side, then restarted with each other's utterances
    for order, seed, check in ((projs, 4, [3]), (projs[::-1], 5, [0])):
        got = stream_beam(sb, order, seed, check)
        wanted = want if order is projs else want[::-1]
        assert [
            [(h.yseq, h.score, h.frame, h.timing) for h in nbest] for nbest in got
        ] == wanted


def test_step_pruned_beam_does_not_stream():
    """beam_sync: step keeps no per-frame queues: the streaming beam refuses it
    rather than streaming the frame rule under the step rule's name."""
    from espnet_multiblank.decoding.streaming import StreamingBeamSearch

    model = MODELS["multiblank"](4)
    search = build_transducer_search(
        model, search_type="mb_beam", beam_size=2, beam_sync="step"
    )
    with pytest.raises(ValueError, match="beam_sync must be 'frame'"):
        StreamingBeamSearch(search, 1, "cpu")


def test_lookahead_values():
    _, std = searches(MODELS["standard"](0))
    _, mb = searches(MODELS["multiblank"](0))
    _, tdt = searches(MODELS["tdt_0_4"](0))
    beam = build_transducer_search(
        MODELS["multiblank"](0), search_type="mb_beam", beam_size=2
    )
    assert [decision_lookahead(s) for s in (std, mb, tdt, beam)] == [1, 8, 5, 9]


@pytest.mark.parametrize("kind", ["multiblank", "tdt_0_4"])
def test_deciding_one_frame_early_changes_hypotheses(kind):
    """The look-ahead is needed: with one frame less the end rule is applied at
    frames it does not apply to, and some streams decode differently."""
    lens = [40] * 8
    differ = 0
    for seed in range(6):
        _, search = searches(MODELS[kind](seed), window=1)
        proj = frames_of(search, lens, seed)
        want = offline(search, proj, torch.tensor(lens))
        st = StreamingGreedySearch(search, len(lens), "cpu")
        st.lookahead -= 1
        for t in range(40):
            for b in range(len(lens)):
                st.append(b, proj[b, t : t + 1])
            st.advance()
        for b in range(len(lens)):
            st.end(b)
        st.advance()
        got = [st.hypothesis(b) for b in range(len(lens))]
        differ += sum(g.yseq != w.yseq or g.score != w.score for g, w in zip(got, want))
    assert differ > 0


def test_bad_use():
    _, search = searches(MODELS["multiblank"](0))
    st = StreamingGreedySearch(search, 2, "cpu")
    with pytest.raises(ValueError, match="enc_proj"):
        st.append(0, torch.zeros(3))
    st.append(0, torch.zeros(2, 12))
    with pytest.raises(ValueError, match=r"\(n, 12\)"):
        st.append(1, torch.zeros(2, 5))
    with pytest.raises(ValueError, match="not complete"):
        st.hypothesis(0)
    st.end(0)
    with pytest.raises(ValueError, match="ended"):
        st.append(0, torch.zeros(1, 12))
    with pytest.raises(TypeError, match="LabelLoopingGreedySearch"):
        StreamingGreedySearch(object(), 1, "cpu")
    with pytest.raises(ValueError, match="batch"):
        StreamingGreedySearch(search, 0, "cpu")
    beam = build_transducer_search(
        MODELS["multiblank"](0), search_type="mb_beam", beam_size=2
    )
    sb = StreamingBeamSearch(beam, 2, "cpu")
    with pytest.raises(ValueError, match="row 1 is not complete: its stream has not"):
        sb.hypotheses(1)
    with pytest.raises(ValueError, match="not ended"):
        sb.hypothesis(0)
    sb.append(0, torch.zeros(2, 12))
    with pytest.raises(ValueError, match=r"enc_proj must be \(n, 12\)"):
        sb.append(0, torch.zeros(2, 5))
    sb.end(0)
    with pytest.raises(ValueError, match="row 0: its stream has ended"):
        sb.append(0, torch.zeros(1, 12))
    with pytest.raises(TypeError, match="search must be a"):
        StreamingBeamSearch(search, 1, "cpu")
    with pytest.raises(ValueError, match="batch"):
        StreamingBeamSearch(beam, "cpu", "cpu")
    with pytest.raises(TypeError, match="no streaming search"):
        streaming_rows(object(), 1, "cpu")


def test_streamable_searches():
    """A frame-looping search streams as label-looping with a one-frame window (or
    as it is, one_loop), a label-looping one as it is (or its one-utterance
    search); others as they are."""
    frame, label = searches(MODELS["tdt_0_4"](0), max_sym=3, window=3)
    beam = build_transducer_search(
        MODELS["multiblank"](0), search_type="mb_beam", beam_size=2
    )
    assert streamable(frame, one_loop=True) is frame
    assert streamable(label, one_loop=False) is label
    one = streamable(label, one_loop=True)
    assert type(one) is GreedySearch and one.settings() == label.settings()
    assert all(streamable(beam, one_loop=o) is beam for o in (False, True))
    looping = streamable(frame, one_loop=False)
    assert type(looping) is type(label) and looping.window == 1
    for name in ("stepper", "lattice", "fusion"):
        assert getattr(looping, name) is getattr(frame, name)
    for name in ("max_sym_per_frame", "blank_decision", "end_rule"):
        assert getattr(looping, name) == getattr(frame, name)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("kind", ["standard", "multiblank", "tdt_0_4"])
def test_cuda_streams_match_the_cpu_offline_search(kind):
    """A GPU's streams (the label-looping batch on CUDA tensors) end where the
    offline search on the CPU ends: same labels, frames and skips; scores within
    float32 rounding of another summation order."""
    lens = [23, 0, 1, 17, 40, 9, 31, 2]
    model = MODELS[kind](0)
    _, search = searches(model)
    proj = frames_of(search, lens, 0)
    want = offline(search, proj, torch.tensor(lens))
    model.decoder.cuda()
    model.joint_network.cuda()
    got = stream_rows(search, proj.cuda(), lens, 0, device="cuda")
    for g, w in zip(got, want):
        assert g.yseq == w.yseq and g.frame == w.frame
        assert g.frames_skipped == w.frames_skipped
        assert g.score == pytest.approx(w.score, rel=1e-4, abs=1e-4)


@pytest.mark.parametrize("dim", [0, 1])
def test_frame_buffers_grow_by_doubling_and_keep_what_is_used(dim):
    from espnet_multiblank.decoding.streaming import frames_with_room

    buf = torch.arange(2 * 5 * 3.0).view(2, 5, 3)
    buf = buf[0] if dim == 0 else buf  # (5, 3) or (2, 5, 3)
    assert frames_with_room(buf, 4, 5, 64, dim) is buf  # room enough: no copy
    grown = frames_with_room(buf, 4, 6, 2, dim)
    assert grown.size(dim) == 10  # twice the capacity
    assert torch.equal(grown.narrow(dim, 0, 4), buf.narrow(dim, 0, 4))
    assert not grown.narrow(dim, 4, 6).any()  # only the used frames are copied
    assert frames_with_room(buf, 0, 30, 2, dim).size(dim) == 30  # as many as asked
    assert frames_with_room(buf.narrow(dim, 0, 0), 0, 1, 64, dim).size(dim) == 64
