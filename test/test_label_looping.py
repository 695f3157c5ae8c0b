"""Label-looping greedy search against the one-utterance (frame-looping) searches.

The oracle is the one-utterance greedy search of each lattice, run on every utterance
alone (``GreedySearch.search_one``; it is tested against independent references in
test_decoding_search.py and test_tdt_search.py): the label-looping search must take
exactly its steps, so every hypothesis must have the same labels, end frame, big-blank
and skipped-frame counts, label count at the last frame, prediction-network state, and
the same score up to float rounding. Tiny random ESPnet networks; batches with
utterances of 0 and 1 frames; windows 1, 2, 5 and the default; the max-symbols guard
hit on purpose.
"""

import json
import math
from types import SimpleNamespace

import pytest
import torch

import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)

# isort: split
from espnet2.asr.decoder.transducer_decoder import TransducerDecoder
from espnet2.asr_transducer.joint_network import JointNetwork

from espnet_multiblank.decoding import (
    GreedySearch,
    JointStepper,
    LabelLoopingGreedySearch,
    Stepper,
)
from espnet_multiblank.espnet.inference.search import build_transducer_search
from espnet_multiblank.lattice import MultiblankLattice, TDTLattice

# a search without its max-symbols guard loops forever on these models: fail, not hang
pytestmark = pytest.mark.timeout(120)

D_ENC = 8
LENS_3 = [23, 0, 1]
LENS_16 = [23, 1, 17, 9, 0, 30, 40, 2, 12, 5, 33, 1, 8, 26, 3, 19]


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: threads only add overhead (shared CPUs)
    yield
    torch.set_num_threads(n)


def mb_model(seed=0, durations=(2, 4, 8), blank_bias=0.5, vocab=10, layers=1):
    """Random TransducerDecoder + JointNetwork; big blanks before the blank."""
    torch.manual_seed(seed)
    blank = len(durations)
    decoder = TransducerDecoder(
        vocab, hidden_size=12, embed_pad=0, num_layers=layers
    ).eval()
    joint = JointNetwork(vocab, D_ENC, 12, joint_space_size=12).eval()
    with torch.no_grad():
        joint.lin_out.bias[: blank + 1] += blank_bias
        joint.lin_out.weight.mul_(3.0)
    return SimpleNamespace(
        decoder=decoder,
        joint_network=joint,
        blank_id=blank,
        big_blank_durations=tuple(durations),
        token_list=[f"t{i}" for i in range(vocab)],
    )


def tdt_model(seed=0, durations=(0, 1, 2, 3, 4), blank_bias=1.0, vocab=6):
    """Random TransducerDecoder (V tokens) + JointNetwork with V + D outputs."""
    torch.manual_seed(seed)
    decoder = TransducerDecoder(vocab, hidden_size=12, embed_pad=0).eval()
    joint = JointNetwork(vocab + len(durations), D_ENC, 12, joint_space_size=12)
    joint = joint.eval()
    with torch.no_grad():
        joint.lin_out.weight.mul_(3.0)
        joint.lin_out.bias[0] += blank_bias
    return SimpleNamespace(
        decoder=decoder,
        joint_network=joint,
        blank_id=0,
        tdt_durations=tuple(durations),
        big_blank_durations=(),
        token_list=[f"t{i}" for i in range(vocab)],
    )


def searches(model, max_sym=10, window=None, blank_decision="total", max_inner=None):
    """(frame-looping search, label-looping search) for a model."""
    loop = dict(window=window, max_inner=max_inner)
    if getattr(model, "tdt_durations", None):
        durations = model.tdt_durations
        stepper = JointStepper(
            model.decoder, model.joint_network, model.decoder.odim + len(durations)
        )
        lattice = TDTLattice.create(model.blank_id, durations)
        return (
            GreedySearch(stepper, lattice, max_sym_per_frame=max_sym),
            LabelLoopingGreedySearch(
                stepper, lattice, max_sym_per_frame=max_sym, **loop
            ),
        )
    stepper = JointStepper(model.decoder, model.joint_network)
    lattice = MultiblankLattice.create(model.blank_id, model.big_blank_durations)
    kwargs = dict(max_sym_per_frame=max_sym, blank_decision=blank_decision)
    return (
        GreedySearch(stepper, lattice, **kwargs),
        LabelLoopingGreedySearch(stepper, lattice, **loop, **kwargs),
    )


