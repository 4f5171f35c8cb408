"""What the benchmarks and the tests share that the product never runs: the loopback world (one process as
rank 0 of a pretend world), the reference measurements the simulator's constants were fitted to, timing one
thing alone on a harness backend (``alone``), the end-to-end comparisons of the runtimes benchmark and the
results page (``end_to_end``) and dataset tables joined for the studies (``tables``)."""
