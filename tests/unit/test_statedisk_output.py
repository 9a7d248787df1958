"""STATE_DISK_LOW and the trainer's lost output: critical while the output pump drops bytes,
whatever the thresholds say; the count stays in the words once writing works again."""

from __future__ import annotations

from trainroom.core.health.diskguard import DiskUsage
from trainroom.core.health.statedisk import OutputLoss, StateDisk, state_disk_low
from trainroom.core.journal.writer import JournalUsage

JOURNAL = JournalUsage(path="/s/runs/r", bytes=1 << 20, segments=0, lean_segments=0, bytes_per_h=None)


def _disk(free: int, covered: bool = False, output: OutputLoss | None = None) -> StateDisk:
    usage = DiskUsage(path="/s", total_bytes=100 << 20, used_bytes=(100 << 20) - free, free_bytes=free)
    return StateDisk(usage=usage, journal=JOURNAL, covered=covered, output=output or OutputLoss())


def test_output_being_lost_is_critical_and_counted_even_where_disk_high_speaks() -> None:
    losing = OutputLoss(lost_bytes=12345, since=1_000_000.0, losing=True, path="/s/runs/r/trainer.log")
    f = state_disk_low(_disk(0, covered=True, output=losing), 0.9, 0.95)
    assert f is not None and f.severity == "critical"
    assert f.message.startswith("the trainer's output is being lost: 12345 bytes not written to trainer.log")
    assert f.evidence["output_lost_bytes"] == 12345 and f.evidence["output_losing"] is True
    assert state_disk_low(_disk(0, covered=True), 0.9, 0.95) is None  # DISK_HIGH's to say


def test_once_writing_works_again_the_count_stays_while_the_disk_is_low() -> None:
    resumed = OutputLoss(lost_bytes=500, since=1_000_000.0, resumed=1_000_060.0, path="/s/trainer.log")
    f = state_disk_low(_disk(1 << 20, output=resumed), 0.9, 0.95)
    assert f is not None and f.message.startswith("500 bytes of the trainer's output were lost")
    assert f.evidence["output_losing"] is False
    assert state_disk_low(_disk(50 << 20, output=resumed), 0.9, 0.95) is None
