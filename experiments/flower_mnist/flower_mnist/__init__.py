"""MNIST on Flower under the shuffled check-in protocol (user level: one node = one user)."""
