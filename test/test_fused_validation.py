"""Bad input to the fused joint + loss: a TypeError / ValueError naming the argument
(never a crash, a hang, a NaN or a silent wrong answer); the option checks are the
dense losses'. Also: non-finite logits raise, masked (-inf) symbols work."""

import math

import devices
import pytest
import torch
from helpers import fused_cases as fc

from espnet_multiblank import fused_transducer_loss
from espnet_multiblank.fused import FusedTransducerLoss

STD = fc.standard()
TDT = fc.tdt()


def _inputs(case=STD, dtype=torch.float32):
    return list(fc.make_inputs(case, dtype))


def _call(inputs, case=STD, **over):
    return fused_transducer_loss(*inputs, **case.fused_kwargs(**over))


def _raises(exc, match, inputs, case=STD, **over):
    with pytest.raises(exc, match=match):
        _call(inputs, case, **over)


@pytest.mark.parametrize(
    "index,value,exc,match",
    [
        (0, [[1.0]], TypeError, r"enc must be a torch.Tensor"),
        (0, torch.zeros(3, 6), ValueError, r"enc must be a 3-D tensor"),
        (0, torch.zeros(3, 6, 8, dtype=torch.int32), TypeError, r"enc must have dtype"),
        (1, None, TypeError, r"pred must be a torch.Tensor"),
        (1, torch.zeros(2, 4, 8), ValueError, r"pred.shape\[0\] must equal the batch"),
        (1, torch.zeros(3, 4, 7), ValueError, r"pred.shape\[2\] must equal the joint"),
        (1, torch.zeros(3, 0, 8), ValueError, r"pred.shape\[1\] \(U = max labels"),
        (2, torch.zeros(7, 9), ValueError, r"weight.shape\[1\] must equal the joint"),
        (2, torch.zeros(7), ValueError, r"weight must be a 2-D tensor"),
        (
            3,
            torch.zeros(6),
            ValueError,
            r"bias.shape\[0\] must equal weight.shape\[0\]",
        ),
        (3, torch.zeros(7, 1), ValueError, r"bias must be a 1-D tensor"),
        (3, torch.zeros(7, dtype=torch.int64), TypeError, r"bias must have dtype"),
        (4, torch.zeros(3, 3), TypeError, r"labels must have dtype"),
        (4, torch.zeros(2, 3, dtype=torch.int64), ValueError, r"labels.shape\[0\]"),
        (5, torch.tensor([7, 4, 5]), ValueError, r"act_lens must be <= enc.shape\[1\]"),
        (5, torch.tensor([6, -1, 5]), ValueError, r"act_lens must be >= 0"),
        (5, torch.tensor([6, 4]), ValueError, r"act_lens.shape\[0\] must equal .*enc"),
        (6, torch.tensor([4, 2, 0]), ValueError, r"label_lens must be <= pred.shape"),
        (6, torch.tensor([3, -2, 0]), ValueError, r"label_lens must be >= 0"),
        (6, [3, 2, 0], TypeError, r"label_lens must be a torch.Tensor"),
    ],
)
def test_bad_tensors(index, value, exc, match):
    inputs = _inputs()
    inputs[index] = value
    _raises(exc, match, inputs)


def test_bad_label_ids():
    inputs = _inputs()
    inputs[4] = inputs[4].clone()
    inputs[4][0, 1] = 7  # V = 7
    _raises(
        ValueError, r"labels must be ids in \[0, V = weight.shape\[0\] = 7\)", inputs
    )
    inputs[4][0, 1] = 0  # the blank
    _raises(ValueError, r"labels must not contain a blank id", inputs)
    mb = fc.multiblank()
    inputs = _inputs(mb)
    inputs[4] = inputs[4].clone()
    inputs[4][0, 0] = 1  # big blank 1 (blank 3, durations [2, 4, 8])
    _raises(ValueError, r"big blanks \[2, 1, 0\]", inputs, mb)
    inputs = _inputs(TDT)
    inputs[4] = inputs[4].clone()
    inputs[4][0, 0] = TDT.V  # a duration logit's index
    _raises(
        ValueError, r"V = weight.shape\[0\] - len\(tdt_durations\) = 8", inputs, TDT
    )


def test_vocabulary_too_small():
    inputs = _inputs()
    _raises(
        ValueError,
        r"blank must be < the vocabulary size weight.shape\[0\]",
        inputs,
        blank=7,
    )
    inputs = _inputs(TDT)
    inputs[2] = inputs[2][:5]
    inputs[3] = inputs[3][:5]
    _raises(ValueError, r"weight.shape\[0\] = 5 must be V \+ D", inputs, TDT)


def test_other_device():
    inputs = _inputs()
    inputs[2] = inputs[2].to("meta")
    _raises(ValueError, r"weight must be on the same device as enc", inputs)
    inputs = _inputs()
    inputs[5] = inputs[5].to("meta")
    _raises(ValueError, r"act_lens must be on the same device as enc", inputs)
    meta = [x.to("meta") if x is not None else None for x in _inputs()]
    _raises(ValueError, r"backend='numba' supports cpu and cuda", meta, backend="numba")


