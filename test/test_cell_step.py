"""The searches' prediction-network step (``decoding/cell_step.py``) against the
networks' own cells.

Oracles: ``torch.lstm_cell`` / ``torch.gru_cell`` per layer (``CellStep.fused``,
the step the searches took before) and ESPnet's ``TransducerDecoder.rnn_forward``
(an ``nn.LSTM`` / ``nn.GRU`` call); in float64 they must agree to rounding, in
float32 to float32 rounding. Then: the derived tables follow the weights when they
change (an optimizer step, ``load_state_dict``, a dtype change), hooks see their
modules, and a GPU / half-precision tensor takes the fused cells.
"""

import pytest
import torch

import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)

# isort: split
from espnet2.asr.decoder.transducer_decoder import TransducerDecoder
from espnet2.asr_transducer.joint_network import JointNetwork

from espnet_multiblank.decoding import JointStepper
from espnet_multiblank.decoding.cell_step import CellStep, RowLinear

V, H = 9, 12


def make(rnn_type: str, num_layers: int, vocab: int = V, dtype=torch.float64):
    torch.manual_seed(3)
    decoder = TransducerDecoder(
        vocab, rnn_type=rnn_type, num_layers=num_layers, hidden_size=H
    ).eval()
    decoder.to(dtype)
    return decoder, JointStepper(decoder, JointNetwork(vocab, 7, H, 10).to(dtype))


def random_state(decoder, rows: int, dtype=torch.float64):
    n = len(decoder.decoder)
    h = torch.randn(n, rows, H, dtype=dtype)
    lstm = isinstance(decoder.decoder[0], torch.nn.LSTM)
    return h, (torch.randn_like(h) if lstm else None)


