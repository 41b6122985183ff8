"""The smallest Flower app under the shuffled check-in protocol, for the test suite."""
