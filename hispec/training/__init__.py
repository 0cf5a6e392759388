"""Training, grouped by what it trains: heads/ trains exit heads by self-distillation (train-exits);
layerskip/ trains the model itself, LayerSkip-style, as LoRA adapters (train-ee)."""
