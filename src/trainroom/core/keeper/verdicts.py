"""The keeper's verdicts: the run's status and its findings from every rule, each raised, refreshed
(to clients at once, to the journal at most every FINDING_REJOURNAL_S) and cleared as a record."""

from __future__ import annotations

from trainroom.core.findings import Finding
from trainroom.core.health.rules import KeeperFacts
from trainroom.core.keeper.parts import KeeperParts
from trainroom.core.probes.procs import pid_alive
from trainroom.core.vocab import StateName
from trainroom.core.wire import protocol as p

FINDING_REJOURNAL_S = 10.0
FINDING_REFRESH_S = 1.0


class Verdicts(KeeperParts):
    """The keeper's judging of the run (used by its attempts and its tick)."""

    def set_findings(self, found: list[Finding], now: float) -> None:
        """Raise what is new, refresh what stays, clear what the rules no longer return."""
        current = self.state.findings
        seen: set[str] = set()
        for f in found:
            seen.add(f.ident)
            self._refresh(f, current.get(f.ident), now)
        for ident in [i for i in current if i not in seen]:
            self._finding_journaled.pop(ident, None)
            self._finding_sent.pop(ident, None)
            self.emit(p.FindingCleared(ident=ident, t=now))

    def _refresh(self, f: Finding, old: Finding | None, now: float) -> None:
        ident = f.ident
        if old is None:
            f.first_seen = f.first_seen or now
            f.last_seen = now
            self._finding_journaled[ident] = now
            self.emit(p.FindingRaised(finding=f))
            log = self.supervision.guard.call(
                "batches.raised", lambda: self.batches.raised(f, self.attempt_n), None
            )
            if log is not None:
                self.emit(log)
            return
        f.first_seen, f.last_seen = old.first_seen, now
        if old.severity != f.severity:
            self._finding_journaled[ident] = now
            self.emit(p.FindingRaised(finding=f))
        elif old.message != f.message:
            # Live figures in a message reach clients at once, the journal at most every
            # FINDING_REJOURNAL_S: a day of NaN steps must not write a record per tick.
            due = now - self._finding_journaled.get(ident, 0.0) >= FINDING_REJOURNAL_S
            if due:
                self._finding_journaled[ident] = now
            self.emit(p.FindingRaised(finding=f), journal=due)
        elif old.evidence != f.evidence and now - self._finding_sent.get(ident, 0.0) >= FINDING_REFRESH_S:
            # Same words, moving figures (a growing gap, a ratio): clients get them live, at most
            # once a second, and the journal keeps the words.
            self._finding_sent[ident] = now
            self.emit(p.FindingRaised(finding=f), journal=False)

    def set_status(self, state: StateName, reason: str, now: float) -> None:
        if (state, reason) != (self.state.status, self.state.status_reason):
            self.emit(p.RunStatus(t=now, state=state, reason=reason))

    def evaluate(self, now: float) -> None:
        """Every rule through the supervision's guard (`health.rules`): one that raises is an
        INTERNAL_ERROR finding, and the state and every other finding still come out."""
        state, reason, found = self.supervision.evaluate(now)
        facts = self.supervision.guard.call("keeper.facts", self._keeper_facts, None)
        if facts is not None:
            found += self.supervision.keeper_findings(facts, now)
        found += self.supervision.findings(now)
        self.set_status(state, reason, now)
        self.set_findings(found, now)

    def _keeper_facts(self) -> KeeperFacts:
        """What the keeper's own rules read of it, gathered here on the loop thread."""
        return KeeperFacts(
            run=self.state,
            thresholds=self._settings.thresholds,
            journal=self.journal.health,
            journal_where=str(self._run_dir),
            journal_backlog_bytes=self.journal.backlog_bytes,
            state_disk=self.state_disk,
            live_claims=[
                (c.attempt, c.rank, c.owner_pid, c.claimant_pid)
                for c in self.server.rank_claims
                if pid_alive(c.claimant_pid)
            ],
            refused_fields=self._refused_fields(),
            checkpoints=self.pipeline.findings,
        )

    def _refused_fields(self) -> list[tuple[int, int, str, str, str, bool, int]]:
        return [
            (r.attempt, r.rank, r.field, r.value, r.reason, r.whole_frame, r.count)
            for r in self.server.refused_fields.values()
        ]
