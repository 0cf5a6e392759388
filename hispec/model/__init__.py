"""A transformers model seen as layer ranges and exits: EarlyExitModel, the one decoder-layer kernel, the
lean path and CUDA graphs over it, and loading models by name."""
