"""ESPnet ASR model whose transducer branch uses the espnet-multiblank loss.

Selected from YAML with ``model: multiblank_espnet`` once
:func:`espnet_multiblank.espnet.registration.register` has run. Its sibling modules
in :mod:`espnet_multiblank.espnet.model` do the rest: ``model_conf`` checks its
``model_conf`` keys, ``no_path`` leaves utterances without a path out of the training
loss, ``fused_joint`` runs that loss through the fused joint + loss, and
``error_calculators`` give the validation CER/WER.
"""

import inspect
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from espnet2.asr.ctc import CTC
from espnet2.asr.decoder.abs_decoder import AbsDecoder
from espnet2.asr.encoder.abs_encoder import AbsEncoder
from espnet2.asr.espnet_model import ESPnetASRModel
from espnet2.asr.frontend.abs_frontend import AbsFrontend
from espnet2.asr.postencoder.abs_postencoder import AbsPostEncoder
from espnet2.asr.preencoder.abs_preencoder import AbsPreEncoder
from espnet2.asr.specaug.abs_specaug import AbsSpecAug
from espnet2.asr_transducer.utils import get_transducer_task_io
from espnet2.layers.abs_normalize import AbsNormalize
from espnet2.torch_utils.device_funcs import force_gatherable
from typeguard import typechecked

from espnet_multiblank.espnet.batch_exact import exact_encoding
from espnet_multiblank.espnet.batch_exact.exact_encoding import (
    BatchExactness,
    make_batch_exact,
)
from espnet_multiblank.espnet.errors import ConfigError
from espnet_multiblank.espnet.model.error_calculators import (
    MultiblankCTCErrorCalculator,
    MultiblankErrorCalculatorTransducer,
)
from espnet_multiblank.espnet.model.fused_joint import FusedJointLoss
from espnet_multiblank.espnet.model.model_conf import (
    FUSED_JOINT_DEFAULT,
    KEYS,
    MULTI_BLANK_SIGMA_DEFAULT,
    TransducerConf,
    check_model_conf,
    key,
)
from espnet_multiblank.espnet.model.no_path import NoPathWarnings, reduce_over_paths
from espnet_multiblank.lattice import MultiblankLattice, TDTLattice
from espnet_multiblank.loss.api import MultiblankRNNTLoss, TDTLoss

#: ctc_conf.ctc_type values whose blank index can be set (torch.nn.CTCLoss).
_CTC_TYPES_WITH_BLANK = ("builtin", "builtin2")

#: the stat (ESPnet's train/valid logs) with the share of utterances left out of the
#: transducer loss for having no path
NO_PATH_STAT = "transducer_no_path_fraction"


def _check_token_layout(
    token_list: Sequence[str],
    sym_blank: str,
    conf: TransducerConf,
) -> Union[MultiblankLattice, TDTLattice]:
    """The model's lattice; checks the token list has the blanks where it says.

    Raises:
        ConfigError: naming ``model_conf.sym_blank`` or
            ``model_conf.transducer_multi_blank_durations``.
    """
    if sym_blank not in token_list:
        raise ConfigError(
            f"{key('sym_blank')}={sym_blank!r} is not in token_list: a transducer "
            "needs a blank symbol"
        )
    blank = list(token_list).index(sym_blank)
    durations, tdt_durations = conf.big_blank_durations, conf.tdt_durations
    blank_name = f"the index of {sym_blank!r} in token_list"
    durations_key = key("transducer_multi_blank_durations")
    if tdt_durations:  # check_model_conf refused big blanks next to TDT durations
        return TDTLattice.create(
            blank,
            tdt_durations,
            blank_name=blank_name,
            durations_name=key("transducer_tdt_durations"),
        )
    try:
        lattice = MultiblankLattice.create(
            blank, durations, blank_name=blank_name, durations_name=durations_key
        )
    except ValueError as e:
        raise ConfigError(f"{durations_key}={list(durations)}: {e}") from None
    for index, token in lattice.token_layout(sym_blank)[1:]:
        if token_list[index] != token:
            raise ConfigError(
                f"{durations_key}={list(durations)}: token_list[{index}] must be "
                f"{token!r} (big blank i sits at index blank - 1 - i), got "
                f"{token_list[index]!r}; "
                "ESPnet's ASRTask inserts these tokens when model_conf lists the "
                "durations"
            )
    return lattice


