"""A release's golden windows for a model that reads the hour of the day hold hours: an attack
found them filled with made-up covariates (uniform 0-100, as for rh and temperature), on which
the gateway's plausibility check judged a release by inputs no model meets."""

from __future__ import annotations

import numpy as np

from tesla_gateway.contract.time_of_day import HOUR_CHANNELS
from tesla_gateway.ota.golden import parse_golden
from tests.support.models import ModelFactory
from training.release import golden_windows


def test_golden_windows_hold_an_hour_or_none(model_factory: ModelFactory) -> None:
    model = model_factory.get(extra_channels=("hour_sin", "hour_cos"))
    golden = parse_golden(golden_windows(model.path))
    windows = np.asarray(golden.windows, dtype=np.float64)  # [B, N, C]
    names = model.manifest.channel_names
    s = windows[:, :, names.index(HOUR_CHANNELS[0])]
    c = windows[:, :, names.index(HOUR_CHANNELS[1])]
    radius = np.hypot(s, c)
    on_circle = np.isclose(radius, 1.0, atol=1e-3)
    unknown = (s == 0) & (c == 0)
    assert (on_circle | unknown).all()  # it was up to ~130: sin and cos drawn from [0, 100]