def enc_batch(seed, lens):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(len(lens), max(lens), D_ENC, generator=g), torch.tensor(lens)


def assert_same(got, want, T):
    assert got.yseq == want.yseq
    assert got.frame == want.frame == T
    assert got.big_blank_emissions == want.big_blank_emissions
    assert got.frames_skipped == want.frames_skipped
    assert got.num_sym_frame == want.num_sym_frame
    assert math.isclose(got.score, want.score, rel_tol=1e-5, abs_tol=1e-5)
    # the prediction network after the last label
    torch.testing.assert_close(got.dec_proj, want.dec_proj, rtol=1e-5, atol=1e-5)
    for a, b in zip(got.dec_state, want.dec_state):
        torch.testing.assert_close(a.reshape(-1), b.reshape(-1), rtol=1e-5, atol=1e-5)


def check_against_one_utterance(model, lens, seed, **kwargs):
    """label-looping batch == frame-looping one utterance at a time; returns the
    hypotheses."""
    frame_search, label_search = searches(model, **kwargs)
    enc, enc_lens = enc_batch(seed, lens)
    batch = label_search.search_batch(enc, enc_lens)
    assert len(batch) == len(lens)
    for b, T in enumerate(lens):
        assert_same(batch[b], frame_search.search_one(enc[b, :T]), T)
    return batch


MODELS = {
    "standard": lambda seed: mb_model(seed, durations=()),
    "multiblank": lambda seed: mb_model(seed),
    "multiblank_3": lambda seed: mb_model(seed, durations=(3,)),
    "tdt_0_4": lambda seed: tdt_model(seed),
    "tdt_2_3": lambda seed: tdt_model(seed, durations=(2, 3)),  # without 0 and 1
    "tdt_3_1_5": lambda seed: tdt_model(seed, durations=(3, 1, 5)),  # unsorted, no 0
}


UNLIMITED = 10**6  # the inner loop runs until every utterance found its label (GPU)
LOOPS = [(None, None), (1, 1), (1, 2), (1, UNLIMITED), (2, 1), (5, 2), (5, UNLIMITED)]


@pytest.mark.parametrize("window,max_inner", LOOPS)
@pytest.mark.parametrize("lens", [[37], LENS_3, LENS_16], ids=["b1", "b3", "b16"])
@pytest.mark.parametrize("kind", list(MODELS))
def test_same_hypotheses_as_one_utterance_search(kind, lens, window, max_inner):
    for seed in (0, 1):
        check_against_one_utterance(
            MODELS[kind](seed), lens, seed, window=window, max_inner=max_inner
        )


@pytest.mark.parametrize("blank_decision", ["total", "symbol"])
@pytest.mark.parametrize("max_sym", [1, 2, 10])
@pytest.mark.parametrize("durations", [(2, 4, 8), ()])
def test_blank_decisions_and_max_symbols(durations, max_sym, blank_decision):
    for seed in (2, 3):
        model = mb_model(seed, durations=durations, blank_bias=0.0)
        for window, max_inner in ((1, UNLIMITED), (1, 2), (3, 1), (3, UNLIMITED)):
            check_against_one_utterance(
                model,
                LENS_16,
                seed,
                max_sym=max_sym,
                window=window,
                max_inner=max_inner,
                blank_decision=blank_decision,
            )


def stay_model():
    """A TDT that prefers labels with duration 0 everywhere."""
    model = tdt_model(0, blank_bias=-20.0)
    with torch.no_grad():
        model.joint_network.lin_out.bias[model.decoder.odim] += 20.0  # duration 0
    return model


