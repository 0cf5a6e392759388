"""Measuring: one generation folded into stats and a trace, side-by-side benchmarks, sweeps, profiles,
prompt sets, timing-only judges and reports."""
