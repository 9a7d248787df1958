"""Acting on the run: plan -> confirm -> run -> result, one keeper action at a time.

The keeper plans every action first (`confirm=False`: the exact target, nothing done). A
destructive one is shown for confirmation, and the execution carries the confirmed plan as
`expect`, so the keeper refuses if the target changed meanwhile. Requests are blocking socket
calls: they run in thread workers, whose results reach the UI through `call_from_thread`.

`ActionFlow` is a part the control room holds: the app says why an action cannot act now
(`why_not`: a key that cannot act says so) and how to reach the keeper (`keeper_link`); a key
names the finding whose own target it acts on, if any.

While a confirmed action runs, the strip over the keys says which, how long it has run, its
latest progress line with a live countdown where the keeper gave one ("38 s left": a kill's wait
for the GPU memory), and the key that cancels it when it can be (`cancel` to the keeper: a kill
ends only its wait, never its signalling); the key strip offers that key first.
"""

from __future__ import annotations

import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Protocol

from textual.app import App
from textual.timer import Timer
from textual.worker import Worker, WorkerState, get_current_worker

from trainroom.core.actions import options
from trainroom.core.actions.registry import REGISTRY
from trainroom.core.wire.protocol import Reply, confirming

from .evidence import ActionOutcome
from .link import KeeperLink
from .screens import lazy as screens  # loaded when first opened, after the first frame
from .verdict import FindingRow
from .widgets.actionstrip import ActionStrip

ACTION_GROUP = "action"  # the workers of the action under way (one at a time: exclusive)
CANCEL_GROUP = "action-cancel"  # a cancel's request, beside the action it cancels
TICK_S = 0.5  # how often the strip's countdown and elapsed time are redrawn
# A progress line's countdown, as the keeper words it ("...; 38 s left").
_LEFT = re.compile(r"(\d+(?:\.\d+)?) s left")


class Running:
    """The confirmed action under way, as the strip says it: its latest progress line and when
    the countdown in it ends (monotonic), if it has one."""

    def __init__(self, action: str) -> None:
        self.action = action
        self.since = time.monotonic()
        self.line = "running…"
        self.ends_at: float | None = None
        self.cancelling = False

    def progress(self, line: str) -> None:
        self.line = line
        m = _LEFT.search(line)
        self.ends_at = time.monotonic() + float(m.group(1)) if m else None

    def text(self, cancel_key: str | None) -> str:
        """`kill running 12 s, 38 s left · X: cancel the wait · waiting for the driver…`: what
        matters first, so a narrow terminal cuts only the keeper's words."""
        now = time.monotonic()
        out = f"{self.action} running {now - self.since:.0f} s"
        line = self.line
        if self.ends_at is not None:
            out += f", {max(self.ends_at - now, 0.0):.0f} s left"
            line = _LEFT.sub("", line, count=1).rstrip(" ;,")
        if self.cancelling:
            out += " · cancelling…"
        elif cancel_key is not None and REGISTRY[self.action].spec.cancellable:
            out += f" · {cancel_key}: cancel {REGISTRY[self.action].spec.cancel_ends}"
        return f"{out} · {line}"


def plan_or_refusal(action: str, replies: list[Reply]) -> Reply | ActionOutcome:
    """The keeper's plan to act on, or why there is none (refused, or not available yet), said
    plainly as the keeper put it."""
    plan = next((r for r in replies if r.stage == "plan"), None)
    if plan is not None and plan.ok:
        return plan
    said = next((r for r in replies if r.stage == "done"), None) or plan
    if said is None:
        return ActionOutcome.failed(action, "the keeper sent no plan")
    return ActionOutcome.of_reply(action, said)


def keeper_replies(link: KeeperLink, action: str, args: dict[str, object], confirm: bool) -> Iterator[Reply]:
    """The keeper's replies to one request, read by a daemon thread: the calling worker waits on
    them but gives up when cancelled, so quitting never waits for an action (the keeper carries
    it out whether anyone watches or not)."""
    replies: queue.Queue[Reply | BaseException | None] = queue.Queue()

    def pump() -> None:
        try:
            for reply in link.request(action, args, confirm):
                replies.put(reply)
            replies.put(None)
        except BaseException as exc:  # handed to the worker, which raises it
            replies.put(exc)

    threading.Thread(target=pump, name=f"trainroom-{action}", daemon=True).start()
    worker = get_current_worker()
    while True:
        try:
            item = replies.get(timeout=0.2)
        except queue.Empty:
            if worker.is_cancelled:
                return
            continue
        if item is None:
            return
        if isinstance(item, BaseException):
            raise item
        yield item


