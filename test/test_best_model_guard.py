"""NaN epochs never chosen as ESPnet's best model (registration/best_model_guard.py),
against ESPnet's own Reporter: its values are registered as the trainer does."""

import logging
import random

import pytest

import espnet_multiblank
import espnet_multiblank.espnet.registration.quiet  # noqa: F401  (before espnet2)
from espnet_multiblank.espnet.registration import best_model_guard

espnet_multiblank.register()

from espnet2.train.reporter import Reporter  # noqa: E402

NAN = float("nan")


def espnet_sort(reporter, key, key2, mode):
    """ESPnet 202511's Reporter.sort_epochs_and_values, as it is (the method the
    guard replaces), for comparison."""
    values = [(e, reporter.stats[e][key][key2]) for e in reporter.stats]
    if mode == "min":
        return sorted(values, key=lambda x: x[1])
    return sorted(values, key=lambda x: -x[1])


def reporter_with(values, key2="loss"):
    """A Reporter with one valid value per epoch (epochs 1, 2, ...); a NaN epoch is
    one whose batches all had an infinite loss (ESPnet averages finite ones only)."""
    reporter = Reporter()
    for epoch, value in enumerate(values, 1):
        reporter.set_epoch(epoch)
        with reporter.observe("valid") as sub:
            batch = float("inf") if value != value else value
            sub.register({key2: batch}, weight=4)
            sub.next()
    return reporter


def test_register_installs_the_guard():
    assert Reporter.sort_epochs_and_values is best_model_guard.sort_epochs_and_values


@pytest.mark.parametrize(
    "values, espnet_best, best",
    [
        ([NAN, 2.0, 1.5], 1, 3),  # a NaN first epoch stays ESPnet's best
        ([3.0, NAN, 2.0], 1, 3),  # and misranks the finite ones around it
        ([5.0, NAN, 4.0, 1.0, 3.0], 1, 4),
    ],
)
def test_nan_epochs_are_left_out(values, espnet_best, best, caplog):
    reporter = reporter_with(values)
    assert espnet_sort(reporter, "valid", "loss", "min")[0][0] == espnet_best
    with caplog.at_level(logging.WARNING):
        assert reporter.get_best_epoch("valid", "loss", "min") == best
        ranked = reporter.sort_epochs_and_values("valid", "loss", "min")
    finite = sorted((v, e) for e, v in enumerate(values, 1) if v == v)
    assert ranked == [(e, v) for v, e in finite]
    nan_epochs = ", ".join(str(e) for e, v in enumerate(values, 1) if v != v)
    warned = [r.getMessage() for r in caplog.records]
    assert warned == [
        f"best_model_criterion valid.loss is NaN in epoch(s) {nan_epochs} (no batch "
        "gave a finite value): left out of the choice of the best models"
    ]  # once, though sorted twice


def test_every_epoch_nan_stops(caplog):
    reporter = reporter_with([NAN, NAN])
    with pytest.raises(
        best_model_guard.NaNCriterionError,
        match=r"best_model_criterion valid\.loss \(min\) is NaN in every epoch so far "
        r"\(1, 2\)",
    ):
        reporter.get_best_epoch("valid", "loss", "min")


@pytest.mark.parametrize("mode", ["min", "max"])
def test_finite_values_ranked_as_espnet_does(mode):
    """Ties included (stable order), ints and floats: ESPnet's order (an epoch's
    value is finite or NaN: ESPnet's reporter averages the finite batches only)."""
    rng = random.Random(0)
    for _ in range(50):
        values = [
            rng.choice([1.0, 2.0, 2.0, 0.5, 3, -1.25, 7.5])
            for _ in range(rng.randint(1, 9))
        ]
        reporter = reporter_with(values, key2="acc")
        assert reporter.sort_epochs_and_values("valid", "acc", mode) == espnet_sort(
            reporter, "valid", "acc", mode
        )


def test_espnet_errors_kept():
    reporter = reporter_with([1.0])
    with pytest.raises(ValueError, match="mode must min or max"):
        reporter.sort_epochs_and_values("valid", "loss", "best")
    with pytest.raises(KeyError, match="valid.cer is not found"):
        reporter.sort_epochs_and_values("valid", "cer", "min")
