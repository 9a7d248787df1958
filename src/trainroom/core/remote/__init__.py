"""Keepers on other machines, reached over SSH: the target syntax, the ssh command, the stdio
bridge's wire, and the backoff a dropped link reconnects with. No network listener of its own:
authentication is SSH's (OpenSSH run as a subprocess, never a library)."""
