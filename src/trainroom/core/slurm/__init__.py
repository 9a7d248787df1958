"""Slurm: where a run sits in a job (the step's environment), and what slurmctld says of the job
(`scontrol show job -o`, read defensively and at most once per job every few seconds)."""
