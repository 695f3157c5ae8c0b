"""ESPnet language models and n-gram files as the plug-in searches' fused LMs.

:func:`build_fusion` turns what ESPnet's inference options give (``--lm_train_config
--lm_file --lm_weight``: an LM trained with ``espnet2.bin.lm_train``; ``--ngram_file
--ngram_weight``: an ARPA or KenLM binary file) into the
:class:`~espnet_multiblank.decoding.ShallowFusion` the searches take:

* :class:`RNNLM`: ESPnet's ``SequentialRNNLM`` (``lm: seq_rnn``, ESPnet's default),
  stepped as one batched call per search step with its state kept as tensors;
* :class:`BatchScorerLM`: any other ESPnet LM with ``batch_score`` (``lm:
  transformer``), one batched call per prefix length;
* :class:`KenLMNgram`: an n-gram file through ``kenlm`` (the optional ``ngram``
  extra: ``pip install espnet-multiblank[ngram]``).

Token ids: the LM has its own token list (its training config's ``token_list``); the
ASR model's may differ (ESPnet inserts ``<blank8> <blank4> <blank2>`` into a
multi-blank model's list). Tokens are matched by their text; ESPnet's LMs start and end
a sentence with their last token (``<sos/eos>``), an n-gram with ``<s>`` / ``</s>``. A
label the LM does not know is scored as its ``<unk>`` (refused when it has none);
blanks are never scored.

Scores are natural logarithms: KenLM's log10 scores are multiplied by ln 10 (ESPnet's
attention-decoder n-gram scorer uses them as they are, so an ``--ngram_weight`` tuned
there corresponds to ``ngram_weight / ln 10`` here).
"""

import logging
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch

from espnet_multiblank.decoding.fusion import ShallowFusion, TokenLM, check_weight

logger = logging.getLogger(__name__)

LN10 = math.log(10.0)
#: ESPnet's LMs: the last token of the list is the start and end of a sentence
SOS_EOS = "<sos/eos>"
UNK = "<unk>"


def lm_token_ids(
    asr_tokens: Sequence[str],
    lm_tokens: Sequence[str],
    blank_ids: Sequence[int],
    option: str = "--lm_train_config",
) -> List[int]:
    """The LM's id of every ASR token (-1 for the blanks).

    Args:
        asr_tokens: The ASR model's token list (V entries).
        lm_tokens: The LM's token list (its last entry starts and ends a sentence).
        blank_ids: The blanks of the ASR model's lattice.
        option: Named in the error message.

    Raises:
        ValueError: a label the LM does not know while it has no ``<unk>``.
    """
    index = {tok: i for i, tok in enumerate(lm_tokens)}
    eos = len(lm_tokens) - 1
    blanks = set(blank_ids)
    ids, unknown = [], []
    for k, tok in enumerate(asr_tokens):
        if k in blanks:
            ids.append(-1)
        elif tok in index:
            ids.append(index[tok])
        elif tok == SOS_EOS:
            ids.append(eos)
        else:
            unknown.append(tok)
            ids.append(index.get(UNK, -1))
    if unknown:
        if UNK not in index:
            raise ValueError(
                f"{option}: the LM's token list lacks {unknown[:10]} (labels of the "
                f"ASR model) and has no {UNK} to score them with; train the LM with "
                "the ASR model's token list"
            )
        logger.warning(
            "%s: %d labels of the ASR model are not in the LM's token list and are "
            "scored as %s: %s",
            option,
            len(unknown),
            UNK,
            unknown[:10],
        )
    return ids


