"""Tests of ``python -m training bench`` (training.bench)."""
