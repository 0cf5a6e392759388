"""Exit heads by self-distillation (`python -m hispec train-exits`): teacher data (data, teacher:
batched greedy continuations), training (train), held-out evaluation (evaluation), the settings
estimate (estimate), the pipeline that joins them (pipeline), the prompts (prompts) and the command."""
