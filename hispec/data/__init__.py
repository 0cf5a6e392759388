"""Data every measuring room shares: the offline prompt sets and their tuning / report split (prompts),
below both training and evaluation."""
