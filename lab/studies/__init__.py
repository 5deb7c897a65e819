"""Studies of the method and the shipped models, read from the committed outputs or the model."""
