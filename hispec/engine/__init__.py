"""The decode loop and its parts: levels, lookup, policy, costs, stage stack, KV cache, sampling, events.
No transformers import and no files: it runs whatever EarlyExitModel it is given."""
