"""espnet_multiblank.espnet.compat: ESPnet 1's moved modules found in either layout
(``espnet.nets`` up to 202511, ``espnet2.legacy.nets`` from 202611), and what a user
of an ESPnet the plug-in cannot work with sees."""

import os
import warnings

import pytest
import torch

import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)
from espnet_multiblank.espnet import compat


@pytest.fixture
def fresh_compat(monkeypatch):
    """compat with its once-per-process findings forgotten (restored afterwards)."""
    monkeypatch.setattr(compat, "_layout", None)
    monkeypatch.setattr(compat, "_warned_untested", False)
    return compat


def test_layout_is_where_the_installed_espnet_keeps_its_legacy_code():
    import espnet2

    legacy_dir = os.path.join(os.path.dirname(espnet2.__file__), "legacy", "nets")
    expected = "espnet2.legacy" if os.path.isdir(legacy_dir) else "espnet"
    assert compat.layout() == expected
    assert compat.espnet_version() in compat.SUPPORTED_ESPNET


@pytest.mark.parametrize(
    "name, espnet2_module, attribute",
    [
        ("ConvolutionModule", "espnet2.asr.encoder.conformer_encoder", None),
        ("ConformerEncoderLayer", "espnet2.asr.encoder.conformer_encoder",
         "EncoderLayer"),
        ("make_pad_mask", "espnet2.layers.stft", None),
        ("TooShortUttError", "espnet2.bin.asr_inference", None),
        ("ErrorCalculator", "espnet2.asr.espnet_model", None),
        ("get_commandline_args", "espnet2.tasks.abs_task", None),
        ("Conv2dSubsampling", "espnet2.asr.encoder.conformer_encoder", None),
        ("RelPositionMultiHeadedAttention", "espnet2.asr.encoder.conformer_encoder",
         None),
    ],
)  # fmt: skip
def test_names_are_the_objects_espnet2_itself_uses(name, espnet2_module, attribute):
    """isinstance checks against ESPnet's modules depend on it."""
    import importlib

    theirs = getattr(importlib.import_module(espnet2_module), attribute or name)
    assert getattr(compat, name) is theirs


def test_every_moved_name_resolves():
    for name in compat.MOVED:
        assert getattr(compat, name) is not None, name


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'NotInESPnet'"):
        compat.NotInESPnet


def test_espnet_without_either_layout_names_the_supported_versions(
    fresh_compat, monkeypatch
):
    monkeypatch.setattr(compat, "LAYOUTS", ("no_such_espnet.legacy", "no_such_espnet"))
    with pytest.raises(ImportError) as info:
        compat.layout()
    message = str(info.value)
    for version in compat.SUPPORTED_ESPNET:
        assert version in message
    assert compat.espnet_version() in message


def test_register_refuses_an_espnet_it_cannot_use(fresh_compat, monkeypatch):
    from espnet_multiblank.espnet.registration import register

    monkeypatch.setattr(compat, "LAYOUTS", ("no_such_espnet.legacy", "no_such_espnet"))
    with pytest.raises(ImportError, match="202511, 202611"):
        register()


def test_an_untested_version_is_warned_once(fresh_compat, monkeypatch):
    monkeypatch.setattr(compat, "espnet_version", lambda: "202402")
    with pytest.warns(RuntimeWarning, match="installed ESPnet is 202402"):
        compat.check_espnet()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compat.check_espnet()


def test_a_tested_version_is_not_warned(fresh_compat):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compat.check_espnet() == compat.layout()


def test_masked_convolution_takes_espnet_202611_mask_argument():
    """ESPnet 202611's conformer block calls ``conv_module(x, mask_pad=mask)``; the
    batch-exact module gives with it what its own mask gives, and a padded utterance
    gets the frames of ESPnet's module on the utterance alone."""
    from espnet_multiblank.espnet.batch_exact.exact_layers import (
        MaskedConvolutionModule,
    )

    torch.manual_seed(0)
    module = compat.ConvolutionModule(8, 5).eval()
    masked = compat.ConvolutionModule(8, 5).eval()
    masked.load_state_dict(module.state_dict())
    masked.__class__ = MaskedConvolutionModule
    x = torch.randn(2, 10, 8)
    x[0, :6] = module_input = torch.randn(6, 8)
    alone = module(module_input[None])
    mask = (torch.arange(10)[None, :] < torch.tensor([6, 10])[:, None])[:, None, :]
    by_argument = masked(x, mask_pad=mask)
    masked.frame_mask = mask
    try:
        by_attribute = masked(x)
    finally:
        masked.frame_mask = None
    torch.testing.assert_close(by_argument, by_attribute, rtol=0, atol=0)
    torch.testing.assert_close(by_argument[0, :6], alone[0], rtol=1e-5, atol=1e-6)
    # a mask for another number of frames (a cached step) is ignored, as ESPnet does
    torch.testing.assert_close(
        masked(x, mask_pad=mask[:, :, :1]), masked(x), rtol=0, atol=0
    )
