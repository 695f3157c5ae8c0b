"""The input checks of every route into decoding, and reading a run's utterances.

One implementation, :class:`InputChecks`, refuses with a reason what the model
cannot decode correctly:

* an empty input (no samples) or one too short for the encoder (fewer samples than
  the shortest input that gives one encoder frame, found once by encoding silence);
* non-finite samples (NaN, +-inf), also after the conversion to the decoding dtype;
* a sample rate other than the model's (``frontend_conf.fs``), whenever the caller
  says what the rate is: ESPnet would decode the audio as if it were at the model's;
* more than one channel for a model whose frontend takes one (ESPnet's frontend
  would silently take the first channel of an utterance decoded alone, and batched
  decoding could not pad it with the others);
* an array of another rank than a waveform's ``(samples,)`` / ``(samples,
  channels)`` or a feature matrix's ``(frames, features)``.

Its users: the decoding loop of both entry points (reasons reported by key, the run
goes on), the plug-in's ``Speech2Text`` (``__call__``, ``batch_decode``,
``decode_batch``) and the streaming decoder (pieces), which raise or report
``ValueError("<argument>: <reason>")``. :func:`as_waveform` turns what the Python API
accepts (an array, a ``(samples, rate)`` pair such as ``soundfile.read`` returns, an
audio file's path) into samples and the rate the caller gave; :func:`rate_argument`
reads the ``sample_rate=`` / ``fs=`` keywords.

ESPnet's streaming data loader reads a ``sound`` entry with
``soundfile.read(path)[0]`` and drops the sample rate, and a file it cannot read (or
a preprocessing error) ends the whole run. :func:`read_utterances` reads the same
``--data_path_and_name_and_type`` triples (and ``--key_file``) itself, one utterance
at a time, keeps the sample rate of every ``sound`` file, and turns a failure (a file
that cannot be read, a key missing from a data file) into a reason attached to the
utterance's key.

Notation: L = samples (or feature frames), F = feature size, C = channels.
"""

import logging
import numbers
import os
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch

logger = logging.getLogger(__name__)

#: the name of the input the ASR model decodes
SPEECH = "speech"


class Utterance(NamedTuple):
    """One utterance as read.

    Attributes:
        key: The utterance id.
        speech: (L,), (L, C) or (L, F) float32 input, or None when it could not be read.
        rate: The sample rate of a ``sound`` file (None for other input types).
        error: Why it could not be read (None when it was).
    """

    key: str
    speech: Optional[torch.Tensor]
    rate: Optional[int]
    error: Optional[str]


def _read_table(path: str) -> Dict[str, str]:
    """``key value`` lines of a Kaldi-style file (the first occurrence of a key)."""
    table: Dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            parts = line.rstrip("\n").split(maxsplit=1)
            if parts and parts[0] not in table:
                table[parts[0]] = parts[1] if len(parts) > 1 else ""
    return table


def _keys(key_file: Optional[str], first: str) -> List[str]:
    with open(key_file or first, encoding="utf-8") as f:
        return [line.split(maxsplit=1)[0] for line in f if line.strip()]


def _loaders(types: Sequence[str]):
    """The loader of each data type (ESPnet's own, but ``sound``, which keeps the
    rate)."""
    from espnet2.train.iterable_dataset import DATA_TYPES

    loaders = []
    for t in types:
        if t == "sound":
            loaders.append(_read_sound)
        elif t in DATA_TYPES:
            loaders.append(lambda value, f=DATA_TYPES[t]: (f(value), None))
        else:
            raise ValueError(
                f"--data_path_and_name_and_type: type {t!r} is not read by this "
                f"entry point (it reads {['sound'] + sorted(DATA_TYPES)})"
            )
    return loaders


def _read_sound(value: str) -> Tuple[np.ndarray, int]:
    import soundfile

    array, rate = soundfile.read(value, dtype="float32")
    return array, int(rate)


