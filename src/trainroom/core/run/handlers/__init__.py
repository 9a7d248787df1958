"""The fold's handlers, by subject: how each journal record changes the run's state
(`run.state.RunState.apply` looks a record's type up in its table and calls the handler here).

Each module's `Run` protocol says what its handlers read and write of the state, and nothing more:
`attempts` (an attempt's start, stop and end), `ranks` (what each rank's reporter says, its steps,
its processes), `checkpoints` (a checkpoint's states), `findings` (findings raised and cleared, the
actions and alerts about them, the batches around them), `keeper` (the keeper's own records: its
start, notes, the status it judges, its host/GPU probe, the journal's damage, the log recogniser).
"""
