"""ficco: a learned schedule predictor for compute/communication overlap, with a copy-engine executor."""

__version__ = "0.1.0"