@pytest.mark.parametrize(
    "over,exc,match",
    [
        (dict(blank=-1), ValueError, r"blank must be an index >= 0"),
        (dict(blank=1.5), TypeError, r"blank must be an int"),
        (dict(big_blank_durations=[1]), ValueError, r"big_blank_durations must"),
        (dict(big_blank_durations=[2, 2]), ValueError, r"big_blank_durations must be"),
        (dict(blank=0, big_blank_durations=[2]), ValueError, r"blank must be >= len"),
        (dict(tdt_durations=[]), ValueError, r"tdt_durations must not be empty"),
        (dict(tdt_durations=[0]), ValueError, r"tdt_durations must contain a value"),
        (dict(tdt_durations=3), TypeError, r"tdt_durations must be a list"),
        (
            dict(blank=3, big_blank_durations=[2], tdt_durations=[0, 1]),
            ValueError,
            r"big_blank_durations and tdt_durations cannot both be set",
        ),
        (dict(omega=0.5), ValueError, r"omega .* applies to a TDT only"),
        (dict(omega=1.5, tdt_durations=[0, 1]), ValueError, r"omega must be a prob"),
        (dict(reduction="avg"), ValueError, r"reduction must be one of"),
        (dict(sigma=-0.1), ValueError, r"sigma must be a finite float >= 0"),
        (dict(clamp=math.nan), ValueError, r"clamp must be a finite float >= 0"),
        (dict(fastemit_lambda="0.1"), TypeError, r"fastemit_lambda must be a float"),
        (dict(backend="cuda"), ValueError, r"backend must be one of"),
        (dict(tile_backend="cuda"), ValueError, r"tile_backend must be one of"),
        (dict(tile_backend=None), ValueError, r"tile_backend must be one of"),
        (dict(tile_bytes=0), ValueError, r"tile_bytes must be >= 1"),
        (dict(tile_bytes=1.5), TypeError, r"tile_bytes must be an int"),
        (dict(tile_bytes=True), TypeError, r"tile_bytes must be an int"),
        (dict(activation="softmax"), ValueError, r"activation must be an elementwise"),
        (dict(activation=torch.nn.PReLU()), ValueError, r"activation must be an elem"),
        (dict(activation=torch.nn.Softmax(-1)), ValueError, r"activation must be an"),
        (dict(activation=torch.tanh), TypeError, r"activation must be a str or"),
    ],
)
def test_bad_options(over, exc, match):
    inputs = _inputs()
    _raises(exc, match, inputs, **over)
    kw = STD.fused_kwargs(**over)
    with pytest.raises(exc, match=match):
        FusedTransducerLoss(**kw)


def test_tile_backend_where_it_cannot_run(monkeypatch):
    """The Numba tile kernels need the Numba CPU lattice; Triton's need CUDA tensors
    (or its interpreter)."""
    inputs = _inputs()
    _raises(
        ValueError,
        r"tile_backend='numba' runs on CPU tensors with the Numba lattice",
        inputs,
        backend="torch",
        tile_backend="numba",
    )
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    _raises(ValueError, r"tile_backend='triton': ", inputs, tile_backend="triton")


def test_subclassed_activation_is_refused():
    class Tanhish(torch.nn.Tanh):
        def forward(self, x):
            return torch.tanh(x.cumsum(-1))  # not elementwise

    _raises(
        ValueError,
        r"activation must be an elementwise",
        _inputs(),
        activation=Tanhish(),
    )


#: the CPU's paths, the CUDA path (simulated: Triton's interpreter and the CUDA
#: simulator) and a GPU's
device_backends = pytest.mark.parametrize(
    "device,backend", devices.params("cpu", "sim", "cuda", backends=("numba", "torch"))
)


def _on(device, inputs):
    dev = devices.torch_device(device)
    return [None if x is None else x.to(dev) for x in inputs]


@device_backends
@pytest.mark.parametrize(
    "where,value",
    [("weight", math.nan), ("bias", math.inf), ("enc", math.nan), ("bias-row", None)],
)
def test_non_finite_logits_raise(where, value, device, backend):
    inputs = _inputs()
    if where == "weight":
        inputs[2] = inputs[2].clone()
        inputs[2][3, 1] = value
    elif where == "bias":
        inputs[3] = inputs[3].clone()
        inputs[3][2] = value
    elif where == "enc":
        inputs[0] = inputs[0].clone()
        inputs[0][1, 2, 0] = value  # a valid frame of utterance 1
    else:
        inputs[3] = torch.full_like(inputs[3], -math.inf)
    first = 1 if where == "enc" else 0  # the first utterance with such a logit
    with pytest.raises(
        ValueError, match=rf"must give finite logits .* utterance {first}"
    ):
        _call(_on(device, inputs), backend=backend)


@device_backends
@pytest.mark.parametrize("kind", ["multiblank", "tdt"])
def test_masked_symbol(kind, device, backend):
    """A symbol masked by a -inf bias (never emitted; for a TDT a duration) is
    allowed, as -inf logits are in the dense losses: the same costs and
    gradients."""
    case = fc.LATTICES[kind]()
    inputs = _on(device, fc.make_inputs(case, torch.float64))
    inputs[3] = inputs[3].clone()
    inputs[3][1 if kind == "multiblank" else case.V + 1] = -math.inf
    got = fc.fused_loss(case, inputs, "none", backend=backend)
    want = fc.dense_loss(case, inputs, "none")
    fc.assert_same_results(got, want, rtol=1e-9, atol=1e-10)
    assert torch.isfinite(got[0]).all()
    assert all(torch.isfinite(g).all() for g in got[1][:3])
