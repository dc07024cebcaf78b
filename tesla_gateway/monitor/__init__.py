"""Per-sensor health, reference pairs (and their file format), rolling error and drift."""