@pytest.mark.parametrize("window,max_inner", [(1, UNLIMITED), (1, 2), (4, 1)])
@pytest.mark.parametrize("max_sym", [1, 3])
@pytest.mark.parametrize(
    "model",
    [
        mb_model(0, blank_bias=-20.0),
        mb_model(0, durations=(), blank_bias=-20.0),
        stay_model(),
    ],
    ids=["multiblank", "standard", "tdt"],
)
def test_max_symbols_guard_hit(model, max_sym, window, max_inner):
    """A joint network that prefers a label (TDT: a label that stays) everywhere:
    every frame visited emits exactly ``max_sym`` labels that stay, then the guard
    forces a blank (TDT: a label that moves, except at the last frame, where no label
    may move and a blank ends the path), in the batch as alone."""
    lens = [7, 0, 1, 12]
    hyps = check_against_one_utterance(
        model, lens, 0, max_sym=max_sym, window=window, max_inner=max_inner
    )
    tdt = bool(getattr(model, "tdt_durations", None))
    for h, T in zip(hyps, lens):
        visited = T - h.frames_skipped  # frames where an arc moved on
        assert len(h.yseq) - 1 == visited * (max_sym + tdt) - int(tdt and T > 0)
        assert h.num_sym_frame == 0


def test_the_models_exercise_every_kind_of_step():
    """Labels that stay, big blanks, blanks over several frames and TDT labels that
    move all occur in the fixtures (else the equality tests would prove little)."""
    enc, lens = enc_batch(0, LENS_16)
    _, search = searches(MODELS["multiblank"](0))
    hyps = search.search_batch(enc, lens)
    assert sum(h.big_blank_emissions for h in hyps) > 10
    assert sum(len(h.yseq) - 1 for h in hyps) > 10
    assert any(h.num_sym_frame > 0 or len(h.yseq) > 3 for h in hyps)
    frame_tdt, search = searches(MODELS["tdt_0_4"](0))
    hyps = search.search_batch(enc, lens)
    # labels moving: more frames skipped than the blanks alone could skip
    assert sum(len(h.yseq) - 1 for h in hyps) > 10
    assert sum(h.frames_skipped for h in hyps) > 0
    assert sum(h.big_blank_emissions for h in hyps) > 0


class CallLog(JointStepper):
    """A JointStepper that logs its joint ("j") and prediction ("p") calls."""

    def __init__(self, stepper):
        self.__dict__.update(stepper.__dict__)
        self.calls = []

    def joint(self, enc_proj, dec_proj):
        self.calls.append("j")
        return super().joint(enc_proj, dec_proj)

    def step(self, labels, state):
        self.calls.append("p")
        return super().step(labels, state)


@pytest.mark.parametrize("kind", ["multiblank", "standard", "tdt_0_4"])
def test_prediction_network_once_per_label_and_inner_limit(kind):
    """Unlimited: one batched prediction step per outer iteration, i.e. per label of
    the utterance with the most labels (+ the start symbol; on a CPU the last
    iteration, where every utterance ends and none emits, skips it), the joint
    network alone in between. With ``max_inner = K``: at most K joint calls per
    inner loop, and (CPU) a prediction step only where some utterance emits, so
    never more than one per label of the batch (+ the start symbol)."""
    enc, lens = enc_batch(7, LENS_16)
    for window, max_inner in ((1, UNLIMITED), (4, UNLIMITED), (1, 2), (1, 1), (4, 1)):
        _, search = searches(MODELS[kind](0), window=window, max_inner=max_inner)
        search.stepper = log = CallLog(search.stepper)
        inner_calls = []
        inner_loop = search._inner_loop

        def counted(*args, **kwargs):
            before = log.calls.count("j")
            out = inner_loop(*args, **kwargs)
            inner_calls.append(log.calls.count("j") - before)
            return out

        search._inner_loop = counted
        hyps = search.search_batch(enc, lens)
        labels = [len(h.yseq) - 1 for h in hyps]
        runs = "".join(log.calls).split("p")  # joint calls between prediction steps
        assert runs[0] == ""  # the start symbol
        assert 1 <= max(inner_calls) <= max_inner
        if max_inner == UNLIMITED:
            assert log.calls.count("p") == max(labels) + 1
            assert len(inner_calls) == max(labels) + 1
        else:
            assert max(labels) + 1 <= log.calls.count("p") <= sum(labels) + 1
            assert len(inner_calls) > log.calls.count("p") - 1  # some emitted none


