"""The schedule predictor: one XGBoost model over (scenario, schedule, mode) pairs, its evaluation against
baselines and the noise ceiling, the fast inference path, the registry and the retraining job.

No torch here (the service imports this package). Modules, by concern: ``model`` (the pair estimator on
the scikit-learn API), ``table`` (dataset rows -> one row per scenario and mode), ``fit`` (training
configurations and pairs), ``crossval`` and ``evaluate`` (held-out metrics), ``baselines``, ``metrics``,
``policy`` (the pick and the safe fallback), ``fastpath`` (numpy evaluation of the forests),
``predictor`` and ``registry`` (loading and serving a model), ``train``, ``retrain``, ``report`` and
``commands`` (the CLI).
"""
