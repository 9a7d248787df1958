"""trainroom: a terminal control room for a PyTorch training run that outlives its shell."""

__version__ = "0.1.0"
