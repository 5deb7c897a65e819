"""A/B benchmarks and probes of the engine: two arms alternated in one process, paired by round."""
