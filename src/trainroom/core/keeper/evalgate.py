"""Promotion gated by the trainer's own evaluation (`[eval]`, `launch --eval-command`): the keeper's
checkpoint pipeline asks this gate about each verified candidate before it promotes it. A candidate
whose figure is non-finite, missing, or worse than the best promoted one by more than the margin is
held back (journaled as `held`, kept in quarantine with its reason) and EVAL_REGRESSED stays open
until a newer checkpoint passes; `latest` only ever points at one that passed."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import msgspec

from trainroom.core.ckpt.layout import Quarantine
from trainroom.core.ckpt.report import VerifyReport, journal_report
from trainroom.core.ckpt.watch import Sighting, stat_one
from trainroom.core.configuration.settings import RunSettings
from trainroom.core.findings import Finding
from trainroom.core.keeper.evaltree import move_out, tree_state
from trainroom.core.keeper.ports import Recorder, RunContext
from trainroom.core.ops.evaluate import better, evaluate, implausible
from trainroom.core.wire import protocol as p


class EvalGate:
    def __init__(self, settings: RunSettings, recorder: Recorder, run: RunContext) -> None:
        self.settings = settings
        self.recorder = recorder
        self.run = run
        self.held: dict[str, p.CheckpointState] = {}  # path -> a candidate its evaluation held back
        # The last evaluation added files to the checkpoint and they were moved out: its content is
        # the one verified again (a watched directory's mtimes are not: the watch absorbs them).
        self.restored = False
        self.evaluating: str | None = None  # the path under evaluation (the watch holds it still)
        self.after: Sighting | None = None  # how a restored checkpoint looks now (the watch absorbs it)

    def figures(self) -> list[tuple[str, float, bool]]:
        """(path, figure, promoted) of every evaluated checkpoint of this run, held ones too."""
        return [
            (c.path, c.eval.figure, c.state == "verified" and c.eval.passed)
            for c in self.run.state.checkpoints
            if c.eval is not None and c.eval.figure is not None
        ]

    def best_eval(self) -> float | None:
        """The best evaluation figure of a promoted (verified) checkpoint of this run, as the
        journal says (so a restarted keeper judges against the same one). A promoted figure that
        is implausible beside the run's other figures (a bogus -1e9 promoted first) is not the
        best: it would hold every later checkpoint back."""
        best: float | None = None
        seen = self.figures()
        for i, (_, f, promoted) in enumerate(seen):
            others = [g for j, (_, g, _) in enumerate(seen) if j != i]
            if (
                promoted
                and implausible(f, others, self.settings.eval) is None
                and better(f, best, self.settings.eval)
            ):
                best = f
        return best

    async def evaluate(
        self, path: str, report: VerifyReport, *, watched: bool = False
    ) -> p.EvalFigure | None:
        """The trainer's own evaluation of a verified candidate, when `[eval]` sets one (None
        otherwise). It runs before promotion, in this queue: a candidate is promoted only after
        its figure is judged, and what is queued behind it waits."""
        policy = self.settings.eval
        if not policy.command:
            return None
        self.recorder.emit(
            p.CheckpointState(
                path=path, step=report.step, state="verifying", t=time.time(), reason="evaluating"
            )
        )
        self.recorder.flush()
        before = await asyncio.to_thread(tree_state, path)
        self.evaluating = path
        try:
            figure = await asyncio.to_thread(
                evaluate,
                policy,
                path,
                step=report.step,
                run_id=self.run.run_dir.name,
                cwd=self.run.cwd,
                best=self.best_eval(),
                history=[f for _, f, _ in self.figures()],
            )
            return await asyncio.to_thread(self._written, path, before, figure, watched)
        finally:
            self.evaluating = None

    def _written(
        self, path: str, before: dict[str, tuple[int, int]], figure: p.EvalFigure, watched: bool = False
    ) -> p.EvalFigure:
        """What the evaluation wrote into the checkpoint it was given. Files it added (HF's
        save_metrics writes eval_results.json into the directory) are moved out to the run's
        eval-output/ so the candidate is the bytes verified (else its digest changes and it is
        verified and evaluated again, forever); a file it changed cannot be undone: held back."""
        self.restored = False
        after = tree_state(path)
        changed = sorted(k for k, v in before.items() if after.get(k) != v)
        added = sorted(k for k in after if k not in before)
        if changed and watched:
            return figure  # the trainer's own file, written again meanwhile: the watch takes the new version
        if changed:
            return msgspec.structs.replace(
                figure,
                passed=False,
                why=f"its evaluation changed {len(changed)} file(s) of the checkpoint it was given "
                f"({', '.join(changed[:3])}): the bytes verified are gone; an evaluation must only read it",
            )
        if not added:
            return figure
        dest = self.run.run_dir / "eval-output" / Path(path).name
        moved = move_out(Path(path), added, dest)
        self.restored = tree_state(path) == before
        self.after = stat_one(path) if self.restored else None
        self.recorder.emit(
            p.KeeperNote(
                t=time.time(),
                kind="warning",
                message=f"the evaluation of {Path(path).name} wrote {len(added)} file(s) into it "
                f"({', '.join(added[:3])}): moved to {dest} ({moved} moved), so what is promoted is "
                "what was verified",
            )
        )
        return figure

    async def hold(self, path: str, report: VerifyReport, figure: p.EvalFigure, own: Path | None) -> None:
        """A verified candidate its evaluation held back: kept where it is (in quarantine, with its
        reason beside it, so a keeper restart does not evaluate it again), never promoted."""
        why = f"held back: {figure.why}"
        if own is not None:
            with contextlib.suppress(OSError):
                await asyncio.to_thread(
                    Quarantine(own).reject, Path(path), msgspec.structs.replace(report, reason=why)
                )
        rec = p.CheckpointState(
            path=path,
            step=report.step,
            state="held",
            t=time.time(),
            reason=why,
            size_bytes=report.size_bytes,
            digest=report.digest,
            report=journal_report(report),
            eval=figure,
        )
        self.held[path] = rec
        self.recorder.emit(rec)

    def findings(self, newest_ok: int) -> list[Finding]:
        """EVAL_REGRESSED for each held candidate newer than the newest promoted checkpoint: a
        newer one that passes closes it (the run recovered); `latest` never moved to a held one."""
        out: list[Finding] = []
        for path, rec in list(self.held.items())[-8:]:
            if rec.step is not None and newest_ok >= 0 and rec.step <= newest_ok:
                continue
            at = f"step {rec.step}" if rec.step is not None else path
            stays = f"latest stays at step {newest_ok}" if newest_ok >= 0 else "no checkpoint is promoted yet"
            fig = rec.eval
            out.append(
                Finding(
                    code="EVAL_REGRESSED",
                    severity="warning",
                    key=path,
                    message=f"checkpoint {at} held back: {fig.why if fig else 'its evaluation failed'}; {stays}",
                    evidence={
                        "path": path,
                        "step": rec.step,
                        "figure": fig.figure if fig else None,
                        "best": fig.best if fig else None,
                        "margin": self.settings.eval.margin,
                        "seconds": fig.seconds if fig else None,
                    },
                )
            )
        return out
