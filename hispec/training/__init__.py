"""Training: exit heads by self-distillation (train-exits) and LayerSkip-style LoRA training (train-ee)."""
