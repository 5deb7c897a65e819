"""Training runs on a lent GPU, the held-out curves and picks that judge their checkpoints, and the
shipped adapter's lineage over the runs that made it."""
