"""Variants from the seed survey (BPPO, LamPO); filled in by their own change."""
