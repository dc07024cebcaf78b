"""Calibrated readings, health/drift documents and stats out over MQTT, with store-and-forward."""
