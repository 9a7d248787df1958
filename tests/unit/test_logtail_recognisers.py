"""The built-in log recognisers (core/logs/logformats) on what real trainers wrote (captured in
tests/support/trainers/captured/, see its README), checked against each framework's own record:
HF's trainer_state.json log history, Lightning's CSVLogger metrics."""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from trainroom.core.keeper.logtail import LogTail
from trainroom.core.logs.logformats import (
    HfTrainerLog,
    LightningBar,
    LogHints,
    LogStep,
    PatternLog,
    PlainLoop,
    Recogniser,
    Recognition,
    recognition,
)
from trainroom.core.logs.loglines import step_words, unread_words
from trainroom.core.run.state import RunState
from trainroom.core.wire import protocol as p

CAPTURED = Path(__file__).resolve().parents[1] / "support" / "trainers" / "captured"


def read_all(
    path: Path, pattern: str | None = None, chunk: int | None = None
) -> tuple[LogTail, list[LogStep]]:
    """The whole file through the keeper's reader, in chunks as a live trainer would append it."""
    data = path.read_bytes()
    live = path.parent / "live.log"
    tail = LogTail(live, pattern)  # created before the file: reads from its start
    steps: list[LogStep] = []
    step = chunk or len(data)
    with open(live, "wb") as f:
        for i in range(0, len(data), step):
            f.write(data[i : i + step])
            f.flush()
            steps += tail.read()
    steps += tail.read(final=True)
    return tail, steps


@pytest.fixture
def captured(tmp_path: Path) -> Path:
    for f in CAPTURED.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    return tmp_path


@pytest.mark.parametrize("chunk", [None, 7, 160])
def test_hf_trainer_steps_and_losses_match_its_log_history(captured: Path, chunk: int | None) -> None:
    tail, steps = read_all(captured / "hf_trainer.log", chunk=chunk)
    state = json.loads((captured / "hf_trainer_state.json").read_text())
    history = [
        (h["step"], h["loss"], h["grad_norm"], h["learning_rate"])
        for h in state["log_history"]
        if "loss" in h
    ]
    logged = [(s.step, s.loss, s.grad_norm, s.lr) for s in steps if s.loss is not None]
    assert tail.recogniser == "hf"
    # Each logged dict at the exact step the Trainer recorded (the bar drawn before a dict can be
    # several steps behind: 45/60 is on screen when step 50's dict is written).
    assert [x[0] for x in logged] == [h[0] for h in history]
    for (_, loss, gn, lr), (_, h_loss, h_gn, h_lr) in zip(logged, history, strict=True):
        assert loss == pytest.approx(h_loss, rel=1e-3)  # transformers 5 prints 4 significant digits
        assert gn == pytest.approx(h_gn, rel=1e-3)
        assert lr == pytest.approx(h_lr, rel=1e-3)
    assert steps[-1].step == state["global_step"]
    assert [s.step for s in steps] == sorted(s.step for s in steps)


@pytest.mark.parametrize("name", ["lightning_tqdm.log", "lightning_rich_tty.log"])
def test_lightning_bars_give_the_global_step_and_the_logged_loss(captured: Path, name: str) -> None:
    tail, steps = read_all(captured / name, chunk=97)
    with open(captured / "lightning_metrics.csv") as f:
        # CSVLogger's row `step` s is the loss of batch s (0-based): after it, global_step is s + 1.
        metrics = {int(r["step"]) + 1: float(r["train_loss"]) for r in csv.DictReader(f)}
    assert tail.recogniser == "lightning"
    got = [s.step for s in steps]
    assert got == sorted(set(got)), "each step once, in order, across the epoch boundaries"
    assert got[-1] == max(metrics) == 100
    if name == "lightning_tqdm.log":
        assert got == list(range(1, 101))  # TQDM draws every batch
    if name == "lightning_tqdm.log":
        for s in steps:  # the bar's postfix shows 3 significant digits (4.160 for 4.1635)
            assert s.loss == pytest.approx(metrics[s.step], abs=5.1e-3), s
    else:
        # Rich redraws from its own thread: a frame may show the count before the batch's metric.
        for s in steps:
            near = [metrics[k] for k in (s.step, s.step - 1) if k in metrics]
            assert any(s.loss == pytest.approx(m, abs=6e-4) for m in near), s


