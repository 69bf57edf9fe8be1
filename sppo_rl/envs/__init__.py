"""The control testbed (filled in by the testbed module)."""
