"""Errors raised by the ESPnet integration."""


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the YAML key
    (e.g. ``model_conf.transducer_clamp``)."""
