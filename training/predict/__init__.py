"""The answering path: a trained model loaded from the registry and asked for schedules, with numpy alone.

What ``service`` and ``runtime`` import from ``training``. Modules, by concern: ``pairs`` (the pair matrix
of (scenario, schedule, mode) rows and the feature schema), ``booster`` (XGBoost's saved forests read and
walked with numpy), ``fastpath`` (the forests pruned for one scenario), ``policy`` (the pick and the safe
fallback), ``coverage`` (the measured neighbours of an answer), ``predictor`` (the model asked) and
``registry`` (models stored, promoted and loaded). Fitting a model (``training.model``, scikit-learn and
XGBoost) stays one room up.
"""
