"""The answering path: a trained model loaded from the registry and asked for schedules, with numpy alone.

What ``service`` and ``runtime`` import from ``training``: ``pairs``, ``booster``, ``fastpath``, ``policy``,
``coverage``, ``predictor`` and ``registry``. Fitting a model (``training.model``) stays one room up.
"""
