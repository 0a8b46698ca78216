"""Output: terminal tables (rich), and exporters of results to JSON, CSV and Markdown."""
