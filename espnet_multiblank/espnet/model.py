"""ESPnet ASR model whose transducer branch uses the espnet-multiblank loss.

Selected from YAML with ``model: multiblank_espnet`` once
:func:`espnet_multiblank.espnet.registration.register` has run.
"""

import logging
import math
from numbers import Real
from typing import Any, List, Optional, Sequence, Tuple, Union

import torch
from espnet2.asr.ctc import CTC
from espnet2.asr.decoder.abs_decoder import AbsDecoder
from espnet2.asr.encoder.abs_encoder import AbsEncoder
from espnet2.asr.espnet_model import ESPnetASRModel
from espnet2.asr.frontend.abs_frontend import AbsFrontend
from espnet2.asr.postencoder.abs_postencoder import AbsPostEncoder
from espnet2.asr.preencoder.abs_preencoder import AbsPreEncoder
from espnet2.asr.specaug.abs_specaug import AbsSpecAug
from espnet2.asr.transducer.error_calculator import ErrorCalculatorTransducer
from espnet2.asr_transducer.utils import get_transducer_task_io
from espnet2.layers.abs_normalize import AbsNormalize
from espnet.nets.e2e_asr_common import ErrorCalculator
from typeguard import typechecked

from espnet_multiblank.decoding import (
    JointStepper,
    MultiblankGreedySearch,
    TDTGreedySearch,
)
from espnet_multiblank.espnet.errors import ConfigError
from espnet_multiblank.espnet.exact_encoding import make_batch_exact
from espnet_multiblank.lattice import (
    MultiblankLattice,
    TDTLattice,
    check_big_blank_durations,
    check_tdt_durations,
    lattice_from_config,
)
from espnet_multiblank.loss.api import BACKENDS, MultiblankRNNTLoss
from espnet_multiblank.loss.options import REDUCTIONS
from espnet_multiblank.loss.tdt_api import TDTLoss

logger = logging.getLogger(__name__)

#: transducer_reduction values (the loss's reductions that give a scalar)
MODEL_REDUCTIONS = tuple(r for r in REDUCTIONS if r != "none")

#: ctc_conf.ctc_type values whose blank index can be set (torch.nn.CTCLoss).
_CTC_TYPES_WITH_BLANK = ("builtin", "builtin2")


def _key(name: str) -> str:
    return f"model_conf.{name}"


def check_model_conf(
    transducer_multi_blank_durations: Any,
    transducer_multi_blank_sigma: Any,
    transducer_fastemit_lambda: Any,
    transducer_clamp: Any,
    transducer_reduction: Any,
    transducer_loss_backend: Any,
    transducer_tdt_durations: Any = (),
    transducer_tdt_omega: Any = 0.0,
) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """Validate the plug-in's ``model_conf`` keys.

    Returns:
        The big-blank durations and the TDT durations, as tuples (at most one of
        them non-empty).

    Raises:
        ConfigError: naming the offending ``model_conf.<key>``.
    """
    key = _key("transducer_multi_blank_durations")
    value = transducer_multi_blank_durations
    try:
        if value is not None and not isinstance(value, (list, tuple)):
            raise TypeError(f"got {type(value).__name__} {value!r}")
        durations = check_big_blank_durations(value, key)
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"{key} must be a list of distinct integers >= 2 (e.g. [2, 4, 8]; [] for "
            f"a standard transducer): {e}"
        ) from None
    tdt_key = _key("transducer_tdt_durations")
    value = transducer_tdt_durations
    tdt: Tuple[int, ...] = ()
    try:
        if value is not None and not isinstance(value, (list, tuple)):
            raise TypeError(f"got {type(value).__name__} {value!r}")
        if value:
            tdt = check_tdt_durations(value, tdt_key)
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"{tdt_key} must be a list of distinct integers >= 0 with at least one "
            f">= 1 (e.g. [0, 1, 2, 3, 4]; [] for no TDT): {e}"
        ) from None
    if tdt and durations:
        try:  # the lattice module owns the rule (any valid blank index will do here)
            lattice_from_config(len(durations), durations, tdt, key, tdt_key)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    omega = transducer_tdt_omega
    if (
        isinstance(omega, bool)
        or not isinstance(omega, Real)
        or not math.isfinite(omega)
        or not 0.0 <= omega <= 1.0
    ):
        raise ConfigError(
            f"{_key('transducer_tdt_omega')} must be a probability in [0, 1] (how "
            f"often a batch is trained with the plain RNN-T loss), got {omega!r}"
        )
    for name, value in (
        ("transducer_multi_blank_sigma", transducer_multi_blank_sigma),
        ("transducer_fastemit_lambda", transducer_fastemit_lambda),
        ("transducer_clamp", transducer_clamp),
    ):
        if (
            isinstance(value, bool)
            or not isinstance(value, Real)
            or not math.isfinite(value)
            or value < 0
        ):
            hint = " (0 disables it)" if name == "transducer_clamp" else ""
            raise ConfigError(
                f"{_key(name)} must be a finite number >= 0{hint}, got {value!r}"
            )
    if transducer_reduction not in MODEL_REDUCTIONS:
        raise ConfigError(
            f"{_key('transducer_reduction')} must be one of {list(MODEL_REDUCTIONS)} "
            f"(the trainer needs a scalar), got {transducer_reduction!r}"
        )
    if transducer_loss_backend not in BACKENDS:
        raise ConfigError(
            f"{_key('transducer_loss_backend')} must be one of {list(BACKENDS)}, got "
            f"{transducer_loss_backend!r}"
        )
    return durations, tdt


