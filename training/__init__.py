"""The schedule predictor: one XGBoost model over (scenario, schedule, mode) pairs, its evaluation against
baselines and the noise ceiling, the fast inference path, the registry and the retraining job.

No torch here (the service imports this package). ``predict/`` is the numpy-only answering path; the rest
holds one concern per module (``model``, ``fit``, ``crossval``, ``evaluate``, ``export``, ``commands``, ...).
See docs/training.md.
"""
