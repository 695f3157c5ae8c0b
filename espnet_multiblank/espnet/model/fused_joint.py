"""``model_conf.transducer_fused_joint``: the model's transducer loss through the fused
joint + loss (:func:`espnet_multiblank.fused_transducer_loss`, ``docs/fused.md``).

ESPnet's ``JointNetwork`` computes ``lin_out(act(lin_enc(enc_out) + lin_dec(dec_out)))``
over every (t, u) pair: a (B, T, U, V) tensor, its gradient and the (B, T, U, J)
hidden activations. With the key set, the model applies ``lin_enc`` and ``lin_dec`` as
the ordinary modules they are (autograd, (B, T, J) and (B, U, J)) and hands the rest,
the activation and ``lin_out``'s weight and bias, to the fused function, which never
holds more than a tile of those. The parameters are the joint network's own: the
state dict, the checkpoints and decoding (which calls the joint network) are those of
the dense model, and the costs and gradients are the dense path's to float32 rounding.

Only a joint network whose forward is known to be exactly that can be fused: ESPnet's
own class with its four parts and nothing else, a plain ``torch.nn.Linear`` as output
layer and an elementwise activation the fused function can differentiate
(:func:`espnet_multiblank.fused.activations.joint_activation`). :func:`check_fusable`
says what is wrong with any other, as a ConfigError naming the key, when the model is
built and again at every call (a hook or a module set on the joint network later
would be skipped silently otherwise).
"""

import torch
from espnet2.asr_transducer.joint_network import JointNetwork

from espnet_multiblank.espnet.errors import ConfigError
from espnet_multiblank.espnet.model.model_conf import TransducerConf, key
from espnet_multiblank.fused import fused_transducer_loss
from espnet_multiblank.fused.activations import joint_activation

#: the parts of ESPnet's JointNetwork, all that its forward uses
_PARTS = ("lin_enc", "lin_dec", "lin_out", "joint_activation")

#: the hook tables of a torch module (its forward and backward hooks)
_HOOK_TABLES = (
    "_forward_pre_hooks",
    "_forward_hooks",
    "_backward_pre_hooks",
    "_backward_hooks",
)


def _refuse(what: str) -> ConfigError:
    return ConfigError(
        f"{key('transducer_fused_joint')}: true cannot fuse this joint network: "
        f"{what}. The fused path computes ESPnet's JointNetwork (espnet2."
        "asr_transducer.joint_network) exactly as its forward does: lin_out(act("
        "lin_enc(enc_out) + lin_dec(dec_out))) with lin_out a torch.nn.Linear and "
        "act an elementwise activation without parameters; set "
        f"{key('transducer_fused_joint')}: false for any other joint network"
    )


def _hooked(module: torch.nn.Module) -> bool:
    return any(getattr(module, table, None) for table in _HOOK_TABLES)


def check_fusable(joint_network: torch.nn.Module, out_features: int) -> None:
    """Whether the fused path computes what ``joint_network``'s forward computes.

    Args:
        joint_network: the model's joint network.
        out_features: the output layer's expected width: V, or V + D for a TDT.

    Raises:
        ConfigError: naming ``model_conf.transducer_fused_joint`` and what is wrong
            (another class, a missing or extra part, an output layer that is not a
            plain ``torch.nn.Linear`` of ``out_features`` units, an activation the
            fused function does not know, hooks that the fused path would skip).
    """
    cls = type(joint_network)
    if cls is not JointNetwork:  # a subclass's forward may compute anything
        raise _refuse(
            f"it is {cls.__module__}.{cls.__qualname__}, not ESPnet's JointNetwork"
        )
    children = dict(joint_network.named_children())
    missing = [name for name in _PARTS if name not in children]
    extra = sorted(set(children) - set(_PARTS))
    if missing or extra:
        raise _refuse(
            f"its modules are {sorted(children)}; expected exactly {sorted(_PARTS)}"
        )
    own = list(joint_network._parameters) + list(joint_network._buffers)
    if own:
        raise _refuse(f"it has parameters or buffers of its own: {own}")
    lin_out = children["lin_out"]
    if type(lin_out) is not torch.nn.Linear:  # parametrized, quantized, ...
        cls = type(lin_out)
        raise _refuse(
            f"its lin_out is {cls.__module__}.{cls.__qualname__}, not a "
            "torch.nn.Linear"
        )
    if lin_out.out_features != out_features:
        raise _refuse(
            f"its lin_out has {lin_out.out_features} outputs, the model's lattice "
            f"needs {out_features}"
        )
    try:
        joint_activation(children["joint_activation"])
    except (TypeError, ValueError) as e:
        raise _refuse(f"its joint_activation is not one it knows ({e})") from None
    hooked = [
        name
        for name, module in (
            ("the joint network", joint_network),
            ("lin_out", lin_out),
            ("joint_activation", children["joint_activation"]),
        )
        if _hooked(module)
    ]
    if hooked:
        raise _refuse(
            f"{' and '.join(hooked)} have forward or backward hooks, which the fused "
            "path would not run (it calls lin_enc and lin_dec only)"
        )


