"""Offline training, evaluation and export of TESLA and its baselines (TensorFlow/Keras).

Imports the shared contract (manifest, time grid, gap policy) from ``gateway``; never the other way.
"""

__all__: list[str] = []