def read_utterances(
    data_path_and_name_and_type: Sequence[Tuple[str, str, str]],
    key_file: Optional[str] = None,
    preprocess: Any = None,
) -> Iterator[Utterance]:
    """The utterances of the data files, in the order of ``key_file`` (default: of
    the first file); a failure to read one becomes its ``error``.

    Args:
        data_path_and_name_and_type: ``(path, name, type)`` triples (ESPnet's
            option); the one named ``speech`` is decoded.
        key_file: Keys to decode, one per line.
        preprocess: ESPnet's preprocessing function ``(key, data) -> data`` or None.
    """
    triples = [tuple(t) for t in data_path_and_name_and_type]
    names = [name for _, name, _ in triples]
    if SPEECH not in names:
        raise ValueError(
            f"--data_path_and_name_and_type must give a '{SPEECH}' input, got "
            f"{names}"
        )
    loaders = _loaders([t for _, _, t in triples])
    tables = [_read_table(path) for path, _, _ in triples]
    for key in _keys(key_file, triples[0][0]):
        data: Dict[str, Any] = {}
        rate = None
        try:
            for (path, name, _), table, load in zip(triples, tables, loaders):
                if key not in table:
                    raise KeyError(f"not in {path}")
                array, r = load(table[key])
                data[name] = array
                if name == SPEECH:
                    rate = r
            if preprocess is not None:
                data = preprocess(key, data)
            speech = np.asarray(data[SPEECH])
            if speech.dtype.kind != "f":
                speech = speech.astype(np.float32)
            speech = torch.from_numpy(np.ascontiguousarray(speech, dtype=np.float32))
        except Exception as e:  # any unreadable input is reported, the run goes on
            what = e.args[0] if isinstance(e, KeyError) and e.args else e
            yield Utterance(key, None, None, f"cannot be read: {what}")
            continue
        yield Utterance(key, speech, rate, None)


class InputChecks:
    """What a model can decode (module docstring).

    Args:
        fs: The model's sample rate (None: not known, or the input is not a
            waveform).
        multichannel: Whether the frontend takes several channels.
        min_samples: The shortest waveform that gives an encoder frame (None: not
            known).
        dtype: The dtype the input is given to the model in.
        waveform: Whether the model takes waveforms (a frontend) rather than
            features; default: ``fs is not None``.
    """

    def __init__(
        self,
        fs: Optional[int] = None,
        multichannel: bool = False,
        min_samples: Optional[int] = None,
        dtype: torch.dtype = torch.float32,
        waveform: Optional[bool] = None,
    ):
        self.fs = fs
        self.multichannel = multichannel
        self.min_samples = min_samples
        self.dtype = dtype
        self.waveform = fs is not None if waveform is None else bool(waveform)

    def check(
        self, speech: torch.Tensor, rate: Optional[int]
    ) -> Tuple[Optional[torch.Tensor], Optional[str]]:
        """The input as the model takes it and None, or None and why it cannot be
        decoded.

        Args:
            speech: (L,), (L, C) waveform or (L, F) features, float32.
            rate: The sample rate the caller gave (a ``sound`` file's), else None
                (not checked).
        """
        speech, bad = self.check_piece(speech, rate)
        if bad is not None:
            return None, bad
        if speech.numel() == 0:
            return None, "empty (no samples)"
        if self._waveform(rate) and self.min_samples:
            if speech.size(0) < self.min_samples:
                return None, too_short_reason(speech.size(0), self.min_samples, self.fs)
        return speech, None

    def check_piece(
        self, speech: torch.Tensor, rate: Optional[int]
    ) -> Tuple[Optional[torch.Tensor], Optional[str]]:
        """:meth:`check` without the length checks: for a piece of a stream (which
        may be empty or short).

        Args:
            speech: (n,), (n, C) or (n, F) float32.
            rate: The sample rate the caller gave, else None.
        """
        waveform = self._waveform(rate)
        if waveform and speech.dim() == 2 and speech.size(1) == 1:
            speech = speech[:, 0]
        if speech.dim() not in ((1, 2) if waveform else (2,)):
            shape = tuple(speech.shape)
            expected = "(samples,) or (samples, channels)" if waveform else "(L, F)"
            return None, f"an array of shape {shape}, expected {expected}"
        bad = _non_finite(speech, "samples" if waveform else "values")
        if bad is None and self.dtype != torch.float32:
            bad = _non_finite(speech.to(self.dtype), f"values in {_name(self.dtype)}")
        if bad is not None:
            return None, bad
        if waveform and rate is not None and self.fs is not None and rate != self.fs:
            return None, (
                f"sample rate {rate} Hz, the model's is {self.fs} Hz (resample the "
                "audio)"
            )
        if waveform and speech.dim() == 2 and not self.multichannel:
            return None, (
                f"{speech.size(1)} channels, the model takes one (mix them down or "
                "pick one)"
            )
        return speech, None

    def require(
        self, speech: torch.Tensor, rate: Optional[int], name: str = "speech"
    ) -> torch.Tensor:
        """:meth:`check` for the Python API: the input, or ``ValueError("<name>:
        <reason>")``."""
        speech, bad = self.check(speech, rate)
        if bad is not None:
            raise ValueError(f"{name}: {bad}")
        return speech

    def _waveform(self, rate: Optional[int]) -> bool:
        return self.waveform or rate is not None


