"""Utterances without a path in ``model: multiblank_espnet``'s training loss: left out
of the reduction (zero gradient), counted in the stats, warned about; the reduction
over the others is the loss's own reduction of those utterances alone."""

import logging

import pytest
import torch
from espnet_cases import batch, build, tdt_config, tiny_config

import espnet_multiblank
import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)
from espnet_multiblank.espnet.model.asr_model import NO_PATH_STAT
from espnet_multiblank.espnet.model.no_path import MODEL_REDUCTIONS, NoPathWarnings
from espnet_multiblank.lattice import TDTLattice, has_path

espnet_multiblank.register()

from espnet2.asr_transducer.utils import get_transducer_task_io  # noqa: E402

ENC_DIM = 16


def _model(tmp_path, kind, reduction="mean", **conf):
    conf = dict(transducer_reduction=reduction, **conf)
    if kind == "standard":
        return build(tmp_path, tiny_config(durations=(), **conf))
    if kind == "multiblank":
        return build(tmp_path, tiny_config(**conf))
    durations = {"tdt_024": [0, 2, 4], "tdt_12": [1, 2], "tdt": [0, 1, 2, 4]}[kind]
    return build(
        tmp_path,
        tdt_config(durations, transducer_allow_unreachable_lengths=True, **conf),
    )


def _text(model, rows):
    ids = {t: i for i, t in enumerate(model.token_list)}
    text = torch.full((len(rows), max(len(r) for r in rows)), -1)
    for r, row in enumerate(rows):
        text[r, : len(row)] = torch.tensor([ids[t] for t in row])
    return text


def _plugin_loss(model, logits, target, t_len, u_len, reduction):
    """The loss's own reduction (espnet_multiblank's public functions)."""
    args = (logits, target, t_len, u_len)
    kwargs = dict(
        blank=model.blank_id,
        sigma=model.criterion_transducer.opts.sigma,
        reduction=reduction,
    )
    if model.tdt_durations:
        return espnet_multiblank.tdt_loss(
            *args, durations=model.tdt_durations, **kwargs
        )
    return espnet_multiblank.multiblank_rnnt_loss(
        *args, big_blank_durations=model.big_blank_durations, **kwargs
    )


def _subset_loss(model, enc, enc_lens, text, keep, reduction):
    """The loss of the utterances ``keep`` alone, through the model's networks:
    value and d loss / d enc of those rows."""
    enc = enc[keep].detach().clone().requires_grad_(True)
    decoder_in, target, t_len, u_len = get_transducer_task_io(
        text[keep], enc_lens[keep], ignore_id=-1, blank_id=model.blank_id
    )
    model.decoder.set_device(enc.device)
    logits = model.joint_logits(enc, model.decoder(decoder_in))
    loss = _plugin_loss(model, logits, target, t_len, u_len, reduction)
    (grad,) = torch.autograd.grad(loss, enc)
    return loss, grad


ROWS = [["a", "b", "<space>", "c"], ["b", "c"], ["a"], ["c", "a", "b"]]
# (kind, encoder lengths, which rows have no path) with the rows above
CASES = [
    ("tdt_024", [9, 8, 5, 6], [True, False, True, False]),  # odd T
    ("tdt_12", [9, 2, 4, 3], [False, True, False, True]),  # L > T - 1
    ("standard", [9, 0, 4, 6], [False, True, False, False]),  # T = 0 < L
    ("multiblank", [0, 8, 5, 6], [True, False, False, False]),
]


@pytest.mark.parametrize("reduction", MODEL_REDUCTIONS)
@pytest.mark.parametrize("kind, lens, no_path", CASES)
def test_left_out_utterances_change_nothing(tmp_path, kind, lens, no_path, reduction):
    """The loss and gradient of a batch equal those of its utterances that have a
    path, alone (the loss's own reduction over them); the others get a zero
    gradient, and their share is the batch's transducer_no_path_fraction."""
    torch.manual_seed(0)
    model = _model(tmp_path, kind, reduction)
    text = _text(model, ROWS)
    u_len = (text >= 0).sum(1)
    assert [
        not has_path(model.lattice, t, int(u)) for t, u in zip(lens, u_len)
    ] == no_path  # the case is what it says
    g = torch.Generator().manual_seed(1)
    enc = torch.randn(4, 9, ENC_DIM, generator=g, requires_grad=True)
    enc_lens = torch.tensor(lens)
    loss, _, _ = model._calc_transducer_loss(enc, enc_lens, text)
    (grad,) = torch.autograd.grad(loss, enc)
    assert float(model._no_path_fraction) == sum(no_path) / 4

    keep = ~torch.tensor(no_path)
    want, want_grad = _subset_loss(model, enc, enc_lens, text, keep, reduction)
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad[keep], want_grad, rtol=1e-4, atol=1e-6)
    assert torch.count_nonzero(grad[~keep]) == 0
    assert torch.count_nonzero(grad[keep]) > 0


