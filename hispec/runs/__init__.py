"""One run: a generation's event stream folded into statistics and a trace (runner, metrics, trace),
replayed round by round (replay), or judged by a timing-only pattern (timing_only)."""
