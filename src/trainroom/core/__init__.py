"""Everything without a screen: protocol, reporter (trainer SDK), keeper, probes, watchdog,
checkpoints, disk guard, actions, config. Never imports textual, rich or trainroom.tui, and never
imports torch at module level (the keeper and `trainroom status` start without it)."""