def _check_token_layout(
    token_list: Sequence[str],
    sym_blank: str,
    durations: Tuple[int, ...],
    tdt_durations: Tuple[int, ...] = (),
) -> Union[MultiblankLattice, TDTLattice]:
    """The model's lattice; checks the token list has the blanks where it says.

    Raises:
        ConfigError: naming ``model_conf.sym_blank`` or
            ``model_conf.transducer_multi_blank_durations``.
    """
    if sym_blank not in token_list:
        raise ConfigError(
            f"{_key('sym_blank')}={sym_blank!r} is not in token_list: a transducer "
            "needs a blank symbol"
        )
    blank = list(token_list).index(sym_blank)
    blank_name = f"the index of {sym_blank!r} in token_list"
    key = _key("transducer_multi_blank_durations")
    if tdt_durations:  # check_model_conf refused big blanks next to TDT durations
        return TDTLattice.create(
            blank,
            tdt_durations,
            blank_name=blank_name,
            durations_name=_key("transducer_tdt_durations"),
        )
    try:
        lattice = MultiblankLattice.create(
            blank, durations, blank_name=blank_name, durations_name=key
        )
    except ValueError as e:
        raise ConfigError(f"{key}={list(durations)}: {e}") from None
    for index, token in lattice.token_layout(sym_blank)[1:]:
        if token_list[index] != token:
            raise ConfigError(
                f"{key}={list(durations)}: token_list[{index}] must be {token!r} (big "
                f"blank i sits at index blank - 1 - i), got {token_list[index]!r}; "
                "ESPnet's ASRTask inserts these tokens when model_conf lists the "
                "durations"
            )
    return lattice


