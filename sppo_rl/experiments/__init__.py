"""Experiments over many runs: ``sppo-rl sweep`` (algorithms x tasks x seeds of control runs) and
``sppo-rl report`` (curves with seed intervals, tables, calibration of SPPO's V(s_0))."""
