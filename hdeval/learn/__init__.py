"""Statistics that learn from human labels: which sample to label, intervals, estimates."""