def rate_argument(sample_rate: Any = None, fs: Any = None) -> Optional[int]:
    """The sample rate a caller gave as ``sample_rate=`` or ``fs=`` (ESPnet's name),
    checked (an int > 0); None when neither is given.

    Raises:
        TypeError, ValueError: not a positive int, or both given and different.
    """
    rates = []
    for name, value in (("sample_rate", sample_rate), ("fs", fs)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(
                f"{name} must be an int (samples per second), got {value!r}"
            )
        if value <= 0:
            raise ValueError(f"{name} must be > 0 samples per second, got {value}")
        rates.append(int(value))
    if len(rates) == 2 and rates[0] != rates[1]:
        raise ValueError(
            f"sample_rate={rates[0]} and fs={rates[1]} disagree (give one of them)"
        )
    return rates[0] if rates else None


def is_rate_pair(speech: Any) -> bool:
    """Whether ``speech`` is a ``(samples, rate)`` pair (what ``soundfile.read``
    returns), not a sequence of utterances."""
    return (
        isinstance(speech, tuple)
        and len(speech) == 2
        and isinstance(speech[1], numbers.Integral)
        and not isinstance(speech[1], bool)
        and not isinstance(speech[0], numbers.Number)
    )


def is_utterance_list(speech: Any) -> bool:
    """Whether ``speech`` is a list (or tuple) of utterances rather than one input
    (a ``(samples, rate)`` pair, or one given the wrong way round)."""
    return (
        isinstance(speech, (list, tuple))
        and not is_rate_pair(speech)
        and not _is_swapped_pair(speech)
    )


def _is_swapped_pair(speech: Any) -> bool:
    return isinstance(speech, tuple) and len(speech) == 2 and _is_int(speech[0])


def as_waveform(
    speech: Any, sample_rate: Optional[int] = None, name: str = "speech"
) -> Tuple[torch.Tensor, Optional[int]]:
    """What the Python API accepts as one input, as a float32 tensor and the sample
    rate the caller gave (None: not given).

    Args:
        speech: An array (numpy, torch, a list of numbers): (L,) or (L, C) samples,
            or (L, F) features; a ``(samples, rate)`` pair; or the path (``str``,
            ``os.PathLike``) of an audio file, read with its rate.
        sample_rate: The rate given by keyword (checked by :func:`rate_argument`).
        name: The argument's name in messages.

    Raises:
        TypeError: not one of these.
        ValueError: a file that cannot be read, or two rates that disagree.
    """
    carried = None
    if isinstance(speech, (str, os.PathLike)):
        speech, carried = _read_audio(speech, name)
    elif is_rate_pair(speech):
        speech, carried = speech[0], int(speech[1])
        rate_argument(carried)
    elif _is_swapped_pair(speech):
        raise TypeError(
            f"{name}: a (samples, rate) pair expected, got (rate, samples) (as "
            "scipy.io.wavfile.read returns): swap them"
        )
    if carried is not None and sample_rate is not None and carried != sample_rate:
        raise ValueError(
            f"{name}: the audio is at {carried} Hz, but sample_rate / fs says "
            f"{sample_rate} Hz"
        )
    rate = carried if carried is not None else sample_rate
    if isinstance(speech, torch.Tensor):
        tensor = speech.detach().cpu()
    else:
        try:
            array = np.asarray(speech)
        except Exception as e:  # ragged lists and the like: name the argument
            raise TypeError(f"{name}: not an array of samples ({e})") from e
        if array.dtype.kind not in "fiub":
            raise TypeError(
                f"{name} must be an array of samples (numpy, torch), a (samples, "
                f"rate) pair or an audio file's path, got {type(speech).__name__}"
            )
        tensor = torch.from_numpy(np.ascontiguousarray(array))
    if not (tensor.is_floating_point() or tensor.dtype in _INT_DTYPES):
        raise TypeError(f"{name}: samples of dtype {tensor.dtype} are not numbers")
    return tensor.float(), rate


def batch_items(speech: Any, speech_lengths: Optional[Any] = None) -> List[Any]:
    """The utterances of a batch as the Python API takes it (``batch_decode``): a
    list (or tuple) of unpadded inputs as it is, or the rows of padded samples cut to
    their lengths.

    Args:
        speech: A list of inputs (anything :func:`as_waveform` takes), or padded
            (B, L) samples.
        speech_lengths: (B,) valid samples of each row of padded ``speech``
            (required then).

    Returns:
        The list's inputs, or B tensors of (L_b,) float32 samples.

    Raises:
        ValueError: padded samples without ``speech_lengths``, or lengths that do
            not match the rows.
    """
    if isinstance(speech, (list, tuple)):
        return list(speech)
    speech, _ = as_waveform(speech, None)
    if speech_lengths is None:
        raise ValueError("speech_lengths is required with a padded speech array (B, L)")
    lengths = torch.as_tensor(np.asarray(speech_lengths)).tolist()
    if speech.dim() < 2 or len(lengths) != speech.size(0):
        raise ValueError(
            f"speech_lengths: {len(lengths)} lengths for a padded speech "
            f"array of shape {tuple(speech.shape)} (expected (B, L) and B "
            "lengths)"
        )
    return [speech[b, : int(n)] for b, n in enumerate(lengths)]


_INT_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _read_audio(path: Any, name: str) -> Tuple[np.ndarray, int]:
    try:
        return _read_sound(os.fspath(path))
    except Exception as e:  # the file's problem, named with the argument
        raise ValueError(f"{name}: {os.fspath(path)!r} cannot be read: {e}") from e


def too_short_reason(samples: int, min_samples: int, fs: Optional[int]) -> str:
    secs = f" ({samples / fs:.3f} s)" if fs else ""
    return (
        f"too short: {samples} samples{secs}, the encoder needs at least "
        f"{min_samples} samples"
    )


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _non_finite(x: torch.Tensor, what: str) -> Optional[str]:
    finite = torch.isfinite(x)
    if bool(finite.all()):
        return None
    nan = int(torch.isnan(x).sum())
    inf = int((~finite).sum()) - nan
    return f"non-finite {what}: {nan} NaN, {inf} inf (of {x.numel()})"


def model_sample_rate(train_args: Any) -> Optional[int]:
    """The sample rate a model's waveform frontend expects: ``frontend_conf.fs``
    (ESPnet's default frontend: 16 kHz when not given); None without a frontend or
    when its rate is not known."""
    frontend = getattr(train_args, "frontend", None)
    if frontend is None:
        return None
    conf = dict(getattr(train_args, "frontend_conf", None) or {})
    fs = conf.get("fs")
    if fs is None:
        return 16000 if frontend == "default" else None
    if isinstance(fs, str):
        import humanfriendly

        fs = humanfriendly.parse_size(fs)
    return int(fs)


def takes_channels(asr_model: Any) -> bool:
    """Whether the model's frontend processes several channels (ESPnet's default
    frontend with WPE or a beamformer; without them it takes the first channel of a
    multi-channel input)."""
    enhancement = getattr(getattr(asr_model, "frontend", None), "frontend", None)
    return bool(
        getattr(enhancement, "use_wpe", False)
        or getattr(enhancement, "use_beamformer", False)
    )


@torch.no_grad()
def min_encoder_samples(
    asr_model: Any, device: Any, dtype: torch.dtype, limit: int = 1 << 16
) -> Optional[int]:
    """The fewest samples whose encoding gives at least one frame, by encoding
    silence (a binary search over lengths; None when even ``limit`` samples fail).

    Any error while encoding counts as too short: ESPnet's subsampling raises
    ``TooShortUttError``, its STFT cannot reflect-pad fewer samples than half a
    window.
    """

    def frames(n: int) -> int:
        speech = torch.zeros(1, n, dtype=dtype, device=device)
        try:
            enc, lens = asr_model.encode(speech, torch.tensor([n], device=device))
        except Exception:
            return 0
        return int(lens[0])

    if frames(limit) < 1:
        return None
    lo, hi = 0, limit  # frames(lo) < 1 <= frames(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if frames(mid) >= 1:
            hi = mid
        else:
            lo = mid
    return hi


def input_checks(speech2text: Any) -> InputChecks:
    """The :class:`InputChecks` of a built ``Speech2Text`` (the decoding loop's, the
    streaming decoder's; the plug-in's ``Speech2Text`` keeps one,
    ``speech2text.input_checks()``)."""
    dtype = getattr(speech2text, "input_dtype", None) or getattr(
        torch, speech2text.dtype
    )
    fs = model_sample_rate(speech2text.asr_train_args)
    waveform = getattr(speech2text.asr_model, "frontend", None) is not None
    min_samples = None
    if waveform:
        # the plug-in's Speech2Text finds it once for the loop and its __call__
        min_samples = speech2text.min_input_samples()
        if min_samples is None:
            logger.info("the shortest input the encoder takes could not be found")
    return InputChecks(
        fs, takes_channels(speech2text.asr_model), min_samples, dtype, waveform
    )
