"""The schedule predictor: one XGBoost model over (scenario, schedule, mode) pairs, its evaluation against
baselines and the noise ceiling, the fast inference path, the registry and the retraining job.

No torch here (the service imports this package). ``predict/`` is the numpy-only answering path (the
pair matrix, the forests walked with numpy, the policy, coverage, the predictor and the registry). The
rest, by concern: ``model`` (the pair estimator on the scikit-learn API), ``dataset_table`` (dataset rows
-> one row per scenario and mode), ``fit`` (training configurations and pairs), ``crossval`` and
``evaluate`` (held-out metrics), ``baselines``, ``metrics``, ``train``, ``retrain``, ``report``,
``export`` (schedule tables) and ``commands`` (the CLI).
"""
