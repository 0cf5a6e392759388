"""A transformers model seen as layer ranges and exits, and everything the model owns: EarlyExitModel,
its KV cache, the one decoder-layer kernel, the lean path and CUDA graphs over it, trained exit heads,
LoRA adapters of early-exit-trained models, and loading models by name (fits: whether one fits)."""
