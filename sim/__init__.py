"""Golden models: float reference, bit-exact hardware model, datasets, configuration."""
