"""The journal's storage engine: the append-only record file (`file`), step batches, segments,
snapshots, replay and the keeper's writer. It stores and replays bytes; what the records fold
into is the read model's (`run`), handed to it as a `fold.Fold`."""
