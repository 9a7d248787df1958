"""The control room's screens, each loaded when first opened: none is on the first frame, and
with the widgets only they use (DataTable) they are 17 modules the start need not load.
`tests/tui/test_first_frame.py` keeps them out of the startup path by `sys.modules`."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .ask import AskArgs
    from .confirm import ConfirmAction
    from .finding import FindingDetail
    from .help import HelpScreen
    from .history import HistoryScreen
    from .runs import RunsScreen


def runs() -> type[RunsScreen]:
    from .runs import RunsScreen

    return RunsScreen


def help() -> type[HelpScreen]:
    from .help import HelpScreen

    return HelpScreen


def finding() -> type[FindingDetail]:
    from .finding import FindingDetail

    return FindingDetail


def confirm() -> type[ConfirmAction]:
    from .confirm import ConfirmAction

    return ConfirmAction


def history() -> type[HistoryScreen]:
    from .history import HistoryScreen

    return HistoryScreen


def ask() -> type[AskArgs]:
    from .ask import AskArgs

    return AskArgs