def test_without_a_bar_hf_dicts_are_counted(tmp_path: Path) -> None:
    log = tmp_path / "t.log"
    log.write_text(
        "".join(f"{{'loss': {3 - i / 10}, 'learning_rate': 5e-05, 'epoch': {i / 4}}}\n" for i in range(3))
    )
    tail, steps = read_all(log)
    assert tail.recogniser == "hf"
    assert [(s.step, s.loss) for s in steps] == [(1, 3.0), (2, 2.9), (3, 2.8)]


def test_hf_eval_and_summary_dicts_are_not_steps_and_an_eval_bar_is_not_the_training_bar() -> None:
    r = HfTrainerLog()
    out = r.feed(" 10%|█         | 10/100 [00:01<00:09, 9.9it/s]")
    out += r.feed("{'loss': '2.5', 'grad_norm': '1.0', 'learning_rate': '1e-4', 'epoch': '0.1'}")
    out += r.feed(" 10%|█         | 10/100 [00:01<00:09, 9.9it/s]")
    out += r.feed(" 50%|█████     | 4/8 [00:00<00:00, 99it/s]")  # the eval bar: another total
    out += r.feed("{'eval_loss': 2.4, 'eval_runtime': 0.1, 'epoch': 0.1}")
    out += r.feed("{'train_runtime': 1.0, 'train_loss': 2.5, 'epoch': 1.0}")
    # The bar moves the step (no loss yet); the dict gives step 10 its loss; nothing else is a step.
    assert [(s.step, s.loss) for s in out] == [(10, None), (10, 2.5)]


def test_the_bar_after_a_dict_is_read_before_its_line_ends() -> None:
    """tqdm.write redraws the bar right after the dict, with no line end until the next redraw:
    a trainer killed then still has its step read (peek), and only once."""
    r = Recognition([HfTrainerLog()])
    r.feed(" 19%|█▉        | 19/100 [00:01<00:09, 9.9it/s]")
    assert r.feed("{'loss': 2.5, 'learning_rate': 0.0001, 'epoch': 0.2}") == []
    assert [s.step for s in r.peek(" 20%|██        | 20/100 [00:02<")] == [20]
    assert r.feed(" 20%|██        | 20/100 [00:02<00:08, 9.9it/s]") == []
    assert r.end() == []


def test_a_dict_with_no_bar_after_it_is_given_out_at_the_end_at_the_last_bar() -> None:
    r = HfTrainerLog()
    r.feed(" 37%|███▋      | 37/100 [00:03<00:06, 9.9it/s]")
    r.feed("{'loss': 2.5}")
    assert [(s.step, s.loss) for s in r.end()] == [(37, 2.5)]


def test_nanogpt_lines_are_recognised_after_the_others_decline(tmp_path: Path) -> None:
    log = tmp_path / "t.log"
    log.write_text(
        "number of parameters: 0.01M\niter 0: loss 4.1712, time 120.00ms, mfu -100.00%\n"
        "iter 1: loss 4.0221, time 30.00ms, mfu 1.00%\n"
    )
    tail, steps = read_all(log)
    assert tail.recogniser == "nanogpt"
    assert [(s.step, s.loss) for s in steps] == [(0, 4.1712), (1, 4.0221)]


def test_a_pattern_without_a_step_group_counts_steps_and_replaces_the_builtins(tmp_path: Path) -> None:
    log = tmp_path / "t.log"
    log.write_text("iter 5: loss 9.0\ntrain loss 2.5 lr 0.1\nnoise\ntrain loss 2.25 lr 0.1\n")
    tail, steps = read_all(log, pattern=r"train loss (?P<loss>\S+) lr (?P<lr>\S+)")
    assert tail.recogniser == "pattern"
    assert [(s.step, s.loss, s.lr) for s in steps] == [(1, 2.5, 0.1), (2, 2.25, 0.1)]


def test_a_pattern_with_a_step_group_reads_it() -> None:
    r = PatternLog(r"step=(?P<step>\d+) loss=(?P<loss>\S+) gn=(?P<grad_norm>\S+)")
    assert r.feed("step=7 loss=nan gn=1.5")[0].step == 7
    assert r.feed("step=x loss=1") == []


def test_once_one_recogniser_read_a_step_it_is_kept() -> None:
    r = recognition(None)
    assert [s.step for s in r.feed("iter 3: loss 2.0")] == [3]
    assert r.name == "nanogpt"
    assert r.feed("{'loss': 2.0}") == []  # an HF dict later is not read: nanogpt was kept
    assert r.feed("Epoch 0:  50%|█████     | 5/10 [00:00<00:00, 9.9it/s, loss=2.1]") == []