@pytest.mark.parametrize("kind", ["standard", "multiblank", "tdt"])
@pytest.mark.parametrize("reduction", MODEL_REDUCTIONS)
def test_model_reduction_is_the_loss_reduction(tmp_path, kind, reduction):
    """With every utterance possible, the model's reduction of the per-utterance
    costs is the loss's reduction of the same name (value and gradient)."""
    torch.manual_seed(0)
    model = _model(tmp_path, kind, reduction)
    text = _text(model, ROWS)
    g = torch.Generator().manual_seed(2)
    enc = torch.randn(4, 9, ENC_DIM, generator=g, requires_grad=True)
    enc_lens = torch.tensor([9, 8, 6, 7])
    loss, _, _ = model._calc_transducer_loss(enc, enc_lens, text)
    (grad,) = torch.autograd.grad(loss, enc)
    assert float(model._no_path_fraction) == 0.0
    keep = torch.ones(4, dtype=torch.bool)
    want, want_grad = _subset_loss(model, enc, enc_lens, text, keep, reduction)
    torch.testing.assert_close(loss, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad, want_grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_batch_without_any_path_is_a_zero_with_zero_gradient(tmp_path, backend):
    """Every utterance impossible: loss 0 (not NaN, not inf), still connected to the
    networks (DDP needs every parameter's gradient), all gradients exactly 0."""
    model = _model(tmp_path, "tdt_024", transducer_loss_backend=backend)
    model.train()
    text = _text(model, ROWS[:2])
    enc = torch.randn(2, 9, ENC_DIM, requires_grad=True)
    loss, _, _ = model._calc_transducer_loss(enc, torch.tensor([9, 7]), text)
    assert float(loss) == 0.0 and loss.requires_grad
    loss.backward()
    assert float(model._no_path_fraction) == 1.0
    assert torch.count_nonzero(enc.grad) == 0
    grads = [p.grad for p in model.joint_network.parameters()]
    assert grads and all(g is not None and torch.count_nonzero(g) == 0 for g in grads)


def test_incoming_gradient_has_no_zero(tmp_path):
    """The loss finishes its gradient in place only when no incoming entry is 0: the
    left-out utterances get a positive weight (their own gradient is zero anyway)."""
    model = _model(tmp_path, "tdt_024", "mean")
    seen = []

    def grab(module, inputs, costs):
        costs.register_hook(lambda g: seen.append(g.clone()))

    model.criterion_transducer.register_forward_hook(grab)
    text = _text(model, ROWS)
    enc = torch.randn(4, 9, ENC_DIM, requires_grad=True)
    loss, _, _ = model._calc_transducer_loss(enc, torch.tensor([9, 8, 5, 6]), text)
    loss.backward()
    (incoming,) = seen
    assert torch.all(incoming > 0) and torch.all(torch.isfinite(incoming))
    # the kept ones: 1 / K with K = 2
    torch.testing.assert_close(incoming[[1, 3]], torch.full((2,), 0.5))


def test_forward_stats_and_warning(tmp_path, caplog):
    """ESPnet's forward: finite loss, the fraction in the stats (a gatherable
    1-element tensor like ESPnet's), and the warning at the 1st, 2nd, 4th batch
    with such utterances, with the count and a reason."""
    model = _model(tmp_path, "standard", ctc_weight=0.0)
    speech, speech_lengths, text, text_lengths = batch(model.token_list)
    speech_lengths = torch.tensor([2400, 300, 1600])  # 300 samples: no frames
    model.train()
    with caplog.at_level(logging.WARNING, logger="espnet_multiblank"):
        for _ in range(5):
            loss, stats, _ = model(speech, speech_lengths, text, text_lengths)
            assert torch.isfinite(loss)
            assert stats[NO_PATH_STAT].shape == (1,)
            assert float(stats[NO_PATH_STAT]) == pytest.approx(1 / 3)
        _, stats, _ = model(
            speech, torch.tensor([2400, 2000, 1600]), text, text_lengths
        )
    assert float(stats[NO_PATH_STAT]) == 0.0
    warned = [r.getMessage() for r in caplog.records if "no path" in r.getMessage()]
    assert len(warned) == 3  # batches 1, 2, 4
    assert warned[0].startswith("transducer loss: 1 of 3 utterances")
    assert "T=0, L=2 (no encoder frames)" in warned[0]
    assert "4 such utterances in 4 batches" in warned[2]


def test_warning_reasons():
    """Each example says why: no frames, a length no duration sum reaches, or more
    labels than the frames allow."""
    warn = NoPathWarnings()
    lattice = TDTLattice(0, (2, 3))
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("espnet_multiblank.espnet.model.no_path")
    logger.addHandler(handler)
    try:
        warn(
            lattice,
            torch.tensor([True, True, True, False]),
            torch.tensor([0, 1, 5, 9]),
            torch.tensor([1, 0, 3, 1]),
        )
    finally:
        logger.removeHandler(handler)
    (record,) = records
    text = record.getMessage()
    assert "T=0, L=1 (no encoder frames)" in text
    assert "T=1, L=0 (no path covers exactly 1 frames)" in text
    assert "T=5, L=3 (L > 1, the most labels 5 frames fit)" in text
    assert "3 of 4 utterances" in text
