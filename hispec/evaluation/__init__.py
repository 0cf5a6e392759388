"""The side-by-side harness: benchmarks against the baselines (bench, llamacpp), sweeps and profiles,
comparisons and the one timed-pair helper (compare, pairs), measured priors, what every report records
(record, host) and the reports' tables (report, svg_chart, published)."""
