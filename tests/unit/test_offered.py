"""A key is offered only when its action will act: a dead run whose old processes still hold the
lock or the GPU memory offers the kill those findings name, not a resume the keeper would refuse;
verify is offered only when there is a verified checkpoint for it to read; and the checkpoints a
model that exploded at its start saves fold under EXPLODED_START."""

from __future__ import annotations

from typing import Any

from tests.support.tui_fakes import T0, build_state, dead_run_records, healthy_records
from trainroom.core.actions.registry import REGISTRY
from trainroom.core.findings import Finding
from trainroom.core.run.causes import fold
from trainroom.core.wire import protocol as p


def _raised(code: str, t: float, **kw: Any) -> p.FindingRaised:
    return p.FindingRaised(
        finding=Finding(code=code, severity="warning", message=code.lower(), first_seen=t, last_seen=t, **kw)  # type: ignore[arg-type]
    )


def _verified(step: int) -> p.CheckpointState:
    return p.CheckpointState(path=f"/ck/step-{step:06d}.pt", step=step, state="verified", t=T0 + step)


def test_a_dead_run_whose_old_processes_hold_on_offers_no_resume() -> None:
    resume = REGISTRY["resume"]
    base = [*dead_run_records(), _verified(100)]
    assert resume.not_offered(build_state(base), resume.Args()) is None
    for code in ("ORPHAN_CONTEXT", "STALE_LOCK"):
        st = build_state([*base, _raised(code, T0 + 300, key=f"{code}/1")])
        why = resume.not_offered(st, resume.Args())
        assert why == f"the old attempt's processes still hold on ({code}): kill them first"


def test_verify_is_offered_only_with_a_verified_checkpoint_to_read() -> None:
    verify = REGISTRY["verify"]
    rejected = p.CheckpointState(path="/ck/.quarantine/step-000010.pt", step=10, state="rejected", t=T0 + 10)
    candidate = p.CheckpointState(
        path="/ck/.quarantine/step-000020.pt", step=20, state="candidate", t=T0 + 20
    )
    st = build_state([*healthy_records(steps=30), rejected, candidate])
    assert (
        verify.not_offered(st, verify.Args())
        == "no verified checkpoint to verify yet (`latest` points nowhere)"
    )
    assert verify.not_offered(build_state([*healthy_records(steps=30), _verified(30)]), verify.Args()) is None


def test_the_checkpoints_of_a_model_that_exploded_at_its_start_fold_under_it() -> None:
    recs = [
        _raised("EXPLODED_START", T0 + 1, evidence={"step": 1}),
        *(
            _raised("CKPT_REJECTED", T0 + 10 + i, key=f"/ck/{i}.pt", evidence={"outliers": [{"name": "w"}]})
            for i in range(5)
        ),
    ]
    rows = fold(list(build_state([*dead_run_records(), *recs]).findings.values()))
    root = next(r for r in rows if r.cause.code == "EXPLODED_START")
    assert [(k.code, k.count) for k in root.consequences] == [("CKPT_REJECTED", 5)]
    assert not any(r.cause.code == "CKPT_REJECTED" for r in rows)


def test_resume_is_refused_onto_a_lost_gpu_or_one_with_a_pending_remap_naming_the_healthy_one() -> None:
    from trainroom.core.samples import GpuDevice, GpuSample

    resume = REGISTRY["resume"]
    gpu = GpuSample(
        t=T0 + 299,
        available=True,
        devices=[
            GpuDevice(index=0, pci_bus_id="0000:3b:00.0"),
            GpuDevice(index=1, pci_bus_id="0000:5e:00.0"),
        ],
    )
    base = [*dead_run_records(), _verified(100), p.ProbeSample(t=T0 + 299, gpu=gpu)]
    assert resume.precondition(build_state(base), resume.Args()) is None
    lost = _raised("GPU_LOST", T0 + 300, key="0000:3b:00.0", evidence={"device": 0, "bus_id": "0000:3b:00.0"})
    why = resume.precondition(build_state([*base, lost]), resume.Args())
    assert why == (
        "GPU 0 (0000:3b:00.0) is lost (GPU_LOST): a resume here would start on it; "
        "healthy: GPU 1 (0000:5e:00.0) (resume there: CUDA_VISIBLE_DEVICES, or another node)"
    )
    ecc = {"device": 1, "bus_id": "0000:5e:00.0", "remap_pending": True}
    why = resume.precondition(
        build_state([*base, lost, _raised("GPU_ECC", T0 + 301, key="1", evidence=ecc)]), resume.Args()
    )
    assert why is not None and why.endswith("no healthy GPU on this host: resume on another node")
    assert "GPU 1 (0000:5e:00.0) has a page retirement or row remap waiting for a reset (GPU_ECC)" in why
    # Counted ECC errors with nothing pending do not block a resume (a reset already applied them).
    done = _raised("GPU_ECC", T0 + 301, key="1", evidence={"device": 1, "ecc_volatile_dbe": 2})
    assert resume.precondition(build_state([*base, done]), resume.Args()) is None
