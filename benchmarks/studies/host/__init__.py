"""Studies of the host CPUs' speed and of where a rank's threads run (CPU placement)."""
