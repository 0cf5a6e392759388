"""The decode loop and its parts: levels, lookup, policy, costs, stage stack, sampling, events.
No transformers import, no files, and nothing from hispec.model at run time: it runs whatever
EarlyExitModel it is given (named only in annotations) and asks that model for its KV caches."""
