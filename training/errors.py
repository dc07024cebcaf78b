"""One exception root for the training side, with subclasses by cause.

Callers catch ``TrainingError`` for anything training raises on purpose; each subclass says which
input to fix (a data file, a configuration, a model).
"""

from __future__ import annotations

__all__ = [
    "DataError",
    "DivergedTrainingError",
    "ExportError",
    "ExportVerificationError",
    "FeatureMismatchError",
    "HarmfulModelError",
    "HoldoutError",
    "NoPairsError",
    "RetrainError",
    "RunDirError",
    "TrainingError",
]


class TrainingError(Exception):
    """Root of every error the training code raises deliberately."""


class DataError(TrainingError):
    """Co-location data is missing, malformed or unusable; the message names the file and place."""


class ExportError(TrainingError):
    """A model could not be converted to a FlatBuffer."""


class ExportVerificationError(ExportError):
    """An exported FlatBuffer disagrees with the Keras model or does not run where it must."""


class DivergedTrainingError(TrainingError):
    """Training produced a model whose predictions are not finite (the loss became NaN or inf)."""


class HarmfulModelError(TrainingError):
    """A model scores worse than the raw readings or a linear fit on its validation sensor."""


class NoPairsError(DataError):
    """The recorded-pairs directory is missing or holds no complete row."""


class FeatureMismatchError(DataError):
    """Recorded pairs, a model and/or training data describe different features or grids."""


class HoldoutError(DataError):
    """Too few pairs to train before, or to score within, the held-back period."""


class RetrainError(TrainingError):
    """A retraining run cannot proceed as configured (champion, key or broker options)."""


class RunDirError(TrainingError):
    """A run directory is missing, or one of its files is missing or does not load."""
