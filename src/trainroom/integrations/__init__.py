"""One-line adapters for the trainers most runs use, each an optional dependency:

    from trainroom.integrations.hf import TrainroomCallback          # pip install 'trainroom[hf]'
    trainer = Trainer(..., callbacks=[TrainroomCallback()])

    from trainroom.integrations.lightning import TrainroomCallback   # pip install 'trainroom[lightning]'
    trainer = L.Trainer(..., callbacks=[TrainroomCallback()])

Each reports through the trainer SDK (core/sdk/reporter: one reporter per process, so one per
rank under DDP) and is a no-op outside a keeper. Nothing in trainroom imports this package.
"""
