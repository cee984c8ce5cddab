"""Driver side: builds Ray Train trainers and datasets from a config."""