def _check_transducer_parts(
    decoder: Optional[AbsDecoder],
    joint_network: Optional[torch.nn.Module],
    ctc_weight: float,
) -> None:
    """The model needs ESPnet's transducer decoder and joint network."""
    if joint_network is None or decoder is None:
        raise ConfigError(
            "model: multiblank_espnet is a transducer: set decoder: transducer "
            "(and joint_net_conf)"
        )
    if not 0.0 <= ctc_weight <= 1.0:
        raise ConfigError(f"{key('ctc_weight')} must be in [0, 1], got {ctc_weight}")


def _check_ctc_blank(ctc: CTC, ctc_weight: float, blank_id: int) -> None:
    """ESPnet's other CTC implementations hard-code blank 0."""
    if ctc_weight > 0 and ctc.ctc_type not in _CTC_TYPES_WITH_BLANK and blank_id:
        raise ConfigError(
            f"ctc_conf.ctc_type={ctc.ctc_type!r} always uses blank 0, but the "
            f"standard blank is {blank_id}: use ctc_type "
            f"{' or '.join(_CTC_TYPES_WITH_BLANK)}, or model_conf.ctc_weight: 0"
        )


def _customisation(layer: torch.nn.Linear) -> str:
    """What makes ``layer`` more than a plain ``torch.nn.Linear`` ("" if nothing):
    a subclass (also torch's parametrizations), forward hooks (weight_norm,
    spectral_norm) or parameters other than weight and bias."""
    if type(layer) is not torch.nn.Linear:
        return f"a {type(layer).__name__} (not a plain torch.nn.Linear)"
    if layer._forward_pre_hooks or layer._forward_hooks:
        return "a torch.nn.Linear with forward hooks (e.g. weight_norm)"
    names = sorted(n for n, _ in layer.named_parameters(recurse=False))
    if not set(names) <= {"weight", "bias"}:
        return f"a torch.nn.Linear with parameters {names}"
    return ""


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
            or V + D outputs, or one with V outputs that is customised (weight norm,
            a parametrization, a subclass): rebuilding it would drop that.
    """
    lin_out = getattr(joint_network, "lin_out", None)
    tdt_key = key("transducer_tdt_durations")
    if not isinstance(lin_out, torch.nn.Linear):
        raise ConfigError(
            f"{tdt_key}: a TDT needs a joint network whose output layer is a "
            f"torch.nn.Linear named lin_out (ESPnet's JointNetwork), got "
            f"{type(joint_network).__name__}"
        )
    if lin_out.out_features == vocab_size + num_durations:
        return
    custom = _customisation(lin_out)
    if custom:
        # rebuilding it as a plain Linear would silently drop the customisation
        raise ConfigError(
            f"{tdt_key}: the joint network's lin_out is {custom}; a TDT rebuilds "
            f"lin_out with {vocab_size} + {num_durations} outputs and can only do so "
            f"for a plain torch.nn.Linear. Give the joint network V + D outputs "
            f"itself, or drop the customisation"
        )
    if lin_out.out_features != vocab_size:
        raise ConfigError(
            f"{tdt_key}: the joint network's lin_out has {lin_out.out_features} "
            f"outputs; expected the vocabulary size {vocab_size} (or {vocab_size} + "
            f"{num_durations} duration logits)"
        )
    joint_network.lin_out = torch.nn.Linear(
        lin_out.in_features,
        vocab_size + num_durations,
        bias=lin_out.bias is not None,
        device=lin_out.weight.device,
        dtype=lin_out.weight.dtype,
    )


class MultiblankESPnetASRModel(ESPnetASRModel):
    """ESPnet ASR model with a (multi-blank) transducer trained by espnet-multiblank.

    YAML: ``model: multiblank_espnet``, ``decoder: transducer`` (+ ``joint_net_conf``)
    and, in ``model_conf``, every key of ESPnet's ``ESPnetASRModel`` plus:

    * ``transducer_multi_blank_durations``: big-blank durations, e.g. ``[2, 4, 8]``;
      ``[]`` = standard RNN-T (no ``warprnnt_pytorch`` needed). ESPnet's
      ``ASRTask.build_model`` reads this key from ``model_conf`` (whatever the model)
      and inserts ``<blank{d}>`` before ``<blank>`` in the token list.
    * ``transducer_multi_blank_sigma`` (default 0.05): logit under-normalisation of a
      standard or multi-blank model.
    * ``transducer_tdt_durations``: a token-and-duration transducer (TDT) with these
      durations, e.g. ``[0, 1, 2, 3, 4]`` (distinct ints >= 0, one >= 1 at least; not
      together with big blanks); ``[]`` (default) = no TDT. The joint network's output
      layer ``lin_out`` gets V + D units (V token logits, then D duration logits); the
      token list is not changed. Loss: :class:`~espnet_multiblank.TDTLoss`. Durations
      that leave some encoder lengths without any path (e.g. ``[0, 2, 4]``: every odd
      length) are refused unless ``transducer_allow_unreachable_lengths`` is true.
    * ``transducer_tdt_sigma`` (default: ``transducer_multi_blank_sigma``'s value, the
      key a TDT read before it had its own): a TDT's sigma, subtracted from the token
      log-probabilities (not from the durations).
    * ``transducer_tdt_omega`` (default 0): probability that a training batch uses the
      plain RNN-T loss on the token logits instead (NeMo's omega; validation always
      uses the TDT loss).
    * ``transducer_fastemit_lambda`` (default 0): FastEmit weight.
    * ``transducer_clamp`` (default 0 = off): clip the loss gradient to [-c, c].
    * ``transducer_reduction`` (default "mean"): the loss's reductions but "none"
      (README's table), over the K utterances of the batch that have a path: "mean"
      = their sum / K (ESPnet's sum / batch when every utterance has one), "sum",
      "mean_batch" (= "mean"), "mean_volume" (NeMo's: sum of costs / sum of target
      lengths), "mean_label_normalized" (NeMo's "mean": mean of cost / target
      length).
    * ``transducer_loss_backend`` (default "auto"): "auto", "numba" or "torch".
    * ``transducer_allow_unreachable_lengths`` (default false): accept TDT durations
      that some encoder lengths cannot be reached with.
    * ``batch_exact_encoding`` (default true): make the encoder padding-invariant in
      training and decoding
      (:mod:`espnet_multiblank.espnet.batch_exact.exact_encoding`); false trains
      ESPnet's encoder layers as they are.
    * ``transducer_fused_joint`` (default false): the training and validation loss
      runs the joint network's activation and output layer inside the fused joint +
      loss (:mod:`espnet_multiblank.espnet.model.fused_joint`): no (B, T, U, V)
      tensor, the same parameters, costs and gradients; decoding is unchanged. A
      joint network it cannot fuse is refused when the model is built.

    Utterances without a path (see :mod:`espnet_multiblank.espnet.model.no_path`) are
    left out of the transducer loss with a warning; the stats hold their share of the
    batch as ``transducer_no_path_fraction``.

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
        transducer_conf (TransducerConf): the validated plug-in keys.
        decoder (TransducerDecoder): ESPnet's prediction network; its ``blank_id`` is
            set to ``blank_id`` (ESPnet leaves 0, i.e. the longest big blank) and its
            embedding's ``padding_idx`` is the standard blank (the start symbol has a
            zero, untrained embedding, as in ESPnet's standard transducer).
        joint_network (JointNetwork): ESPnet's joint network; outputs raw logits over
            the whole vocabulary (all blanks included), followed for a TDT by the
            duration logits.
        token_list (List[str]): vocabulary, big blanks included.
        criterion_transducer (MultiblankRNNTLoss | TDTLoss): the loss (raw logits
            in), with reduction "none": per-utterance costs (B,), which the model
            reduces with ``transducer_conf.reduction``.
        transducer_multi_blank_durations (List[int]): same as ``big_blank_durations``
            (ESPnet's attribute name, read by ESPnet's ``Speech2Text``).
        batch_exact_encoding (BatchExactness): whether ``encode`` gives each
            utterance of a padded batch what it gives the utterance alone (see
            :mod:`espnet_multiblank.espnet.batch_exact.exact_encoding`; in training
            too).
        fused_joint_loss (FusedJointLoss | None): the fused joint + loss that
            computes the transducer costs instead of ``joint_network`` +
            ``criterion_transducer`` when ``transducer_fused_joint`` is true (it
            holds options only; the parameters are ``joint_network``'s).

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
        transducer_multi_blank_sigma: Any = MULTI_BLANK_SIGMA_DEFAULT,
        transducer_tdt_durations: Any = (),
        transducer_tdt_sigma: Any = None,
        transducer_tdt_omega: Any = 0.0,
        transducer_fastemit_lambda: Any = 0.0,
        transducer_clamp: Any = 0.0,
        transducer_reduction: Any = "mean",
        transducer_loss_backend: Any = "auto",
        transducer_allow_unreachable_lengths: Any = False,
        batch_exact_encoding: Any = True,
        transducer_fused_joint: Any = FUSED_JOINT_DEFAULT,
        sym_sos: str = "<sos/eos>",
        sym_eos: str = "<sos/eos>",
        autocast_frontend: bool = False,
        extract_feats_in_collect_stats: bool = True,
        lang_token_id: int = -1,
    ):
        conf = check_model_conf(
            transducer_multi_blank_durations=transducer_multi_blank_durations,
            transducer_multi_blank_sigma=transducer_multi_blank_sigma,
            transducer_tdt_durations=transducer_tdt_durations,
            transducer_tdt_sigma=transducer_tdt_sigma,
            transducer_tdt_omega=transducer_tdt_omega,
            transducer_fastemit_lambda=transducer_fastemit_lambda,
            transducer_clamp=transducer_clamp,
            transducer_reduction=transducer_reduction,
            transducer_loss_backend=transducer_loss_backend,
            transducer_allow_unreachable_lengths=transducer_allow_unreachable_lengths,
            batch_exact_encoding=batch_exact_encoding,
            transducer_fused_joint=transducer_fused_joint,
        )
        _check_transducer_parts(decoder, joint_network, ctc_weight)
        lattice = _check_token_layout(token_list, sym_blank, conf)
        if conf.tdt_durations:
            _add_duration_outputs(joint_network, vocab_size, len(conf.tdt_durations))
        _check_ctc_blank(ctc, ctc_weight, lattice.blank)
        fused_joint_loss = None
        if conf.fused_joint:  # checks the joint network, before anything is built
            fused_joint_loss = FusedJointLoss(
                joint_network, conf, lattice.blank, vocab_size
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
            transducer_multi_blank_durations=list(conf.big_blank_durations) or [2],
            transducer_multi_blank_sigma=conf.sigma,
            sym_sos=sym_sos,
            sym_eos=sym_eos,
            autocast_frontend=autocast_frontend,
            extract_feats_in_collect_stats=extract_feats_in_collect_stats,
            lang_token_id=lang_token_id,
        )
        assert self.blank_id == lattice.blank, (self.blank_id, lattice.blank)
        self._set_lattice(lattice, conf)
        self._build_criteria(conf)
        self._use_standard_blank()
        self._build_error_calculators(
            list(token_list), sym_space, sym_blank, report_cer, report_wer
        )
        self._set_batch_exact_encoding(conf.batch_exact_encoding)
        self.fused_joint_loss: Optional[FusedJointLoss] = fused_joint_loss

    def _set_lattice(
        self, lattice: Union[MultiblankLattice, TDTLattice], conf: TransducerConf
    ) -> None:
        """The lattice attributes of the contract (class docstring)."""
        self.lattice = lattice
        self.transducer_conf = conf
        self.big_blank_durations: Tuple[int, ...] = conf.big_blank_durations
        self.big_blank_ids: Tuple[int, ...] = tuple(
            getattr(lattice, "big_blank_ids", ())
        )
        self.tdt_durations: Tuple[int, ...] = conf.tdt_durations
        self.transducer_multi_blank_durations = list(conf.big_blank_durations)
        self._no_path_warnings = NoPathWarnings()
        self._no_path_fraction: Optional[torch.Tensor] = None

    def _build_criteria(self, conf: TransducerConf) -> None:
        """The transducer loss (per-utterance costs) and, for a TDT trained with
        omega > 0, a deterministic (omega = 0) one for validation."""
        options = dict(
            blank=self.blank_id,
            reduction="none",  # reduced over the utterances with a path (no_path)
            fastemit_lambda=conf.fastemit_lambda,
            clamp=conf.clamp,
            sigma=conf.sigma,
            backend=conf.loss_backend,
        )
        self.criterion_transducer_eval = None
        if conf.tdt_durations:
            self.criterion_transducer = TDTLoss(
                durations=conf.tdt_durations, omega=conf.tdt_omega, **options
            )
            if conf.tdt_omega > 0:
                self.criterion_transducer_eval = TDTLoss(
                    durations=conf.tdt_durations, omega=0.0, **options
                )
        else:
            self.criterion_transducer = MultiblankRNNTLoss(
                big_blank_durations=conf.big_blank_durations, **options
            )

    def _use_standard_blank(self) -> None:
        """The prediction network starts from, and searches treat as blank, the
        standard blank (ESPnet leaves decoder.blank_id = embed_pad = 0), and so does
        CTC (torch.nn.CTCLoss defaults to blank 0, the longest big blank here)."""
        blank_id = self.blank_id
        self.decoder.blank_id = blank_id
        embed = getattr(self.decoder, "embed", None)
        if isinstance(embed, torch.nn.Embedding) and embed.padding_idx != blank_id:
            embed.padding_idx = blank_id
            with torch.no_grad():
                embed.weight[blank_id].zero_()
        if self.ctc is not None and self.ctc.ctc_type in _CTC_TYPES_WITH_BLANK:
            old = self.ctc.ctc_loss
            self.ctc.ctc_loss = torch.nn.CTCLoss(
                blank=blank_id,
                reduction=old.reduction,
                zero_infinity=old.zero_infinity,
            )

    def _build_error_calculators(
        self,
        token_list: List[str],
        sym_space: str,
        sym_blank: str,
        report_cer: bool,
        report_wer: bool,
    ) -> None:
        """Validation CER/WER that treat every blank as blank."""
        if report_cer or report_wer:
            self.error_calculator_trans = MultiblankErrorCalculatorTransducer(
                self.decoder,
                self.joint_network,
                token_list,
                sym_space,
                sym_blank,
                blank_id=self.blank_id,
                big_blank_durations=self.big_blank_durations,
                report_cer=report_cer,
                report_wer=report_wer,
                tdt_durations=self.tdt_durations,
            )
        elif self.error_calculator is not None:
            self.error_calculator = MultiblankCTCErrorCalculator(
                token_list,
                sym_space,
                sym_blank,
                report_cer,
                report_wer,
                big_blank_ids=self.big_blank_ids,
            )

    def _set_batch_exact_encoding(self, enabled: bool) -> None:
        """Padded utterances encoded as alone, in training as in (batched) decoding;
        or ESPnet's encoder as it is (the plug-in's batched decoding still makes the
        model exact when it loads it: Speech2Text.batch_exactness)."""
        if enabled:
            make_batch_exact(self)
        else:
            setattr(
                self,
                exact_encoding.ATTRIBUTE,
                BatchExactness(False, f"{key('batch_exact_encoding')} is false"),
            )

    def forward(
        self,
        speech: torch.Tensor,
        speech_lengths: torch.Tensor,
        text: torch.Tensor,
        text_lengths: torch.Tensor,
        **kwargs,
    ) -> Tuple[torch.Tensor, Dict[str, torch.Tensor], torch.Tensor]:
        """ESPnet's forward (frontend, encoder, CTC and transducer losses); the stats
        also hold ``transducer_no_path_fraction``, the share of the batch's
        utterances left out of the transducer loss for having no path (ESPnet
        weights stats by the batch size, so an epoch's value is its share too).

        Args:
            speech: (B, L, ...) input.
            speech_lengths: (B,) input lengths.
            text: (B, L_max) label ids, padded with -1 / ``ignore_id``.
            text_lengths: (B,) label counts.

        Returns:
            ``(loss, stats, weight)`` as ESPnet's ``ESPnetASRModel.forward``.
        """
        self._no_path_fraction = None
        loss, stats, weight = super().forward(
            speech, speech_lengths, text, text_lengths, **kwargs
        )
        if self._no_path_fraction is not None:
            stats[NO_PATH_STAT] = force_gatherable(self._no_path_fraction, loss.device)
            self._no_path_fraction = None
        return loss, stats, weight

    def joint_logits(
        self, encoder_out: torch.Tensor, decoder_out: torch.Tensor
    ) -> torch.Tensor:
        """Raw joint-network logits (B, T, U, V) for encoder (B, T, D) and decoder
        (B, U, D) outputs ((B, T, U, V + D) for a TDT: token, then duration logits)."""
        return self.joint_network(encoder_out.unsqueeze(2), decoder_out.unsqueeze(1))

    def _transducer_costs(
        self,
        encoder_out: torch.Tensor,
        decoder_out: torch.Tensor,
        target: torch.Tensor,
        t_len: torch.Tensor,
        u_len: torch.Tensor,
    ) -> torch.Tensor:
        """Per-utterance transducer costs: the joint network and the loss (or,
        with ``transducer_fused_joint``, the fused joint + loss: the same costs and
        gradients).

        Args:
            encoder_out: (B, T, D_enc) encoder output.
            decoder_out: (B, U, D_dec) prediction network output (U = L_max + 1).
            target: (B, L_max) int32 labels.
            t_len: (B,) int32 encoder lengths T_b.
            u_len: (B,) int32 label counts L_b.

        Returns:
            (B,) float32 costs, ``+inf`` for an utterance without a path.
        """
        if self.fused_joint_loss is not None:
            return self.fused_joint_loss(
                self.joint_network,
                encoder_out,
                decoder_out,
                target,
                t_len,
                u_len,
                training=self.training,
            )
        joint_out = self.joint_logits(encoder_out, decoder_out)
        # The loss computes in float32 whatever autocast chose for the joint network.
        if joint_out.dtype not in (torch.float32, torch.float64):
            joint_out = joint_out.float()
        criterion = self.criterion_transducer
        if not self.training and self.criterion_transducer_eval is not None:
            criterion = self.criterion_transducer_eval
        with torch.autocast(device_type=joint_out.device.type, enabled=False):
            return criterion(joint_out, target, t_len, u_len)

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
            loss_transducer (the configured reduction over the utterances that have
            a path; 0 with zero gradient when none has), cer_transducer,
            wer_transducer
        """
        decoder_in, target, t_len, u_len = get_transducer_task_io(
            labels,
            encoder_out_lens,
            ignore_id=self.ignore_id,
            blank_id=self.blank_id,
        )
        self.decoder.set_device(encoder_out.device)
        decoder_out = self.decoder(decoder_in)
        costs = self._transducer_costs(encoder_out, decoder_out, target, t_len, u_len)
        loss_transducer, no_path = reduce_over_paths(
            costs, u_len, self.transducer_conf.reduction
        )
        self._no_path_warnings(self.lattice, no_path, t_len, u_len)
        self._no_path_fraction = no_path.to(torch.float32).mean()

        cer_transducer, wer_transducer = None, None
        if not self.training and self.error_calculator_trans is not None:
            cer_transducer, wer_transducer = self.error_calculator_trans(
                encoder_out, target, encoder_out_lens
            )
        return loss_transducer, cer_transducer, wer_transducer


def model_conf_defaults() -> Dict[str, Any]:
    """The defaults of the keys :func:`check_model_conf` validates: the constructor's
    (their one definition, also what ESPnet's ``--print_config`` shows)."""
    params = inspect.signature(MultiblankESPnetASRModel.__init__).parameters
    return {name: params[name].default for name in KEYS}
