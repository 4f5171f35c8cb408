"""The benchmark tests share the training tests' synthetic dataset and simulated sweeps."""

from tests.training.conftest import fast_configs, frame, sim_dataset, sim_moe_dataset, table  # noqa: F401