class Explodes(Recogniser):
    name = "explodes"

    def feed(self, line: str) -> list[LogStep]:
        if "boom" in line:
            raise ValueError("boom")
        return [LogStep(int(line.split()[1]))] if line.startswith("step ") else []


def test_a_recogniser_that_raises_costs_that_line_only(tmp_path: Path) -> None:
    log = tmp_path / "t.log"
    log.write_text("step 1\nboom\nstep 2\nboom\nstep 3\n")
    tail = LogTail(log, None)
    tail.offset = 0
    tail.recognition = Recognition([Explodes()])
    assert [s.step for s in tail.read()] == [1, 2, 3]
    assert tail.recognition.errors == 2
    recs = tail.records(1, 0.0, [LogStep(3)])
    notes = [r for r in recs if type(r).__name__ == "KeeperNote"]
    assert len(notes) == 1 and "ValueError: boom" in notes[0].message  # type: ignore[attr-defined]


def test_lightning_rich_metrics_wrapped_onto_the_next_line_are_read() -> None:
    r = LightningBar()
    r.feed("Epoch 0/-2 ━━━━━━━━━━━━━━━━━ 3/40 0:00:00 • 0:00:01 47.91it/s v_num: 0.000")
    r.feed("                                          train_loss: 4.194")
    out = r.feed("Epoch 0/-2 ━━━━━━━━━━━━━━━━━ 4/40 0:00:00 • 0:00:02 27.58it/s v_num: 0.000")
    assert [(s.step, s.loss) for s in out] == [(3, 4.194)]


def test_lightning_validation_and_sanity_bars_are_not_training_steps() -> None:
    r = LightningBar()
    assert r.feed("Sanity Checking DataLoader 0: 100%|██████████| 2/2 [00:00<00:00, 99it/s]") == []
    assert r.feed("Validation DataLoader 0:  50%|█████     | 5/10 [00:00<00:00, 99it/s]") == []
    assert r.pending is None


# --------------------------------------------------------------------------- plain loops


def tqdm_run(path: Path, steps: int, **bar: Any) -> dict[int, float]:
    """A real tqdm loop writing its bar to `path` as it would to a trainer's stderr; the losses
    it set in the postfix, by step (the bar's count once the step is done)."""
    tqdm = pytest.importorskip("tqdm").tqdm
    losses: dict[int, float] = {}
    with open(path, "w") as f:
        epochs = bar.pop("epochs", 1)
        per = steps // epochs
        for epoch in range(epochs):
            desc = bar.get("desc")
            kw = {**bar, "desc": desc.format(epoch) if desc else None}
            pbar = tqdm(range(per), file=f, **kw)
            for i in pbar:
                n = epoch * per + i + 1
                losses[n] = round(3.0 / n, 4)
                pbar.set_postfix(loss=f"{losses[n]:.4f}", lr=3e-4)
    return losses


@pytest.mark.parametrize(
    "bar",
    [{}, {"desc": "train"}, {"mininterval": 0, "miniters": 1}, {"desc": "epoch {}", "epochs": 3}],
    ids=["bare", "desc", "every-draw", "per-epoch"],
)
def test_a_tqdm_loop_gives_its_steps_with_the_postfix_loss(tmp_path: Path, bar: dict[str, Any]) -> None:
    losses = tqdm_run(tmp_path / "t.log", 60, **bar)
    tail, steps = read_all(tmp_path / "t.log", chunk=53)
    assert tail.recogniser == "tqdm" and tail.recognition.unit == "bar count"
    got = [s.step for s in steps]
    assert got == sorted(set(got)) and got[-1] == 60
    for s in steps:  # each loss is the one the loop set for the step the bar counted
        assert s.loss == losses[s.step] and s.lr == 3e-4, s
    if bar.get("miniters") == 1:
        assert got == list(range(1, 61))


def test_a_bare_bar_is_the_loops_own_once_its_printed_loss_lines_come(tmp_path: Path) -> None:
    """A bare bar with no postfix looks like HF's; the loop's `tqdm.write` lines show it is not."""
    tqdm = pytest.importorskip("tqdm").tqdm
    with open(tmp_path / "t.log", "w") as f:
        for n in tqdm(range(1, 41), file=f, mininterval=0, miniters=1):
            if n % 10 == 0:
                tqdm.write(f"step {n} loss {1 / n:.4f}", file=f)
    tail, steps = read_all(tmp_path / "t.log", chunk=31)
    assert tail.recogniser == "lines" and tail.recognition.unit == "printed steps"
    assert [(s.step, s.loss) for s in steps if s.loss is not None] == [
        (n, round(1 / n, 4)) for n in (10, 20, 30, 40)
    ]


