"""The window of the last N periods per sensor and model, and its snapshots across restarts."""
