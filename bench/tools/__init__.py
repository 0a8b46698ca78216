"""Tools beside the measurement: check, record, replay, probe, the embedded engine, and the delay proxy."""
