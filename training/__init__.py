"""The schedule predictor: XGBoost on the feature vector, its evaluation, registry and retraining job.

No torch here (the service imports this package). Modules, by concern: ``model`` (the estimators),
``table`` (dataset rows -> one row per scenario), ``fit`` (training configurations), ``crossval`` and
``evaluate`` (held-out metrics), ``baselines``, ``metrics``, ``policy`` (the safe fallback),
``predictor`` and ``registry`` (loading and serving a model), ``train``, ``retrain``, ``report`` and
``commands`` (the CLI).
"""