def logging_run(path: Path, fmt: str, message: str, steps: int = 30) -> None:
    """Real `logging` records written as a loop's logger would, in the format given."""
    logger = logging.getLogger(f"train-{path.stem}")
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter(fmt))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        logger.info("starting: 8 params, batch size 16")
        for n in range(1, steps + 1):
            logger.info(message, n, 2.0 / n, 3e-4)
    finally:
        logger.removeHandler(handler)
        handler.close()


@pytest.mark.parametrize(
    ("fmt", "message"),
    [
        (logging.BASIC_FORMAT, "step %d loss %.4f lr %g"),  # INFO:root:step 10 loss 0.2000 lr 0.0003
        ("%(asctime)s %(levelname)s %(name)s: %(message)s", "step=%d, loss=%.4f, lr=%.2e"),
        ("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s", "Step: %d | Loss: %.4f | LR: %.1e"),
        ("[rank0]:%(levelname)s:%(name)s:%(message)s", "iteration %d: loss %.4f, lr %g, time 12.00ms"),
    ],
    ids=["basic", "asctime", "hydra", "rank-prefix"],
)
def test_logging_lines_give_step_loss_and_lr(tmp_path: Path, fmt: str, message: str) -> None:
    logging_run(tmp_path / "t.log", fmt, message)
    tail, steps = read_all(tmp_path / "t.log", chunk=41)
    assert tail.recogniser == "lines" and tail.recognition.unit == "printed steps"
    assert [s.step for s in steps] == list(range(1, 31))
    for s in steps:
        assert s.loss == pytest.approx(2.0 / s.step, abs=1e-4) and s.lr == pytest.approx(3e-4, rel=0.05)


@pytest.mark.parametrize(
    ("line", "step", "loss"),
    [
        ("Step 10/100 | Loss: 2.3100 | LR: 3.00e-04", 10, 2.31),
        ("step: 10, loss: 2.31, grad_norm: 0.5", 10, 2.31),
        ("[step 10] train_loss=2.31 lr=3e-4", 10, 2.31),
        ("epoch 0 | iteration 10 | train loss 2.31", 10, 2.31),
        ("global_step=10 train/loss=2.31", 10, 2.31),
        ("step 10 loss tensor(2.3100, grad_fn=<MseLossBackward0>)", 10, 2.31),
    ],
)
def test_printed_pair_shapes(line: str, step: int, loss: float) -> None:
    r = recognition(None)
    assert [(s.step, s.loss) for s in r.feed(line)] == [(step, loss)]
    assert r.name == "lines"


def test_nanogpts_own_lines_stay_nanogpts_and_its_eval_lines_are_not_steps() -> None:
    r = recognition(None)
    assert r.feed("step 0: train loss 4.2000, val loss 4.2100") == []
    assert [s.step for s in r.feed("iter 0: loss 4.1712, time 120.00ms, mfu -100.00%")] == [0]
    assert r.name == "nanogpt" and r.unit == "optimizer steps"


def test_evaluation_lines_and_other_bars_are_not_steps() -> None:
    r = PlainLoop()
    assert r.feed("epoch 1 step 100 val_loss=2.3") == []
    assert r.feed("step 100: eval loss 2.5") == []
    assert r.feed("Map: 100%|██████████| 1000/1000 [00:00<00:00, 9999 examples/s]") == []
    assert r.feed("Loading checkpoint shards: 50%|█████     | 1/2 [00:01<00:01, 1.0s/it]") == []
    assert r.feed("eval: 50%|█████     | 5/10 [00:00<00:00, 99it/s, loss=2.0]") == []
    assert r.feed("Learning rate: 0.001") == []  # an LR with no step is a setting, not a step
    # Lightning's Rich bar with its metrics on the same line (a wide terminal) is Lightning's.
    assert (
        r.feed("Epoch 0/-2 ━━━━━━━━━━ 3/40 0:00:00 • 0:00:01 47.91it/s v_num: 0.000 train_loss: 4.194") == []
    )


