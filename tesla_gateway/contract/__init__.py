"""What training/ imports: readings, gap rule, window geometry, manifest, calibrated values."""
