"""What the benchmarks and the tests share that the product never runs: the loopback world (one process as
rank 0 of a pretend world) and the reference measurements the simulator's constants were fitted to."""