def test_loss_lines_without_a_step_are_counted_in_log_lines() -> None:
    r = recognition(None)
    assert [(s.step, s.loss) for s in r.feed("loss=2.5")] == [(1, 2.5)]
    assert [(s.step, s.loss) for s in r.feed("loss=2.25")] == [(2, 2.25)]
    assert r.name == "lines" and r.unit == "log lines"


def test_a_kept_recogniser_that_read_a_loss_is_not_taken_over() -> None:
    r = recognition(None)
    r.feed(" 10%|█         | 10/100 [00:01<00:09, 9.9it/s]")
    r.feed("{'loss': 2.5, 'learning_rate': 0.0001, 'epoch': 0.1}")
    assert [(s.step, s.loss) for s in r.feed(" 11%|█         | 11/100 [00:01<00:09, 9.9it/s]")] == [(11, 2.5)]
    assert r.feed("step 5 loss 9.0") == [] and r.name == "hf"


def test_nothing_recognised_in_200_lines_is_said_once_then_cleared_by_a_step(tmp_path: Path) -> None:
    log = tmp_path / "t.log"
    tail = LogTail(log, None)
    log.write_text("".join(f"batch {i} processed in 0.01 s, queue depth {i % 7}\n" for i in range(199)))
    assert tail.records(1, 0.0, tail.read()) == []
    with open(log, "a") as f:
        f.write("batch 199 processed\nbatch 200 processed\n")
    recs = tail.records(1, 1.0, tail.read())
    assert recs == [p.LogRecognised(t=1.0, attempt=1, name="none", lines=201)]
    assert tail.records(1, 2.0, tail.read()) == []  # said once
    st = RunState(run_id="r", argv=["python"], cwd="/", created=0.0)
    st.apply(recs[0])
    assert st.log_unread_lines == 201 and st.log_recogniser is None
    assert unread_words(201) == "log read but no step or loss recognised in 201 lines: pass --log-pattern"
    with open(log, "a") as f:
        f.write("step 1 loss 2.5\n")
    steps = tail.read()
    recs = tail.records(1, 3.0, steps)
    assert recs[0] == p.LogRecognised(t=3.0, attempt=1, name="lines", unit="printed steps")
    st.apply(recs[0])
    assert st.log_unread_lines is None and (st.log_recogniser, st.log_unit) == ("lines", "printed steps")


# --------------------------------------------------------------------------- step units


def test_hf_dicts_without_a_bar_are_optimizer_steps_when_logging_steps_is_known() -> None:
    lines = [f"{{'loss': {3 - i / 10}, 'learning_rate': 5e-05, 'epoch': {i / 4}}}" for i in range(3)]
    known = Recognition([HfTrainerLog(LogHints(logging_steps=10))])
    assert [s.step for line in lines for s in known.feed(line)] == [10, 20, 30]
    assert known.unit == "optimizer steps"
    unknown = Recognition([HfTrainerLog()])
    assert [s.step for line in lines for s in unknown.feed(line)] == [1, 2, 3]
    assert unknown.unit == "logged dicts"
    own = Recognition([HfTrainerLog()])
    assert [s.step for s in own.feed("{'loss': 2.5, 'step': 740, 'epoch': 1.2}")] == [740]
    assert own.unit == "optimizer steps"


