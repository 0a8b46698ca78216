"""What bench learns from the serving side besides the responses: its GPUs (gpu)."""
