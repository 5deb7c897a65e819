"""Training the skip policy and its data: distillation data (make_data), prompt sets and
collation (data), teacher-forced scoring, losses, the run itself, checkpoints, the held-out curve."""
