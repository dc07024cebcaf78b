"""Where readings come from: one module per source kind, each feeding one queue."""
