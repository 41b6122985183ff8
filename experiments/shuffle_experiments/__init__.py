"""The MNIST shuffle-model experiment, built on ``shuffle_opacus`` (never imported by it).

Config, data, models, training loop with checkpoints, epsilon curves, plots, and the scripts
that redraw the published tables and figures; the ``shuffle-experiment`` command drives them.
"""