class FusedJointLoss:
    """Per-utterance transducer costs through the fused joint + loss.

    Built by the model's constructor when ``transducer_fused_joint`` is true; holds
    the loss options only (no modules, no state): the joint network is passed at
    every call, so the parameters and the state dict stay the joint network's.
    """

    def __init__(
        self,
        joint_network: torch.nn.Module,
        conf: TransducerConf,
        blank: int,
        vocab_size: int,
    ) -> None:
        """Check the joint network (ConfigError naming the key) and fix the options.

        Args:
            joint_network: the model's joint network (its ``lin_out`` already has
                the TDT's V + D outputs).
            conf: the validated plug-in keys.
            blank: the standard blank's index.
            vocab_size: V, the token vocabulary (all blanks included).
        """
        self.out_features = vocab_size + len(conf.tdt_durations)
        check_fusable(joint_network, self.out_features)
        self.omega = conf.tdt_omega
        self.options = dict(
            blank=blank,
            big_blank_durations=conf.big_blank_durations,
            tdt_durations=conf.tdt_durations or None,
            reduction="none",  # reduced over the utterances with a path (no_path)
            sigma=conf.sigma,
            fastemit_lambda=conf.fastemit_lambda,
            clamp=conf.clamp,
            backend=conf.loss_backend,
        )

    def __call__(
        self,
        joint_network: torch.nn.Module,
        encoder_out: torch.Tensor,
        decoder_out: torch.Tensor,
        target: torch.Tensor,
        t_len: torch.Tensor,
        u_len: torch.Tensor,
        training: bool,
    ) -> torch.Tensor:
        """The costs the dense path gives for the joint network's logits.

        Args:
            joint_network: the model's joint network (checked again: ConfigError).
            encoder_out: (B, T, D_enc) encoder output.
            decoder_out: (B, U, D_dec) prediction network output (U = L_max + 1).
            target: (B, L_max) int32 labels.
            t_len: (B,) int32 encoder lengths T_b.
            u_len: (B,) int32 label counts L_b.
            training: a training step: a TDT draws omega's plain RNN-T step (the
                dense model's training criterion); otherwise omega is 0 (its
                validation criterion).

        Returns:
            (B,) float32 costs, ``+inf`` for an utterance without a path; gradients
            flow into the joint network's parameters, ``encoder_out`` and
            ``decoder_out``. Under autocast ``lin_enc`` / ``lin_dec`` run as autocast
            makes them; the activation, the output layer and the loss compute in
            float32.
        """
        check_fusable(joint_network, self.out_features)
        lin_out = joint_network.lin_out
        return fused_transducer_loss(
            joint_network.lin_enc(encoder_out),
            joint_network.lin_dec(decoder_out),
            lin_out.weight,
            lin_out.bias,
            target,
            t_len,
            u_len,
            activation=joint_network.joint_activation,
            omega=self.omega if training else 0.0,
            **self.options,
        )
