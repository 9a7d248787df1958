"""The demo's faults: one for each row of the scenarios table (docs/scenarios.md), and the figures
the lr-override and diverge stories use. Imported by the CLI without torch."""

FAULTS = (
    "none",
    "silent-death",
    "stall",
    "slow",
    "hang",
    "hang-lock",
    "lr-override",
    "exploded-init",
    "white-model",
    "spike",
    "diverge",
    "nan",
    "rank-outlier",
    "ghost-memory",
    "orphan-context",
    "gpu-throttle",
    "disk-fill",
    "truncated-ckpt",
    "masked-enomem",
    "duplicate",
)

# lr-override (scenario 4): the earlier run began at this LR; the session that resumes from its
# checkpoint asks for --lr (1e-4 in scenario 4).
EARLIER_RUN_LR = 1e-6
SESSION_LR_AFTER_OVERRIDE = 1e-4
# diverge: the LR climbs to this many times --lr and stays there.
DIVERGE_LR_FACTOR = 300.0
