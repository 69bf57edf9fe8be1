"""The control world: networks, episode collection, the trainer, warm starts."""
