"""``frontend: kaldi_fbank`` against kaldi-native-fbank, the feature extractor of
sherpa-onnx (the oracle: the package itself, with sherpa-onnx's options for NeMo
transducers, and with other options); batch-exactness; the ASR task's choice."""

import numpy as np
import pytest
import torch

from espnet_multiblank.espnet.errors import ConfigError
from espnet_multiblank.espnet.frontends.kaldi_fbank import KaldiFbankFrontend

knf = pytest.importorskip("kaldi_native_fbank")


def knf_features(x, fs, n_mels, window="povey", preemph=0.97, dc=False, high=-400.0):
    """kaldi-native-fbank's features with sherpa-onnx's NeMo settings (by default)."""
    o = knf.FbankOptions()
    o.frame_opts.dither = 0.0
    o.frame_opts.snip_edges = False
    o.frame_opts.samp_freq = fs
    o.frame_opts.remove_dc_offset = dc
    o.frame_opts.window_type = window
    o.frame_opts.preemph_coeff = preemph
    o.mel_opts.num_bins = n_mels
    o.mel_opts.low_freq = 0.0
    o.mel_opts.high_freq = high
    o.mel_opts.is_librosa = True
    f = knf.OnlineFbank(o)
    f.accept_waveform(fs, x.tolist())
    f.input_finished()
    return np.array([f.get_frame(i) for i in range(f.num_frames_ready)])


def _waves(seed, lengths):
    rng = np.random.default_rng(seed)
    out = []
    for n in lengths:
        t = np.arange(n)
        x = 0.1 * rng.standard_normal(n) + 0.3 * np.sin(t * (0.03 + 0.01 * seed))
        out.append(x.astype(np.float32))
    return out


@pytest.mark.parametrize("fs,n_mels", [(8000, 23), (16000, 80)])
def test_batch_equals_kaldi_native_fbank_per_utterance(fs, n_mels):
    front = KaldiFbankFrontend(fs=fs, n_mels=n_mels).eval()
    waves = _waves(fs, [90, 150, 1234, 8001, 16000])
    L = max(w.size for w in waves) + 333
    batch = torch.zeros(len(waves), L)
    for b, w in enumerate(waves):
        batch[b, : w.size] = torch.from_numpy(w)
    feats, lens = front(batch, torch.tensor([w.size for w in waves]))
    for b, w in enumerate(waves):
        want = knf_features(w, fs, n_mels)
        assert int(lens[b]) == want.shape[0]
        np.testing.assert_allclose(feats[b, : lens[b]].numpy(), want, atol=1e-4, rtol=0)
        assert not feats[b, lens[b] :].any()  # padded frames are 0


@pytest.mark.parametrize(
    "window,preemph,dc,high",
    [("hann", 0.0, True, 3000.0), ("hamming", 0.5, False, -100.0)],
)
def test_other_options_equal_kaldi_native_fbank(window, preemph, dc, high):
    front = KaldiFbankFrontend(
        fs=8000,
        n_mels=20,
        window=window,
        preemph_coeff=preemph,
        remove_dc_offset=dc,
        high_freq=high,
    ).eval()
    (w,) = _waves(3, [5000])
    feats, _ = front(torch.from_numpy(w)[None], torch.tensor([w.size]))
    want = knf_features(w, 8000, 20, window, preemph, dc, high)
    np.testing.assert_allclose(feats[0].numpy(), want, atol=1e-4, rtol=0)


def test_bad_options_name_the_key():
    with pytest.raises(ConfigError, match="frontend_conf.window"):
        KaldiFbankFrontend(window="blackmann")
    with pytest.raises(ConfigError, match="high_freq"):
        KaldiFbankFrontend(fs=8000, high_freq=5000.0)
    with pytest.raises(ConfigError, match="n_mels = 200 is too large"):
        KaldiFbankFrontend(fs=8000, n_mels=200)


def test_the_asr_task_offers_it():
    import espnet_multiblank

    espnet_multiblank.register()
    from espnet2.tasks.asr import frontend_choices

    assert frontend_choices.get_class("kaldi_fbank") is KaldiFbankFrontend
