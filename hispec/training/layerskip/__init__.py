"""LayerSkip-style early-exit training of the model itself as LoRA adapters (`python -m hispec
train-ee`): data, the forward pass with exits and layer dropout (forward), the loss and loop (train),
evaluation, and the command."""