def test_label_buffer_grows():
    """More outer iterations than the initial label capacity (2 -> 4 -> 8 -> 16)."""
    model = mb_model(0, durations=(), blank_bias=-20.0)
    frame_search, search = searches(model, max_sym=3)
    search.initial_capacity = 2
    enc, lens = enc_batch(0, [5, 4, 0])
    hyps = search.search_batch(enc, lens)
    assert len(hyps[0].yseq) - 1 == 15
    for b, T in enumerate(lens.tolist()):
        assert_same(hyps[b], frame_search.search_one(enc[b, :T]), T)


def test_empty_batches_and_lengths():
    _, search = searches(mb_model(0))
    assert search.search_batch(torch.zeros(0, 5, D_ENC), torch.zeros(0)) == []
    hyps = search.search_batch(torch.zeros(2, 0, D_ENC), torch.tensor([0, 0]))
    for h in hyps:
        assert (h.yseq, h.frame, h.score, h.frames_skipped) == ([3], 0, 0.0, 0)
    (h,) = search.search(torch.zeros(0, D_ENC))
    assert h.yseq == [3] and h.frame == 0


@pytest.mark.parametrize("window", [1, 4])
@pytest.mark.parametrize("kind", list(MODELS))
def test_a_non_finite_utterance_leaves_the_others_alone(kind, window):
    """NaN encoder output for one utterance (its arcs can then pass its end): the
    batch still ends, that utterance's score is not finite (the label-synchronous
    beam's pruning bound reads it so), the others are as alone."""
    frame_search, search = searches(MODELS[kind](2), max_sym=3, window=window)
    enc, lens = enc_batch(2, [12, 9, 7])
    enc[1, :9] = float("nan")
    alone = frame_search.search_one(enc[1, :9])  # the one-utterance loop too
    assert not math.isfinite(alone.score) and alone.frame == 9
    for batched in (frame_search, search):
        hyps = batched.search_batch(enc, lens)
        assert not math.isfinite(hyps[1].score) and hyps[1].frame == 9
        for b in (0, 2):
            T = int(lens[b])
            assert_same(hyps[b], frame_search.search_one(enc[b, :T]), T)


def test_search_is_one_utterance_batch():
    model = MODELS["tdt_0_4"](1)
    frame_search, search = searches(model)
    enc, lens = enc_batch(5, [29])
    (h,) = search(enc[0])  # ESPnet's interface
    assert_same(h, frame_search.search_one(enc[0]), 29)


def test_bad_arguments():
    frame_search, search = searches(mb_model(0))
    enc, lens = enc_batch(0, [5, 3])
    with pytest.raises(ValueError, match="enc_lens"):
        search.search_batch(enc, torch.tensor([6, 3]))
    with pytest.raises(ValueError, match="enc_lens"):
        search.search_batch(enc, torch.tensor([5, -1]))
    with pytest.raises(ValueError, match=r"enc_out must be \(B, T_max, D_enc\)"):
        search.search_batch(enc[0], lens)
    with pytest.raises(ValueError, match="window"):
        LabelLoopingGreedySearch(search.stepper, search.lattice, window=0)
    with pytest.raises(ValueError, match="max_inner"):
        LabelLoopingGreedySearch(search.stepper, search.lattice, max_inner=0)
    with pytest.raises(ValueError, match="blank_decision"):
        LabelLoopingGreedySearch(search.stepper, search.lattice, blank_decision="sum")
    with pytest.raises(TypeError, match="MultiblankLattice or .*TDTLattice"):
        LabelLoopingGreedySearch(search.stepper, (search.lattice.blank, ()))


def test_default_window_and_inner_limit():
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    for model, window, cpu_limit in (
        (mb_model(0, durations=()), 16, 1),
        (mb_model(0), 1, 3),
        (tdt_model(0), 1, 3),
        (tdt_model(0, durations=(0, 1)), 16, 1),
    ):
        search = searches(model)[1]
        assert search.window == window
        assert search.inner_limit(cpu) == cpu_limit
        assert search.inner_limit(gpu) == float("inf")
        search = searches(model, max_inner=2)[1]
        assert search.inner_limit(cpu) == search.inner_limit(gpu) == 2


