"""Real checkpoints written by real framework code (Hugging Face `Trainer`, Lightning,
`torch.distributed.checkpoint`, safetensors), for the checkpoint-format tests: each module runs
as a trainer under `trainroom launch` and is importable to write one checkpoint in a unit test."""
