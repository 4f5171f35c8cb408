"""A sweep across machines: its shards (``shards``), run as Ray tasks (``ray_tasks``) or written as a Slurm
or Kubernetes job (``emit``), gathered back into one dataset (``gather``); ``commands`` holds ``ficco fleet
run|emit|shard`` and ``ficco dataset gather``."""