@pytest.mark.parametrize("layers", [1, 2])
def test_where_state_default_equals_joint_stepper(layers):
    """Stepper.where_state (row indices) == JointStepper's (torch.where)."""
    model = mb_model(0, layers=layers)
    stepper = JointStepper(model.decoder, model.joint_network)
    state = model.decoder.init_state(4)
    _, a = stepper.step(torch.tensor([4, 5, 6, 7]), state)
    _, b = stepper.step(torch.tensor([5, 5, 5, 5]), a)
    mask = torch.tensor([True, False, False, True])
    fast = stepper.where_state(mask, b, a)
    slow = Stepper.where_state(stepper, mask, b, a)
    for x, y, new, old in zip(fast, slow, b, a):
        assert torch.equal(x, y)
        assert torch.equal(x[:, mask], new[:, mask])
        assert torch.equal(x[:, ~mask], old[:, ~mask])


def test_factory_loop_labels():
    mb = mb_model(0)
    for search_type in ("mb_greedy", "greedy", "mbg"):
        search = build_transducer_search(
            mb,
            search_type=search_type,
            loop_labels=True,
            max_sym_per_frame=4,
            blank_decision="symbol",
        )
        assert isinstance(search, LabelLoopingGreedySearch)
        assert (search.max_sym_per_frame, search.blank_decision) == (4, "symbol")
    off = build_transducer_search(mb, search_type="mb_greedy", loop_labels=False)
    assert type(off) is GreedySearch
    std = mb_model(0, durations=())
    assert isinstance(
        build_transducer_search(std, search_type="mb_greedy", loop_labels=True),
        LabelLoopingGreedySearch,
    )
    tdt = tdt_model(0)
    for search_type in ("tdt_greedy", "mb_greedy", "greedy"):
        search = build_transducer_search(tdt, search_type=search_type, loop_labels=True)
        assert isinstance(search, LabelLoopingGreedySearch)
        assert search.lattice.kind == "tdt"
    with pytest.raises(TypeError, match="loop_labels must be true or false"):
        build_transducer_search(mb, search_type="mb_greedy", loop_labels="yes")
    with pytest.raises(ValueError, match="loop_labels.*mb_beam"):
        build_transducer_search(mb, search_type="mb_beam", loop_labels=True)
    with pytest.raises(ValueError, match="loop_labels.*tdt_beam"):
        build_transducer_search(
            tdt, search_type="default", beam_size=4, loop_labels=True
        )
    with pytest.raises(ValueError, match="loop_labels"):  # ESPnet's own greedy
        build_transducer_search(std, search_type="greedy", loop_labels=True)
    # false is accepted (and dropped) for ESPnet's searches
    build_transducer_search(std, search_type="greedy", loop_labels=False)


@pytest.mark.parametrize(
    "kind,blank_decision",
    [(kind, "total") for kind in MODELS]
    + [(kind, "symbol") for kind in MODELS if not kind.startswith("tdt")],
)
def test_one_utterance_runs_the_one_utterance_loop(kind, blank_decision):
    """search() (ESPnet's one-utterance call, --batch_size 1) runs the frame-looping
    search's one-utterance loop with the label-looping search's settings: bit for bit
    its hypothesis, and the batch of one's within float rounding."""
    model = MODELS[kind](1)
    fl, ll = searches(model, max_sym=3, blank_decision=blank_decision)
    enc, lens = enc_batch(1, [29])

    def no_loops(*args):
        raise AssertionError("search() ran the batch loops")

    ll.run_loops = no_loops
    got = ll.search(enc[0])
    del ll.run_loops
    assert len(got) == 1
    want = fl.search_one(enc[0])
    assert got[0].yseq == want.yseq and got[0].score == want.score
    assert got[0].timing == want.timing
    (batch_of_one,) = ll.search_batch(enc, lens)
    assert_same(got[0], batch_of_one, 29)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_matches_cpu():
    for kind in ("multiblank", "standard", "tdt_0_4"):
        model = MODELS[kind](0)
        _, search = searches(model)
        enc, lens = enc_batch(0, LENS_16)
        cpu = search.search_batch(enc, lens)
        model.decoder.cuda()
        model.joint_network.cuda()
        gpu = search.search_batch(enc.cuda(), lens.cuda())
        for a, b in zip(gpu, cpu):
            assert a.yseq == b.yseq and a.frame == b.frame
            assert a.frames_skipped == b.frames_skipped
            assert math.isclose(a.score, b.score, rel_tol=1e-4, abs_tol=1e-4)


