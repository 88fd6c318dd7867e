"""``trainfit train``: the run loop, checkpoints and many ranks."""
