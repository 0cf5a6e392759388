"""Heads on intermediate layers (modules, manifests, discovery) and LoRA adapters of early-exit-trained
models."""