# ---------------------------------------------------------------- the CLI


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    """A tiny multi-blank ESPnet model and three utterances (test_decoding_cli's)."""
    from test_decoding_cli import make_data, make_experiment

    root = tmp_path_factory.mktemp("ll_cli")
    return root, make_experiment(root, durations=(2, 4)), make_data(root)


def _outputs(out):
    results = {}
    for name in ("token_int", "score"):
        lines = (out / "1best_recog" / name).read_text().splitlines()
        results[name] = dict(line.partition(" ")[::2] for line in lines)
    return results


def test_cli_loop_labels_batched_equals_batch_1_and_frame_looping(cli):
    from test_decoding_cli import run_inference

    root, exp, scp = cli
    conf = "mb_greedy_loop_labels.yaml"
    batched = run_inference(exp, scp, root / "ll_b8", conf)
    assert batched["batch_size"] == 32  # the YAML's: the 3 utterances in one batch
    assert batched["search"] == "LabelLoopingGreedySearch"
    single = run_inference(exp, scp, root / "ll_b1", conf, "--batch_size", "1")
    assert single["batch_size"] == 1
    frame = run_inference(
        exp, scp, root / "fl_b1", "mb_greedy.yaml", "--batch_size", "1"
    )
    assert frame["search"] == "GreedySearch"
    assert batched["big_blank_emissions"] == single["big_blank_emissions"] > 0
    for key in ("total_frames", "big_blank_emissions", "frames_skipped"):
        assert batched[key] == single[key] == frame[key]
    runs = [_outputs(root / name) for name in ("ll_b8", "ll_b1", "fl_b1")]
    assert runs[0]["token_int"] == runs[1]["token_int"] == runs[2]["token_int"]
    for key, score in runs[2]["score"].items():
        for run in runs[:2]:
            assert float(run["score"][key]) == pytest.approx(float(score), rel=1e-6)
    stats = json.loads((root / "ll_b8" / "decoding_stats.json").read_text())
    assert stats["search"] == "LabelLoopingGreedySearch"


def test_decode_batch_label_looping_equals_alone(cli):
    """Speech2Text.decode_batch (batched encoder and label-looping search) == each
    utterance decoded alone by the frame-looping search."""
    import soundfile

    from espnet_multiblank.espnet.inference.speech2text import MultiblankSpeech2Text

    root, exp, scp = cli
    kwargs = dict(
        asr_train_config=exp / "config.yaml",
        asr_model_file=exp / "model.pth",
        beam_size=1,
    )
    ll = MultiblankSpeech2Text(
        transducer_conf={"search_type": "mb_greedy", "loop_labels": True}, **kwargs
    )
    fl = MultiblankSpeech2Text(transducer_conf={"search_type": "mb_greedy"}, **kwargs)
    assert isinstance(ll.beam_search_transducer, LabelLoopingGreedySearch)
    wavs = [
        torch.tensor(soundfile.read(line.split()[1])[0], dtype=torch.float32)
        for line in scp.read_text().splitlines()
    ]
    lengths = torch.tensor([len(w) for w in wavs])
    speech = torch.nn.utils.rnn.pad_sequence(wavs, batch_first=True)
    batched = ll.decode_batch(speech, lengths)
    for b, wav in enumerate(wavs):
        ((_, _, alone_ids, alone),) = fl(wav)
        ((_, _, ids, hyp),) = batched[b]
        assert ids == alone_ids
        assert hyp.score == pytest.approx(alone.score, rel=1e-6)
        assert hyp.frames_skipped == alone.frames_skipped
    assert ll.stats.frames_skipped == fl.stats.frames_skipped > 0
