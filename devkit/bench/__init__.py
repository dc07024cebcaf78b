"""``make bench``: performance of the gateway measured against this machine's own limits.

Every figure is printed next to the yardstick it was measured against in the same run, so the
ratios hold on a noisy machine; absolute times are reported but never asserted in tests.
"""
