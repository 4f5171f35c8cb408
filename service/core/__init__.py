"""Service infrastructure: settings, the model store, request limits and metrics."""
