"""Tools around the measurement: helpers that stand beside a server (the delay proxy, ...)."""
