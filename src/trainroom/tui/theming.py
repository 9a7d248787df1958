"""Theme files: `themes/*.toml` decoded, validated and turned into Textual themes.

A bad file never stops the control room: it is skipped, and its name and error are gathered so
the app can say so once, in one notification. Colours are checked here, so a typo names its field
instead of surfacing later as a stylesheet error.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path

import msgspec
from textual.color import Color, ColorParseError
from textual.theme import Theme

from trainroom.core.run.store import ensure_state_dir, state_dir

DEFAULT_THEME = "trainroom-dark"
CONTRAST_THEME = "trainroom-contrast"  # the default under NO_COLOR: it reads best in grey
APP_VARIABLE_PREFIX = "trainroom-"
ALIASES = {"high-contrast": CONTRAST_THEME, "hc": CONTRAST_THEME}

_COLOUR_FIELDS = (
    "primary",
    "secondary",
    "warning",
    "error",
    "success",
    "accent",
    "foreground",
    "background",
    "surface",
    "panel",
    "boost",
)


class ThemeFile(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    primary: str
    secondary: str | None = None
    warning: str | None = None
    error: str | None = None
    success: str | None = None
    accent: str | None = None
    foreground: str | None = None
    background: str | None = None
    surface: str | None = None
    panel: str | None = None
    boost: str | None = None
    dark: bool = True
    luminosity_spread: float = 0.15
    text_alpha: float = 0.95
    description: str = ""
    variables: dict[str, str] = {}


class ThemeError(Exception):
    pass


@dataclass
class LoadedThemes:
    themes: list[Theme] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # "file.toml: what is wrong", one a file

    def names(self) -> list[str]:
        return [t.name for t in self.themes]

    def short_names(self) -> list[str]:
        """The names `--theme` takes (`dark`, `light`, `high-contrast`, a user theme's)."""
        return [short_name(t.name) for t in self.themes]

    def find(self, name: str) -> Theme | None:
        """By full name, or by the short name (`light` for `trainroom-light`, `high-contrast`)."""
        name = ALIASES.get(name, name)
        for t in self.themes:
            if t.name in (name, APP_VARIABLE_PREFIX + name):
                return t
        return None


def _check_colour(where: str, value: str) -> None:
    try:
        Color.parse(value)
    except ColorParseError:
        raise ThemeError(f"{where}: {value!r} is not a colour") from None


def parse_theme(data: bytes) -> Theme:
    try:
        spec = msgspec.toml.decode(data, type=ThemeFile)
    except msgspec.ValidationError as exc:
        raise ThemeError(str(exc)) from None
    except msgspec.DecodeError as exc:
        raise ThemeError(f"not valid TOML: {exc}") from None
    except RecursionError:  # the TOML parser recurses per nested array or table
        raise ThemeError("not valid TOML: nested too deeply") from None
    if not spec.name.strip():
        raise ThemeError("name is empty")
    for name in _COLOUR_FIELDS:
        value = getattr(spec, name)
        if value is not None:
            _check_colour(name, value)
    for key, value in spec.variables.items():
        if key.startswith(APP_VARIABLE_PREFIX):
            _check_colour(f"variables.{key}", value)
    return Theme(
        name=spec.name,
        primary=spec.primary,
        secondary=spec.secondary,
        warning=spec.warning,
        error=spec.error,
        success=spec.success,
        accent=spec.accent,
        foreground=spec.foreground,
        background=spec.background,
        surface=spec.surface,
        panel=spec.panel,
        boost=spec.boost,
        dark=spec.dark,
        luminosity_spread=spec.luminosity_spread,
        text_alpha=spec.text_alpha,
        variables=dict(spec.variables),
    )


def default_dirs() -> list[Path | Traversable]:
    """The shipped themes, then the user's (`$TRAINROOM_HOME/themes`), which win on a name."""
    dirs: list[Path | Traversable] = [resources.files("trainroom.themes")]
    user = state_dir() / "themes"
    if user.is_dir():
        dirs.append(user)
    extra = os.environ.get("TRAINROOM_THEMES")
    if extra:
        dirs.append(Path(extra))
    return dirs


def load_themes(dirs: Iterable[Path | Traversable]) -> LoadedThemes:
    loaded = LoadedThemes()
    by_name: dict[str, Theme] = {}
    for d in dirs:
        try:
            entries = sorted((e for e in d.iterdir() if e.name.endswith(".toml")), key=lambda e: e.name)
        except OSError as exc:
            loaded.errors.append(f"{d}: {exc.strerror or exc}")
            continue
        for entry in entries:
            try:
                theme = parse_theme(entry.read_bytes())
            except (ThemeError, OSError) as exc:
                loaded.errors.append(f"{entry.name}: {exc}")
                continue
            by_name[theme.name] = theme
    # Shipped order (dark, light, contrast) is the cycle order of `t`.
    order = {DEFAULT_THEME: 0, "trainroom-light": 1, CONTRAST_THEME: 2}
    loaded.themes = sorted(by_name.values(), key=lambda t: (order.get(t.name, 9), t.name))
    return loaded


def short_name(name: str) -> str:
    """What `--theme` takes and `t` says: `dark`, `light`, `high-contrast` for the shipped themes,
    a user theme's own name without the app's prefix."""
    if name == CONTRAST_THEME:
        return "high-contrast"
    return name.removeprefix(APP_VARIABLE_PREFIX)


def initial_theme(
    loaded: LoadedThemes,
    requested: str | None,
    *,
    no_color: bool,
    builtin: Callable[[str], Theme | None],
    remembered: str | None = None,
) -> tuple[str, str]:
    """The theme to open with, and what to say about the request (empty when nothing): the
    requested one (a file's, by full or short name, or one of Textual's via `builtin`), else the
    one `t` last chose (`remembered`; NO_COLOR asks for the contrast theme this once), else the
    default (the contrast theme under NO_COLOR)."""
    note = ""
    if requested:
        found = loaded.find(requested) or builtin(requested)
        if found is not None:
            return found.name, note
        note = f"unknown theme {requested!r}; available: {', '.join(loaded.short_names())}"
    if remembered and not no_color:
        found = loaded.find(remembered) or builtin(remembered)
        if found is not None:
            return found.name, note
    preferred = CONTRAST_THEME if no_color else DEFAULT_THEME
    for name in (preferred, DEFAULT_THEME):
        if loaded.find(name) is not None:
            return name, note
    return "textual-dark", note


# --------------------------------------------------------------------------- the theme `t` chose

SETTINGS_NAME = "control-room.json"  # in the state dir: the person's setting, not a run's


REFRESH_CHOICES = (0.5, 1.0, 2.0, 5.0)
UNITS_CHOICES = ("binary", "decimal")
GRAPH_CHOICES = ("braille", "blocks")


class RoomSettings(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The control room's own settings (control-room.json in the state dir): the theme `t` chose
    and the options screen's (`O`) refresh, units and graph style."""

    theme: str | None = None
    refresh_s: float = 1.0  # how often routine figures and the history graphs are redrawn
    units: str = "binary"  # bytes as GiB (binary) or GB (decimal)
    graph: str = "braille"  # the history graphs drawn as braille lines or block bars

    def checked(self) -> RoomSettings:
        """Itself, with any value outside its choices back at the default."""
        return RoomSettings(
            theme=self.theme,
            refresh_s=self.refresh_s if self.refresh_s in REFRESH_CHOICES else 1.0,
            units=self.units if self.units in UNITS_CHOICES else "binary",
            graph=self.graph if self.graph in GRAPH_CHOICES else "braille",
        )


def room_settings() -> RoomSettings:
    """What control-room.json holds (defaults where it holds nothing usable)."""
    try:
        return msgspec.json.decode(settings_path().read_bytes(), type=RoomSettings).checked()
    except (OSError, msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return RoomSettings()


def keep_settings(settings: RoomSettings) -> str:
    """Write the settings whole, then rename (a reader never sees half a file); the empty string
    when kept, else why not, in words."""
    path = settings_path()
    tmp = path.with_name(path.name + ".tmp")
    try:
        ensure_state_dir()  # private (0700) when this is what creates it
        tmp.write_bytes(msgspec.json.encode(settings) + b"\n")
        os.replace(tmp, path)
    except OSError as exc:
        return f"not kept for next time: {exc.strerror or exc}"
    return ""


def settings_path() -> Path:
    return state_dir() / SETTINGS_NAME


def remembered() -> str | None:
    """The theme `t` last chose (its short name), or None: no file, or one that cannot be read
    (a setting that cannot be read is forgotten, never an error that stops the room)."""
    try:
        return msgspec.json.decode(settings_path().read_bytes(), type=RoomSettings).theme
    except (OSError, msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None


def remember(theme: str) -> str:
    """Keep `theme` for the next session (written whole, then renamed, so a reader never sees
    half a file); the empty string when kept, else why not, in words."""
    return keep_settings(msgspec.structs.replace(room_settings(), theme=short_name(theme)))


def app_variables(theme: Theme) -> dict[str, str]:
    """The app's own variables, derived from `theme` so that any theme (a built-in one picked in
    the palette too) draws the panels; theme files override them."""
    c = theme.to_color_system().generate()
    return {
        "trainroom-ok": c["text-success"],
        "trainroom-info": c["text-primary"],
        "trainroom-warn": c["text-warning"],
        "trainroom-crit": c["text-error"],
        "trainroom-dim": c["foreground-muted"],
        "trainroom-label": c["foreground-muted"],
        "trainroom-value": c["foreground"],
        "trainroom-border": c["foreground-disabled"],
        "trainroom-curve": c["text-primary"],
        "trainroom-lnv": c["text-warning"],
        "trainroom-mark": c["text-accent"],
        "trainroom-bar-driver": c["warning"],
        "trainroom-bar-allocator": c["primary"],
        "trainroom-bar-empty": c["surface-active"],
        "trainroom-badge-text": c["background"],
        "trainroom-state-running": c["success"],
        "trainroom-state-starting": c["primary"],
        "trainroom-state-slow": c["warning"],
        "trainroom-state-stalled": c["error"],
        "trainroom-state-hung": c["error"],
        "trainroom-state-dead": c["error"],
        "trainroom-state-exited": c["panel"],
        "trainroom-banner": c["error-muted"],
    }
