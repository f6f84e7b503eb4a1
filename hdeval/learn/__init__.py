"""Statistics that learn from human labels: aggregators and classifiers, intervals, which sample
to label next, and prediction-powered estimates."""