def assert_steps_equal(got, want, tol):
    (x, (h, c)), (x_ref, (h_ref, c_ref)) = got, want
    torch.testing.assert_close(x, x_ref, rtol=tol, atol=tol)
    torch.testing.assert_close(h, h_ref, rtol=tol, atol=tol)
    if c_ref is None:
        assert c is None
    else:
        torch.testing.assert_close(c, c_ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("rnn_type", ["lstm", "gru"])
@pytest.mark.parametrize("num_layers", [1, 3])
@pytest.mark.parametrize("rows", [1, 6])
@pytest.mark.parametrize("vocab", [V, 2 * H + 1])  # with / without a label table
def test_step_equals_fused_cells_and_decoder(rnn_type, num_layers, rows, vocab):
    decoder, stepper = make(rnn_type, num_layers, vocab)
    cell = stepper.cell_step
    layers = cell._current_layers()
    assert (layers[0].table is not None) == (vocab <= 2 * H)
    labels = torch.randint(0, vocab, (rows,))
    state = random_state(decoder, rows)
    with torch.no_grad():
        got = cell(labels, state)
        assert_steps_equal(got, cell.fused(labels, state), 1e-12)
        out, (h_ref, c_ref) = decoder.rnn_forward(
            decoder.embed(labels.view(-1, 1)), state
        )
        # ESPnet's rnn_forward keeps its states in float32 whatever the weights' dtype
        ref_state = (h_ref.double(), None if c_ref is None else c_ref.double())
        assert_steps_equal(got, (out[:, 0], ref_state), 1e-6)
        # float32: the same step within float32 rounding
        decoder.float()
        state32 = tuple(None if s is None else s.float() for s in state)
        assert_steps_equal(cell(labels, state32), cell.fused(labels, state32), 2e-6)


def test_tables_follow_the_weights():
    """An optimizer step, load_state_dict and a dtype change rebuild the table: a
    search built once and used between training steps sees the new weights."""
    decoder, stepper = make("lstm", 1)
    labels = torch.tensor([2, 5])
    state = random_state(decoder, 2)
    first = stepper.step(labels, state)[0]
    optim = torch.optim.SGD(decoder.parameters(), lr=0.5)
    decoder.train()
    loss = stepper.step(labels, state)[0].sum()  # training mode: rnn_forward
    loss.backward()
    optim.step()
    decoder.eval()
    with torch.no_grad():
        after = stepper.step(labels, state)
        ref = stepper._project_dec(stepper.cell_step.fused(labels, state)[0])
    assert not torch.allclose(after[0], first)
    torch.testing.assert_close(after[0], ref, rtol=1e-12, atol=1e-12)
    other, _ = make("lstm", 1)
    other.decoder[0].weight_ih_l0.data.mul_(-1.0)
    decoder.load_state_dict(other.state_dict())
    with torch.no_grad():
        x, _ = stepper.cell_step(labels, state)
        torch.testing.assert_close(x, stepper.cell_step.fused(labels, state)[0])
        decoder.float()
        x32, _ = stepper.cell_step(labels, tuple(s.float() for s in state))
    assert x32.dtype == torch.float32
    torch.testing.assert_close(x32, x.float(), rtol=2e-6, atol=2e-6)


def test_hooks_see_their_modules_and_other_tensors_take_the_fused_cells():
    decoder, stepper = make("lstm", 1, dtype=torch.float32)
    labels = torch.tensor([4])
    state = random_state(decoder, 1, torch.float32)
    seen = []
    handle = decoder.embed.register_forward_hook(lambda *a: seen.append("embed"))
    lin_dec = stepper.joint_network.lin_dec
    handle2 = lin_dec.register_forward_hook(lambda *a: seen.append("lin_dec"))
    with torch.no_grad():
        hooked = stepper.step(labels, state)
    handle.remove()
    handle2.remove()
    assert seen == ["embed", "lin_dec"]
    with torch.no_grad():
        plain = stepper.step(labels, state)
    assert seen == ["embed", "lin_dec"]  # no module call without hooks
    torch.testing.assert_close(plain[0], hooked[0], rtol=2e-6, atol=2e-6)
    # half precision: torch's fused cells, the same numbers as they give
    decoder.to(torch.bfloat16)
    half_state = tuple(s.to(torch.bfloat16) for s in state)
    calls = []
    fused = stepper.cell_step.fused
    stepper.cell_step.fused = lambda *a: calls.append(1) or fused(*a)
    with torch.no_grad():
        x, _ = stepper.cell_step(labels, half_state)
    assert calls == [1] and x.dtype == torch.bfloat16


def test_row_linear_equals_the_module():
    torch.manual_seed(0)
    lin = torch.nn.Linear(5, 8)
    row = RowLinear(lin)
    x = torch.randn(3, 5)
    torch.testing.assert_close(row(x), lin(x), rtol=2e-6, atol=2e-6)
    with torch.no_grad():
        lin.weight.add_(1.0)  # in place: the transposed copy is rebuilt
    torch.testing.assert_close(row(x), lin(x), rtol=2e-6, atol=2e-6)
    x3 = torch.randn(2, 3, 5)  # not (A, in): the module itself
    torch.testing.assert_close(row(x3), lin(x3))


def test_cell_step_needs_plain_embedding_for_a_table():
    """An embedding with max_norm renormalises its rows when looked up: no table."""
    decoder, _ = make("lstm", 1)
    decoder.embed.max_norm = 1.0
    cell = CellStep(
        decoder.embed, JointStepper(decoder, JointNetwork(V, 7, H, 10)).cells, True
    )
    assert cell._current_layers()[0].table is None
    labels = torch.tensor([1, 3])
    state = random_state(decoder, 2)
    with torch.no_grad():
        assert_steps_equal(cell(labels, state), cell.fused(labels, state), 1e-12)


def test_gradients_reach_the_parameters_when_asked_for():
    """With gradients on (a user's own code, not the searches), the step runs the
    modules: the derived tables carry no gradient."""
    decoder, stepper = make("lstm", 1)
    labels = torch.tensor([2, 5])
    state = random_state(decoder, 2)
    out, _ = stepper.step(labels, state)  # eval mode, grad enabled
    out.sum().backward()
    params = (
        decoder.embed.weight,
        decoder.decoder[0].weight_ih_l0,
        stepper.joint_network.lin_dec.weight,
    )
    grads = [p.grad.clone() for p in params]
    assert all(g.abs().sum() > 0 for g in grads)
    for p in params:
        p.grad = None
    emb = decoder.embed(labels.view(-1, 1))
    ref, _ = decoder.rnn_forward(emb, state)
    stepper.joint_network.lin_dec(ref[:, 0]).sum().backward()
    for g, p in zip(grads, params):
        torch.testing.assert_close(g, p.grad, rtol=1e-10, atol=1e-12)
