"""Theme files (TOML), loaded by the control room at start."""
