"""Task files, samples and the data sets: what is judged and what humans said, read with bounds."""
