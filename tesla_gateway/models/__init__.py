"""The model behind a feature: runtime, calibrator, slots, watch, per-sensor choice, trust."""
