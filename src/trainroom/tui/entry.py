"""`trainroom`, `trainroom watch` and `trainroom demo` open the control room here: bad input (an
unknown theme or run, a bad `[keys]` table) is one line on stderr and exit 2, before any screen;
on the way out it says that the run goes on and how to come back to it or stop it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainroom.core.configuration.config import load_config
from trainroom.core.configuration.sections import ConfigError
from trainroom.core.run.store import RunError

from . import theming
from .app import ControlRoom
from .bindings import KeymapError, keymap_of
from .link import LocalRuns


def load_keymap(project_dir: Path) -> dict[str, str]:
    """The `[keys]` of the trainroom.toml in force here (this dir, then the state dir)."""
    config, path = load_config(project_dir)
    return keymap_of(config.keys, str(path) if path is not None else "trainroom.toml")


def run_app(args: argparse.Namespace) -> int:
    """`trainroom [--theme NAME]`, `trainroom watch [RUN] [--theme NAME]` and `trainroom demo`
    (args: `run`, and `watch_theme` or `theme`)."""
    run_id: str | None = getattr(args, "run", None)
    theme: str | None = getattr(args, "watch_theme", None) or getattr(args, "theme", None)
    if theme:
        loaded = theming.load_themes(theming.default_dirs())
        if loaded.find(theme) is None:
            print(
                f"trainroom: unknown theme {theme!r} (available: {', '.join(loaded.short_names())})",
                file=sys.stderr,
            )
            return 2
    if run_id:
        try:
            LocalRuns().resolve(run_id)
        except RunError as exc:
            print(f"trainroom: {exc}", file=sys.stderr)
            return 2
    try:
        keymap = load_keymap(Path.cwd())
    except (ConfigError, KeymapError) as exc:
        print(f"trainroom: {exc}", file=sys.stderr)
        return 2
    if not sys.stdout.isatty():
        print(
            "trainroom: the control room needs a terminal (try `trainroom status`, or `--no-tui`)",
            file=sys.stderr,
        )
        return 2
    app = ControlRoom(run_id, theme, keymap=keymap)
    app.run()
    said = app.farewell()
    if said:
        print(said)
    return app.return_code or 0
