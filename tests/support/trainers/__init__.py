"""Tiny real trainers built on the frameworks trainroom recognises (run as scripts by the e2e tests)."""
