"""What the server says of itself: info, /metrics, /tokenize, and its GPUs (NVML, a DCGM exporter: gpu)."""
