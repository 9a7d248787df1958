"""The configuration: trainroom.toml (its sections and checks), the run's launch settings and the CLI's argument types."""