class MultiblankErrorCalculatorTransducer(ErrorCalculatorTransducer):
    """ESPnet's transducer CER/WER calculator with the right (multi-)blank handling.

    ESPnet's calculator decodes with ``BeamSearchTransducer`` (which treats
    ``decoder.blank_id`` as the only blank, so big blanks would be emitted as labels)
    and strips blanks by string replacement. This one decodes the whole batch with the
    plug-in's batched greedy search of the model's lattice (multi-blank: big blanks
    skip their frames; TDT, ``tdt_durations`` set: TDT greedy search over the joint
    network's V + D outputs) over the valid frames only, and drops every blank id
    (standard and big) from hypotheses and references before scoring.
    """

    def __init__(
        self,
        decoder: AbsDecoder,
        joint_network: torch.nn.Module,
        token_list: List[str],
        sym_space: str,
        sym_blank: str,
        blank_id: int,
        big_blank_durations: Sequence[int] = (),
        report_cer: bool = False,
        report_wer: bool = False,
        tdt_durations: Sequence[int] = (),
    ):
        super().__init__(
            decoder,
            joint_network,
            token_list,
            sym_space,
            sym_blank,
            report_cer=report_cer,
            report_wer=report_wer,
        )
        if tdt_durations:
            lattice = TDTLattice.create(blank_id, tdt_durations)
            self.beam_search = TDTGreedySearch(
                JointStepper(
                    decoder, joint_network, len(token_list) + lattice.num_durations
                ),
                lattice,
                max_sym_per_frame=5,
            )
        else:
            lattice = MultiblankLattice.create(blank_id, big_blank_durations)
            self.beam_search = MultiblankGreedySearch(
                JointStepper(decoder, joint_network, len(token_list)),
                lattice,
                max_sym_per_frame=5,
            )
        self.blank_ids = frozenset(lattice.blank_ids)

    def convert_to_char(self, pred, target) -> Tuple[List[str], List[str]]:
        """Token ids to strings, dropping all blanks (and padding) by id."""

        def to_str(ids) -> str:
            tokens = [
                self.token_list[int(i)]
                for i in ids
                if int(i) >= 0 and int(i) not in self.blank_ids
            ]
            return "".join(tokens).replace(self.space, " ")

        return [to_str(p) for p in pred], [to_str(r) for r in target]

    def __call__(
        self,
        encoder_out: torch.Tensor,
        target: torch.Tensor,
        encoder_out_lens: torch.Tensor,
    ) -> Tuple[Optional[float], Optional[float]]:
        """Sentence-level CER and WER of greedy hypotheses.

        Args:
            encoder_out: Encoder output sequences. (B, T, D_enc)
            target: Target label ID sequences. (B, L)
            encoder_out_lens: Valid frames per utterance. (B,)
        """
        device = next(self.decoder.parameters()).device
        encoder_out = encoder_out.to(device)
        hyps = self.beam_search.search_batch(encoder_out, encoder_out_lens)
        pred = [h.yseq[1:] for h in hyps]
        char_pred, char_target = self.convert_to_char(pred, target)
        cer = self.calculate_cer(char_pred, char_target) if self.report_cer else None
        wer = self.calculate_wer(char_pred, char_target) if self.report_wer else None
        return cer, wer


def _add_duration_outputs(
    joint_network: torch.nn.Module, vocab_size: int, num_durations: int
) -> None:
    """Give the joint network's output layer V + D units (in place).

    ESPnet's ``ASRTask`` builds ``JointNetwork(vocab_size, ...)``, whose ``lin_out``
    has V outputs; a TDT needs D duration logits after them. The layer is rebuilt here
    in the model's constructor, so that rebuilding a model from its config (ESPnet's
    ``build_model_from_file``) gives the shapes of the saved state dict. A layer that
    already has V + D outputs is kept.

    Raises:
        ConfigError: the joint network has no ``lin_out`` ``torch.nn.Linear`` with V
            or V + D outputs.
    """
    lin_out = getattr(joint_network, "lin_out", None)
    key = _key("transducer_tdt_durations")
    if not isinstance(lin_out, torch.nn.Linear):
        raise ConfigError(
            f"{key}: a TDT needs a joint network whose output layer is a "
            f"torch.nn.Linear named lin_out (ESPnet's JointNetwork), got "
            f"{type(joint_network).__name__}"
        )
    if lin_out.out_features == vocab_size + num_durations:
        return
    if lin_out.out_features != vocab_size:
        raise ConfigError(
            f"{key}: the joint network's lin_out has {lin_out.out_features} outputs; "
            f"expected the vocabulary size {vocab_size} (or {vocab_size} + "
            f"{num_durations} duration logits)"
        )
    joint_network.lin_out = torch.nn.Linear(
        lin_out.in_features,
        vocab_size + num_durations,
        bias=lin_out.bias is not None,
        device=lin_out.weight.device,
        dtype=lin_out.weight.dtype,
    )


class MultiblankCTCErrorCalculator(ErrorCalculator):
    """ESPnet's CTC CER calculator that also treats big blanks as blank."""

    def __init__(self, *args, big_blank_ids: Sequence[int] = (), **kwargs):
        super().__init__(*args, **kwargs)
        self.big_blank_ids = tuple(big_blank_ids)

    def __call__(self, ys_hat, ys_pad, is_ctc=False):
        if is_ctc and self.big_blank_ids and self.idx_blank is not None:
            ys_hat = ys_hat.clone()
            for i in self.big_blank_ids:
                ys_hat[ys_hat == i] = self.idx_blank
        return super().__call__(ys_hat, ys_pad, is_ctc=is_ctc)


