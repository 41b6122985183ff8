"""Experiment runners: config, training loop, metrics, checkpoints and plots."""