class _MappedLM(TokenLM):
    """Common part of the ESPnet LM adapters: ASR ids -> LM ids, LM log-probs -> the
    ASR tokens' columns."""

    def __init__(self, lm: Any, token_ids: Sequence[int], lm_vocab: int):
        if hasattr(lm, "eval"):
            lm.eval()  # ESPnet's transducer path leaves the LM in training mode
        self.lm = lm
        self.vocab_size = len(token_ids)
        self.lm_vocab = int(lm_vocab)
        self.sos = self.eos = self.lm_vocab - 1
        self._ids = torch.tensor(token_ids, dtype=torch.long)
        if int(self._ids.max()) >= self.lm_vocab:
            raise ValueError(
                f"token ids up to {int(self._ids.max())} for an LM of {self.lm_vocab} "
                "outputs"
            )
        self._device_ids: Dict[torch.device, torch.Tensor] = {}

    def ids(self, device: torch.device) -> torch.Tensor:
        ids = self._device_ids.get(device)
        if ids is None:
            ids = self._device_ids[device] = self._ids.clamp(min=0).to(device)
        return ids

    def to_lm(self, labels: torch.Tensor) -> torch.Tensor:
        """(A,) ASR label ids -> LM ids (a blank becomes LM id 0: its row is never
        used)."""
        return self.ids(labels.device)[labels]

    def scores(self, logits: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(A, V_lm) LM logits -> (A, V) next-label and (A,) end log-probabilities."""
        logp = logits.float().log_softmax(-1)
        return logp[:, self.ids(logp.device)], logp[:, self.eos]


class RNNLM(_MappedLM):
    """ESPnet's ``SequentialRNNLM`` (duck-typed: ``rnn`` an ``nn.LSTM`` / ``nn.GRU`` /
    ``nn.RNN``, ``forward(input (A, 1), hidden) -> ((A, 1, V_lm), hidden)``).

    The state is a tuple of (N, A, H) tensors, ``(h, c)`` for an LSTM, ``(h,)``
    otherwise.

    Args:
        lm: The LM module (ESPnet's ``ESPnetLanguageModel.lm``).
        token_ids: The LM id of every ASR token (:func:`lm_token_ids`).
    """

    def __init__(self, lm: Any, token_ids: Sequence[int]):
        super().__init__(lm, token_ids, lm.decoder.out_features)
        self.lstm = isinstance(lm.rnn, torch.nn.LSTM)

    def _run(self, tokens: torch.Tensor, state):
        hidden = None if state is None else (state if self.lstm else state[0])
        out, hidden = self.lm(tokens.view(-1, 1), hidden)  # (A, 1, V_lm)
        labels, end = self.scores(out[:, 0])
        return labels, end, tuple(hidden) if self.lstm else (hidden,)

    @torch.no_grad()
    def start(self, batch: int, device: torch.device):
        tokens = torch.full((batch,), self.sos, dtype=torch.long, device=device)
        return self._run(tokens, None)

    @torch.no_grad()
    def step(self, labels: torch.Tensor, state):
        return self._run(self.to_lm(labels), state)

    def select_state(self, state, idx):
        return tuple(x[:, idx] for x in state)

    def cat_states(self, states):
        return tuple(torch.cat(xs, dim=1) for xs in zip(*states))

    def scatter_state(self, state, idx, rows):
        for x, r in zip(state, rows):
            x[:, idx] = r

    def where_state(self, mask, new, old):
        keep = mask.view(1, -1, 1)
        return tuple(torch.where(keep, n, o) for n, o in zip(new, old))


class _RowListState:
    """State operations of an adapter whose state is a list with one entry per
    row."""

    def select_state(self, state, idx):
        return [state[i] for i in idx.tolist()]

    def cat_states(self, states):
        return [row for s in states for row in s]

    def scatter_state(self, state, idx, rows):
        for i, row in zip(idx.tolist(), rows):
            state[i] = row


class BatchScorerLM(_RowListState, _MappedLM):
    """Any ESPnet LM with ``batch_score(ys (n, L), states, xs)`` (``TransformerLM``):
    the state of a row is ``(LM-id prefix, the LM's state)``, and rows with prefixes
    of the same length are scored in one call.

    Args:
        lm: The LM module.
        token_ids: The LM id of every ASR token.
        lm_vocab: The LM's output size.
    """

    def _score(self, prefixes: List[Tuple[int, ...]], states: List[Any], device):
        A = len(prefixes)
        labels = torch.empty(A, self.vocab_size, device=device)
        end = torch.empty(A, device=device)
        new_states: List[Any] = [None] * A
        groups: Dict[Tuple[int, bool], List[int]] = {}
        for a, (p, s) in enumerate(zip(prefixes, states)):
            groups.setdefault((len(p), s is None), []).append(a)
        for rows in groups.values():
            ys = torch.tensor([prefixes[a] for a in rows], device=device)
            logp, out = self.lm.batch_score(ys, [states[a] for a in rows], None)
            lab, eos = self.scores(logp)
            idx = torch.tensor(rows, device=device)
            labels[idx], end[idx] = lab, eos
            for a, s in zip(rows, out):
                new_states[a] = s
        return labels, end, [(p, s) for p, s in zip(prefixes, new_states)]

    @torch.no_grad()
    def start(self, batch: int, device: torch.device):
        return self._score([(self.sos,)] * batch, [None] * batch, device)

    @torch.no_grad()
    def step(self, labels: torch.Tensor, state):
        ids = self.to_lm(labels).tolist()
        prefixes = [p + (k,) for (p, _), k in zip(state, ids)]
        return self._score(prefixes, [s for _, s in state], labels.device)


class KenLMNgram(_RowListState, TokenLM):
    """An n-gram language model (ARPA or KenLM binary file) through ``kenlm``.

    The state of a row is a ``kenlm.State``; the next-label scores of a state are
    computed once for every token (V KenLM look-ups) and cached.

    Args:
        path: The n-gram file.
        asr_tokens: The ASR model's token list (V entries): its texts are the n-gram's
            words; ``<sos/eos>`` is ``</s>``.
        blank_ids: The blanks (never scored).
        option: Named in messages.
    """

    #: cached states (cleared when full)
    cache_size = 100000

    def __init__(
        self,
        path: str,
        asr_tokens: Sequence[str],
        blank_ids: Sequence[int],
        option: str = "--ngram_file",
    ):
        try:
            import kenlm
        except ImportError as e:
            raise ImportError(
                f"{option} needs the kenlm package: pip install "
                "'espnet-multiblank[ngram]' (or pip install kenlm)"
            ) from e
        self._kenlm = kenlm
        try:
            self.model = kenlm.Model(str(path))
        except (OSError, RuntimeError) as e:
            raise ValueError(f"{option}: cannot read {path}: {e}") from e
        self.vocab_size = len(asr_tokens)
        blanks = set(blank_ids)
        self.words: List[Optional[str]] = [
            None if k in blanks else ("</s>" if tok == SOS_EOS else tok)
            for k, tok in enumerate(asr_tokens)
        ]
        unknown = [w for w in self.words if w is not None and w not in self.model]
        if unknown:
            logger.warning(
                "%s: %d labels are not in the n-gram's vocabulary and get its <unk> "
                "score: %s",
                option,
                len(unknown),
                unknown[:10],
            )
        self._cache: Dict[Any, Tuple[List[float], float]] = {}

    def _next(self, state) -> Tuple[List[float], float]:
        got = self._cache.get(state)
        if got is None:
            out = self._kenlm.State()
            score = self.model.BaseScore
            labels = [
                0.0 if w is None else LN10 * score(state, w, out) for w in self.words
            ]
            got = (labels, LN10 * score(state, "</s>", out))
            if len(self._cache) >= self.cache_size:
                self._cache.clear()
            self._cache[state] = got
        return got

    def _output(self, states, device):
        rows = [self._next(s) for s in states]
        labels = torch.tensor([r[0] for r in rows], dtype=torch.float32, device=device)
        end = torch.tensor([r[1] for r in rows], dtype=torch.float32, device=device)
        return labels.view(len(states), self.vocab_size), end, list(states)

    def start(self, batch: int, device: torch.device):
        state = self._kenlm.State()
        self.model.BeginSentenceWrite(state)
        return self._output([state] * batch, device)

    def step(self, labels: torch.Tensor, state):
        new = []
        for s, k in zip(state, labels.tolist()):
            word = self.words[k]
            if word is None:  # a blank (a row whose result is discarded)
                new.append(s)
                continue
            out = self._kenlm.State()
            self.model.BaseScore(s, word, out)
            new.append(out)
        return self._output(new, labels.device)


def espnet_lm(lm: Any, token_ids: Sequence[int], lm_vocab: int) -> TokenLM:
    """The adapter of an ESPnet LM module: :class:`RNNLM` for a ``SequentialRNNLM``,
    :class:`BatchScorerLM` for any other LM with ``batch_score``."""
    if (
        hasattr(lm, "rnn")
        and isinstance(lm.rnn, torch.nn.RNNBase)
        and isinstance(getattr(lm, "decoder", None), torch.nn.Linear)
    ):
        return RNNLM(lm, token_ids)
    if not hasattr(lm, "batch_score"):
        raise TypeError(
            f"--lm_train_config: {type(lm).__name__} has no batch_score: it cannot be "
            "fused into a transducer search"
        )
    return BatchScorerLM(lm, token_ids, lm_vocab)


def read_token_list(lm_train_config: Any) -> List[str]:
    """The ``token_list`` of an LM training config (a list, or a file of one token
    per line)."""
    import yaml

    with open(lm_train_config, encoding="utf-8") as f:
        config = yaml.safe_load(f)
    tokens = config.get("token_list") if isinstance(config, dict) else None
    if isinstance(tokens, str):
        with open(tokens, encoding="utf-8") as f:
            tokens = [line.rstrip("\n") for line in f]
    if not isinstance(tokens, list) or not tokens:
        raise ValueError(
            f"--lm_train_config {lm_train_config} has no token_list (an LM config "
            "written by espnet2.bin.lm_train has one)"
        )
    return [str(t) for t in tokens]


def build_fusion(
    blank_ids: Sequence[int],
    token_list: Sequence[str],
    lm: Any = None,
    lm_token_list: Optional[Sequence[str]] = None,
    lm_weight: float = 1.0,
    ngram_file: Union[str, None] = None,
    ngram_weight: float = 0.9,
) -> Optional[ShallowFusion]:
    """The fused language models of a search, or None when there are none.

    Args:
        blank_ids: The lattice's blanks.
        token_list: The ASR model's token list (the search's V tokens).
        lm: An ESPnet LM module (``ESPnetLanguageModel.lm``), or None.
        lm_token_list: The LM's token list (required with ``lm``).
        lm_weight: ``--lm_weight``.
        ngram_file: ``--ngram_file``, or None.
        ngram_weight: ``--ngram_weight``.
    """
    lms, weights, names = [], [], []
    if lm is not None:
        if lm_token_list is None:
            raise ValueError("an LM needs its token list (--lm_train_config)")
        ids = lm_token_ids(token_list, lm_token_list, blank_ids)
        lms.append(espnet_lm(lm, ids, len(lm_token_list)))
        weights.append(check_weight("--lm_weight", lm_weight))
        names.append("lm")
    if ngram_file is not None:
        lms.append(KenLMNgram(ngram_file, token_list, blank_ids))
        weights.append(check_weight("--ngram_weight", ngram_weight))
        names.append("ngram")
    if not lms:
        return None
    return ShallowFusion(lms, weights, blank_ids, names)