class MultiblankESPnetASRModel(ESPnetASRModel):
    """ESPnet ASR model with a (multi-blank) transducer trained by espnet-multiblank.

    YAML: ``model: multiblank_espnet``, ``decoder: transducer`` (+ ``joint_net_conf``)
    and, in ``model_conf``, every key of ESPnet's ``ESPnetASRModel`` plus:

    * ``transducer_multi_blank_durations``: big-blank durations, e.g. ``[2, 4, 8]``;
      ``[]`` = standard RNN-T (no ``warprnnt_pytorch`` needed). ESPnet's
      ``ASRTask.build_model`` reads this key from ``model_conf`` (whatever the model)
      and inserts ``<blank{d}>`` before ``<blank>`` in the token list.
    * ``transducer_tdt_durations``: a token-and-duration transducer (TDT) with these
      durations, e.g. ``[0, 1, 2, 3, 4]`` (distinct ints >= 0, one >= 1 at least; not
      together with big blanks); ``[]`` (default) = no TDT. The joint network's output
      layer ``lin_out`` gets V + D units (V token logits, then D duration logits); the
      token list is not changed. Loss: :class:`~espnet_multiblank.TDTLoss`.
    * ``transducer_tdt_omega`` (default 0): probability that a training batch uses the
      plain RNN-T loss on the token logits instead (NeMo's omega; validation always
      uses the TDT loss).
    * ``transducer_multi_blank_sigma`` (default 0.05): logit under-normalisation (for a
      TDT: subtracted from the token log-probabilities, not from the durations).
    * ``transducer_fastemit_lambda`` (default 0): FastEmit weight.
    * ``transducer_clamp`` (default 0 = off): clip the loss gradient to [-c, c].
    * ``transducer_reduction`` (default "mean" = sum / batch, ESPnet's): also "sum",
      "mean_volume" (NeMo's mean of cost / target length).
    * ``transducer_loss_backend`` (default "auto"): "auto", "numba" or "torch".

    Attributes (the contract used by espnet-multiblank's searches and inference):
        blank_id (int): index of the standard blank ``sym_blank`` in ``token_list``.
        big_blank_durations (Tuple[int, ...]): ``(d_0, ..., d_{N-1})``; ``()`` for a
            standard transducer.
        big_blank_ids (Tuple[int, ...]): index of big blank ``i`` =
            ``blank_id - 1 - i``.
        tdt_durations (Tuple[int, ...]): the TDT's durations; ``()`` for a
            (multi-blank) RNN-T.
        lattice (MultiblankLattice | TDTLattice): the model's lattice
            (``docs/lattice.md``).
        decoder (TransducerDecoder): ESPnet's prediction network; its ``blank_id`` is
            set to ``blank_id`` (ESPnet leaves 0, i.e. the longest big blank) and its
            embedding's ``padding_idx`` is the standard blank (the start symbol has a
            zero, untrained embedding, as in ESPnet's standard transducer).
        joint_network (JointNetwork): ESPnet's joint network; outputs raw logits over
            the whole vocabulary (all blanks included), followed for a TDT by the
            duration logits.
        token_list (List[str]): vocabulary, big blanks included.
        criterion_transducer (MultiblankRNNTLoss | TDTLoss): the loss (raw logits
            in).
        transducer_multi_blank_durations (List[int]): same as ``big_blank_durations``
            (ESPnet's attribute name, read by ESPnet's ``Speech2Text``).
        batch_exact_encoding (BatchExactness): whether ``encode`` gives each
            utterance of a padded batch what it gives the utterance alone (see
            :mod:`espnet_multiblank.espnet.exact_encoding`; in training too).

    The CTC branch (if ``ctc_weight > 0``) uses the standard blank as CTC blank, and
    validation CER/WER decode greedily with big blanks (TDT durations) skipping frames
    and strip every blank symbol. CTC has its own output layer over the V tokens on
    the encoder output: the TDT's duration logits are the joint network's only.
    """

    @typechecked
    def __init__(
        self,
        vocab_size: int,
        token_list: Union[Tuple[str, ...], List[str]],
        frontend: Optional[AbsFrontend],
        specaug: Optional[AbsSpecAug],
        normalize: Optional[AbsNormalize],
        preencoder: Optional[AbsPreEncoder],
        encoder: Optional[AbsEncoder],
        postencoder: Optional[AbsPostEncoder],
        decoder: Optional[AbsDecoder],
        ctc: CTC,
        joint_network: Optional[torch.nn.Module],
        aux_ctc: Optional[dict] = None,
        ctc_weight: float = 0.5,
        interctc_weight: float = 0.0,
        ignore_id: int = -1,
        lsm_weight: float = 0.0,
        length_normalized_loss: bool = False,
        report_cer: bool = True,
        report_wer: bool = True,
        sym_space: str = "<space>",
        sym_blank: str = "<blank>",
        transducer_multi_blank_durations: Any = (),
        transducer_multi_blank_sigma: Any = 0.05,
        transducer_tdt_durations: Any = (),
        transducer_tdt_omega: Any = 0.0,
        transducer_fastemit_lambda: Any = 0.0,
        transducer_clamp: Any = 0.0,
        transducer_reduction: Any = "mean",
        transducer_loss_backend: Any = "auto",
        sym_sos: str = "<sos/eos>",
        sym_eos: str = "<sos/eos>",
        autocast_frontend: bool = False,
        extract_feats_in_collect_stats: bool = True,
        lang_token_id: int = -1,
    ):
        durations, tdt_durations = check_model_conf(
            transducer_multi_blank_durations,
            transducer_multi_blank_sigma,
            transducer_fastemit_lambda,
            transducer_clamp,
            transducer_reduction,
            transducer_loss_backend,
            transducer_tdt_durations,
            transducer_tdt_omega,
        )
        if joint_network is None or decoder is None:
            raise ConfigError(
                "model: multiblank_espnet is a transducer: set decoder: transducer "
                "(and joint_net_conf)"
            )
        if not 0.0 <= ctc_weight <= 1.0:
            raise ConfigError(
                f"{_key('ctc_weight')} must be in [0, 1], got {ctc_weight}"
            )
        lattice = _check_token_layout(token_list, sym_blank, durations, tdt_durations)
        blank_id = lattice.blank
        if tdt_durations:
            _add_duration_outputs(joint_network, vocab_size, len(tdt_durations))
        if ctc_weight > 0 and ctc.ctc_type not in _CTC_TYPES_WITH_BLANK and blank_id:
            raise ConfigError(
                f"ctc_conf.ctc_type={ctc.ctc_type!r} always uses blank 0, but the "
                f"standard blank is {blank_id}: use ctc_type "
                f"{' or '.join(_CTC_TYPES_WITH_BLANK)}, or model_conf.ctc_weight: 0"
            )

        # ESPnet's constructor imports warprnnt_pytorch for an empty duration list; a
        # non-empty list makes it build its own (unused) Numba loss instead, which
        # is replaced below.
        super().__init__(
            vocab_size=vocab_size,
            token_list=token_list,
            frontend=frontend,
            specaug=specaug,
            normalize=normalize,
            preencoder=preencoder,
            encoder=encoder,
            postencoder=postencoder,
            decoder=decoder,
            ctc=ctc,
            joint_network=joint_network,
            aux_ctc=aux_ctc,
            ctc_weight=ctc_weight,
            interctc_weight=interctc_weight,
            ignore_id=ignore_id,
            lsm_weight=lsm_weight,
            length_normalized_loss=length_normalized_loss,
            report_cer=report_cer,
            report_wer=report_wer,
            sym_space=sym_space,
            sym_blank=sym_blank,
            transducer_multi_blank_durations=list(durations) or [2],
            transducer_multi_blank_sigma=float(transducer_multi_blank_sigma),
            sym_sos=sym_sos,
            sym_eos=sym_eos,
            autocast_frontend=autocast_frontend,
            extract_feats_in_collect_stats=extract_feats_in_collect_stats,
            lang_token_id=lang_token_id,
        )
        assert self.blank_id == blank_id, (self.blank_id, blank_id)

        self.lattice = lattice
        self.big_blank_durations: Tuple[int, ...] = durations
        self.big_blank_ids: Tuple[int, ...] = tuple(
            getattr(lattice, "big_blank_ids", ())
        )
        self.tdt_durations: Tuple[int, ...] = tdt_durations
        self.transducer_multi_blank_durations = list(durations)
        loss_options = dict(
            blank=blank_id,
            reduction=transducer_reduction,
            fastemit_lambda=float(transducer_fastemit_lambda),
            clamp=float(transducer_clamp),
            sigma=float(transducer_multi_blank_sigma),
            backend=transducer_loss_backend,
        )
        self.criterion_transducer_eval = None
        if tdt_durations:
            self.criterion_transducer = TDTLoss(
                durations=tdt_durations,
                omega=float(transducer_tdt_omega),
                **loss_options,
            )
            if transducer_tdt_omega > 0:  # a deterministic validation loss
                self.criterion_transducer_eval = TDTLoss(
                    durations=tdt_durations, omega=0.0, **loss_options
                )
        else:
            self.criterion_transducer = MultiblankRNNTLoss(
                big_blank_durations=durations, **loss_options
            )

        # The prediction network starts from, and searches treat as blank, the
        # standard blank (ESPnet leaves decoder.blank_id = embed_pad = 0).
        self.decoder.blank_id = blank_id
        embed = getattr(self.decoder, "embed", None)
        if isinstance(embed, torch.nn.Embedding) and embed.padding_idx != blank_id:
            embed.padding_idx = blank_id
            with torch.no_grad():
                embed.weight[blank_id].zero_()

        # CTC: torch.nn.CTCLoss defaults to blank 0 (the longest big blank here).
        if self.ctc is not None and self.ctc.ctc_type in _CTC_TYPES_WITH_BLANK:
            old = self.ctc.ctc_loss
            self.ctc.ctc_loss = torch.nn.CTCLoss(
                blank=blank_id,
                reduction=old.reduction,
                zero_infinity=old.zero_infinity,
            )

        if report_cer or report_wer:
            self.error_calculator_trans = MultiblankErrorCalculatorTransducer(
                self.decoder,
                self.joint_network,
                list(token_list),
                sym_space,
                sym_blank,
                blank_id=blank_id,
                big_blank_durations=durations,
                report_cer=report_cer,
                report_wer=report_wer,
                tdt_durations=tdt_durations,
            )
        elif self.error_calculator is not None:
            self.error_calculator = MultiblankCTCErrorCalculator(
                list(token_list),
                sym_space,
                sym_blank,
                report_cer,
                report_wer,
                big_blank_ids=self.big_blank_ids,
            )

        # Padded utterances encoded as alone, in training as in (batched) decoding.
        make_batch_exact(self)

    def joint_logits(
        self, encoder_out: torch.Tensor, decoder_out: torch.Tensor
    ) -> torch.Tensor:
        """Raw joint-network logits (B, T, U, V) for encoder (B, T, D) and decoder
        (B, U, D) outputs ((B, T, U, V + D) for a TDT: token, then duration logits)."""
        return self.joint_network(encoder_out.unsqueeze(2), decoder_out.unsqueeze(1))

    def _calc_transducer_loss(
        self,
        encoder_out: torch.Tensor,
        encoder_out_lens: torch.Tensor,
        labels: torch.Tensor,
    ):
        """Transducer loss (espnet-multiblank) and, in eval mode, CER/WER.

        Args:
            encoder_out: Encoder output sequences. (B, T, D_enc)
            encoder_out_lens: Encoder output sequences lengths. (B,)
            labels: Label ID sequences, padded with ``ignore_id``. (B, L)

        Returns:
            loss_transducer, cer_transducer, wer_transducer
        """
        decoder_in, target, t_len, u_len = get_transducer_task_io(
            labels,
            encoder_out_lens,
            ignore_id=self.ignore_id,
            blank_id=self.blank_id,
        )
        self.decoder.set_device(encoder_out.device)
        decoder_out = self.decoder(decoder_in)
        joint_out = self.joint_logits(encoder_out, decoder_out)

        # The loss computes in float32 whatever autocast chose for the joint network.
        if joint_out.dtype not in (torch.float32, torch.float64):
            joint_out = joint_out.float()
        criterion = self.criterion_transducer
        if not self.training and self.criterion_transducer_eval is not None:
            criterion = self.criterion_transducer_eval
        with torch.autocast(device_type=joint_out.device.type, enabled=False):
            loss_transducer = criterion(joint_out, target, t_len, u_len)

        cer_transducer, wer_transducer = None, None
        if not self.training and self.error_calculator_trans is not None:
            cer_transducer, wer_transducer = self.error_calculator_trans(
                encoder_out, target, encoder_out_lens
            )
        return loss_transducer, cer_transducer, wer_transducer
