"""The training process's parts: job options, the trainer callbacks, and one module per method."""
