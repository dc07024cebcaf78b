"""Champion/challenger retraining from pairs: a thin command over train, export, evaluate."""
