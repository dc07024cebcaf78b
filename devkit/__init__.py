"""The development kit, outside the wheel: harnesses (broker, daemon, pty), the demo, the bench."""