def lightning_bars(epochs: int, batches: int) -> list[str]:
    bar = "Epoch {e}: {pct}%|███| {n}/{batches} [00:00<00:00, 9.9it/s, v_num=0, train_loss={n}.0]"
    return [
        bar.format(e=e, pct=n * 100 // batches, n=n, batches=batches)
        for e in range(epochs)
        for n in range(batches + 1)
    ]


def test_lightning_batches_become_optimizer_steps_with_accumulate_grad_batches_known() -> None:
    r = Recognition([LightningBar(LogHints(accumulate=4))])
    steps = [s for line in lightning_bars(2, 10) for s in r.feed(line)] + r.end()
    # 10 batches an epoch, 4 a step: steps after batches 4, 8 and the epoch's last (10): 3 an epoch.
    assert [s.step for s in steps] == [1, 2, 3, 4, 5, 6]
    assert [s.loss for s in steps] == [4.0, 8.0, 10.0, 4.0, 8.0, 10.0]  # the step's last batch
    assert r.unit == "optimizer steps"


def test_lightning_bars_count_batches_when_the_accumulation_is_not_known(captured: Path) -> None:
    tail, steps = read_all(captured / "lightning_tqdm.log", chunk=97)
    assert (tail.recogniser, tail.recognition.unit) == ("lightning", "batches")
    assert steps[-1].step == 100  # 100 batches (the run stepped its optimizer on each)
    assert step_words(720, "batches") == "batch 720 (the log counts batches, not optimizer steps)"
    assert step_words(74, "optimizer steps") == "step 74"


def run_with_log(*recs: p.Record) -> RunState:
    st = RunState(run_id="r", argv=["python"], cwd="/", created=0.0)
    st.apply(p.AttemptStarted(n=1, t=0.0, pid=1, pgid=1, start_time=0.0, argv=["python"], cwd="/"))
    for r in recs:
        st.apply(r)
    return st


def test_the_trainer_panel_says_the_log_was_not_recognised() -> None:
    from trainroom.tui.figures import trainer_view

    assert trainer_view(run_with_log(), 1.0).telemetry == "waiting"
    view = trainer_view(run_with_log(p.LogRecognised(t=1.0, attempt=1, name="none", lines=200)), 1.0)
    assert view.telemetry == "unrecognised"


@pytest.mark.parametrize(
    ("unit", "words", "lost"),
    [
        (
            "batches",
            "at batch 92 (the log counts batches, not optimizer steps); the last verified checkpoint is at step 20; steps lost not known",
            None,
        ),
        ("optimizer steps", "at step 92; 72 steps lost since the last verified checkpoint (step 20)", 72),
    ],
)
def test_steps_lost_are_counted_only_in_optimizer_steps(unit: str, words: str, lost: int | None) -> None:
    from trainroom.core.health.life import _lost

    st = run_with_log(
        p.LogRecognised(t=1.0, attempt=1, name="lightning", unit=unit),
        p.CheckpointState(path="/c/epoch=1-step=20.ckpt", step=20, state="verified", t=1.0),
        p.Received(attempt=1, rank=0, t=2.0, msg=p.Step(step=92, t=2.0, loss=1.0, source="log")),
    )
    a = st.attempt
    assert a is not None and a.last_step == 92
    assert _lost(st, a) == (words, lost)


def test_a_kill_plan_over_a_log_counting_batches_gives_the_batch_not_steps_lost() -> None:
    from trainroom.core.actions import render

    plan = {
        "pgid": 40,
        "members": [{"pid": 40, "cmdline": ["python", "train.py"]}],
        "step": 92,
        "last_verified_step": 20,
        "step_unit": "batches",
    }
    lines = render.plan_lines("kill", plan)
    words = "  stops at batch 92 (the log counts batches, not optimizer steps); last verified checkpoint at step 20"
    assert f"{words}: the steps lost are not known" in lines
    assert not any("loses" in x for x in lines)


def test_a_bare_bar_alone_is_a_bar_count_until_a_trainer_dict_shows_it_is_hfs(tmp_path: Path) -> None:
    log = tmp_path / "t.log"
    tail = LogTail(log, None)
    log.write_text("\r 10%|█         | 10/100 [00:01<00:09, 9.9it/s]")
    recs = tail.records(1, 0.0, tail.read())
    assert recs[0] == p.LogRecognised(t=0.0, attempt=1, name="tqdm", unit="bar count")
    with open(log, "a") as f:
        f.write(
            "\n{'loss': 2.5, 'learning_rate': 0.0001, 'epoch': 0.1}\n\r 11%|█         | 11/100 [00:01<00:09, 9.9it/s]\n"
        )
    recs = tail.records(1, 1.0, tail.read())
    assert recs[0] == p.LogRecognised(t=1.0, attempt=1, name="hf", unit="optimizer steps")
    assert (tail.recogniser, tail.recognition.unit) == ("hf", "optimizer steps")


def test_lightnings_bar_with_no_known_total_counts_across_epochs() -> None:
    """Lightning's TQDM bar format with total None draws `Epoch 1: |   | 3/? [...`: each epoch's
    count goes on from where the one before ended."""
    from trainroom.core.logs.logformats import LightningBar

    bar = LightningBar()
    out = []
    for epoch, last in ((0, 40), (1, 25)):
        for n in range(1, last + 1):
            out += bar.feed(
                f"Epoch {epoch}: |          | {n}/? [00:01<?, 30.0it/s, v_num=0, train_loss={n}.000]"
            )
    out += bar.end()
    assert [s.step for s in out] == list(range(1, 66))
    assert out[-1].loss == 25.0
