"""Float reference trainer: Algorithms 1 and 2 of Wang et al. in NumPy."""