class ActionHost(Protocol):
    """What the flow asks of the control room: whether an action can act now, and how to reach
    the keeper."""

    def why_not(self, action: str, finding: str | None = None) -> str | None:
        """Why `action` cannot act now, on `finding`'s own target when given (None: it can)."""

    def keeper_link(self) -> KeeperLink:
        """The keeper to ask (called in a worker thread: it may connect)."""

    def key_text(self, action: str) -> str:
        """The key an app action is on now, as the screen writes it."""


class ActionFlow:
    """The keys that act on the run, and the one action under way: a part of the control room
    (`app`), which it asks through `host`."""

    def __init__(self, app: App[int], host: ActionHost) -> None:
        self.app = app
        self.host = host
        self.current: str | None = None
        """The action under way: being planned, awaiting confirmation, or running."""
        self.running: Running | None = None
        """The confirmed action the keeper is carrying out."""
        self._ticking: Timer | None = None

    def start(self, action: str, finding: FindingRow | None = None) -> None:
        """Ask the keeper for the plan of `action` (on `finding`'s own target when it names one),
        or say why it cannot act now."""
        targeted = finding is not None and finding.targeted
        why = self.host.why_not(action, finding.ident if finding is not None and targeted else None)
        if why is not None:
            self.app.notify(f"{action}: not now, {why}", severity="warning", timeout=4, markup=False)
            return
        args: dict[str, object] = {"finding": finding.ident} if finding is not None and targeted else {}
        question = (
            f"{action.capitalize()} {finding.fix.removeprefix(action).strip()}?"
            if targeted and finding and finding.fix
            else None
        )
        self._begin(action, args, question)

    def start_args(self, action: str, args: dict[str, object], question: str | None = None) -> None:
        """Ask the keeper for the plan of `action` with `args` (the processes screen's signal of
        one process: kill with pid, start tick and signal), confirmed as every plan is."""
        why = self.host.why_not(action)
        if why is not None:
            self.app.notify(f"{action}: not now, {why}", severity="warning", timeout=4, markup=False)
            return
        self._begin(action, args, question)

    def _begin(self, action: str, args: dict[str, object], question: str | None) -> None:
        """Ask for the arguments the action requires and `args` lacks (its `Args` say which),
        then the keeper for the plan."""
        lacking = options.missing(REGISTRY[action].Args, args)
        if lacking:
            self.current = action
            self.app.refresh_bindings()
            self.app.push_screen(
                screens.ask()(action, lacking, args), partial(self._asked, action, args, question)
            )
            return
        self.current = action
        self._progress(f"{action}: asking the keeper for the plan…")
        self.app.refresh_bindings()
        self._in_worker(self._request_plan, action, args, question)

    def _asked(
        self, action: str, args: dict[str, object], question: str | None, typed: dict[str, object] | None
    ) -> None:
        self.current = None
        if typed is None:
            self.app.refresh_bindings()
            self.app.notify(f"{action}: cancelled, nothing done", timeout=3)
            return
        self._begin(action, {**args, **typed}, question)

    def _in_worker(self, fn: Callable[..., None], *args: object) -> None:
        self.app.run_worker(
            partial(fn, *args), thread=True, exclusive=True, group=ACTION_GROUP, exit_on_error=False
        )

    def _request_plan(self, action: str, args: dict[str, object], question: str | None) -> None:
        replies = []
        for reply in keeper_replies(self.host.keeper_link(), action, args, False):
            replies.append(reply)
            if reply.stage == "progress":  # a plan that waits (a resume, on a verification)
                self.app.call_from_thread(self._progress, f"{action}: planning · {reply.message}")
        if not get_current_worker().is_cancelled:
            self.app.call_from_thread(
                self._plan_arrived, action, args, question, plan_or_refusal(action, replies)
            )

    def _plan_arrived(
        self, action: str, args: dict[str, object], question: str | None, plan: Reply | ActionOutcome
    ) -> None:
        if isinstance(plan, ActionOutcome):
            self._finish(plan)
        elif REGISTRY[action].spec.destructive:
            self._progress(f"{action}: waiting for your confirmation")
            self.app.push_screen(
                screens.confirm()(action, plan.plan, plan.message, question),
                partial(self._confirmed, action, args, plan),
            )
        else:
            self._in_worker(self._execute, action, args, plan.plan)

    def _confirmed(self, action: str, args: dict[str, object], plan: Reply, yes: bool | None) -> None:
        if yes:
            self._in_worker(self._execute, action, args, plan.plan)
        else:
            self._release()
            self.app.notify(f"{action}: cancelled, nothing done", timeout=3)

    def _execute(self, action: str, args: dict[str, object], plan: dict[str, object]) -> None:
        self.app.call_from_thread(self._began, action)
        final: Reply | None = None
        # `expect` is the target the user confirmed: the keeper refuses if it changed meanwhile.
        for reply in keeper_replies(self.host.keeper_link(), action, confirming(args, plan), True):
            if reply.stage == "done":
                final = reply
            else:
                self.app.call_from_thread(self._ran, reply.message)
        if get_current_worker().is_cancelled:
            return
        outcome = (
            ActionOutcome.of_reply(action, final)
            if final is not None
            else ActionOutcome.failed(action, "the keeper ended the request without a result")
        )
        self.app.call_from_thread(self._finish, outcome)

    def _progress(self, line: str | None) -> None:
        if self.app.is_running:
            self.app.query_one(ActionStrip).view = line

    def _began(self, action: str) -> None:
        self.running = Running(action)
        self._tick()
        self._ticking = self.app.set_interval(TICK_S, self._tick, name="action-countdown")

    def _ran(self, line: str) -> None:
        if self.running is not None:
            self.running.progress(line)
            self._tick()

    def _tick(self) -> None:
        """The strip's line again: the elapsed time and the countdown move on their own."""
        if self.running is not None:
            self._progress(self.running.text(self.host.key_text("cancel_action")))

    def strip_keys(self) -> list[tuple[str, str]]:
        """The key strip's first entry while an action that can be cancelled runs."""
        r = self.running
        if r is None or not REGISTRY[r.action].spec.cancellable or r.cancelling:
            return []
        return [(self.host.key_text("cancel_action"), f"cancel {r.action}")]

    def cancel(self) -> None:
        """The cancel key: ask the keeper to cancel the action under way, if it can be."""
        r = self.running
        if r is None:
            self.app.notify("cancel: no action is running", timeout=3)
            return
        if not REGISTRY[r.action].spec.cancellable:
            self.app.notify(
                f"cancel: {r.action} cannot be cancelled once begun", severity="warning", timeout=4
            )
            return
        if r.cancelling:
            return
        r.cancelling = True
        self._tick()
        self.app.run_worker(
            partial(self._request_cancel, r.action), thread=True, group=CANCEL_GROUP, exit_on_error=False
        )

    def _request_cancel(self, action: str) -> None:
        replies = list(keeper_replies(self.host.keeper_link(), "cancel", {"action": action}, False))
        said = next((r for r in replies if r.stage == "done"), None)
        if said is not None and not said.ok:
            # Too late (it ended meanwhile) or not cancellable: said; the result follows anyway.
            self.app.call_from_thread(self.app.notify, said.message, severity="warning", timeout=4)

    def _release(self) -> None:
        self.current = None
        self.running = None
        if self._ticking is not None:
            self._ticking.stop()
            self._ticking = None
        self._progress(None)
        self.app.refresh_bindings()

    def _finish(self, outcome: ActionOutcome) -> None:
        self._release()
        from .screens.result import ActionResult

        self.app.push_screen(ActionResult(outcome))

    def worker_changed(self, event: Worker.StateChanged) -> None:
        """A request that raised (the keeper unreachable, a socket reset): a result, not a crash."""
        if event.state == WorkerState.ERROR and event.worker.group == CANCEL_GROUP:
            error = event.worker.error
            self.app.notify(f"cancel: the keeper could not be reached: {error}", severity="error", timeout=6)
        if event.state != WorkerState.ERROR or event.worker.group != ACTION_GROUP:
            return
        if self.current is not None:
            error = event.worker.error
            text = str(error) or type(error).__name__
            self._finish(ActionOutcome.failed(self.current, f"the keeper could not be reached: {text}"))


class CancelKey:
    """The control room's cancel key (`action_cancel_action`), mixed into the app so the app
    itself stays the size it is: the flow does the work."""

    flow: ActionFlow

    def action_cancel_action(self) -> None:
        self.flow.cancel()
