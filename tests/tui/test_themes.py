"""Themes: the shipped TOML files load into Textual themes; a bad file is named with its error,
skipped, and said once; --theme picks one; NO_COLOR is honoured."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from tests.support.tui_fakes import dead_run_records, in_loop, make_app, settle, shipped_themes
from trainroom.tui import theming
from trainroom.tui.app import ControlRoom
from trainroom.tui.entry import run_app

GOOD = b'name = "mine"\nprimary = "#336699"\n[variables]\ntrainroom-crit = "#ff00ff"\n'


def write_bad_themes(d) -> None:
    (d / "bad_colour.toml").write_text('name = "x"\nprimary = "not-a-colour"\n')
    (d / "unknown_key.toml").write_text('name = "y"\nprimary = "#000000"\nflavour = "mint"\n')
    (d / "broken.toml").write_text('name = "z\nprimary = \n')
    (d / "bad_variable.toml").write_text(
        'name = "w"\nprimary = "#000000"\n[variables]\ntrainroom-ok = "greenish"\n'
    )
    (d / "mine.toml").write_bytes(GOOD)
    (d / "notes.txt").write_text("not a theme")


def test_the_shipped_themes_load() -> None:
    loaded = theming.load_themes([resources.files("trainroom.themes")])
    assert loaded.errors == []
    assert loaded.names() == ["trainroom-dark", "trainroom-light", "trainroom-contrast"]
    light = loaded.find("light")
    assert light is not None and not light.dark and light.variables["trainroom-crit"] == "#CF222E"
    # every shipped theme sets every app variable, so no panel falls back to a guess
    dark = loaded.find("trainroom-dark")
    assert dark is not None
    for t in loaded.themes:
        assert set(t.variables) == set(dark.variables), t.name


def test_bad_theme_files_are_named_with_their_error_and_skipped(tmp_path) -> None:
    write_bad_themes(tmp_path)
    loaded = theming.load_themes([resources.files("trainroom.themes"), tmp_path])
    assert "mine" in loaded.names() and len(loaded.themes) == 4
    errors = {e.split(":", 1)[0]: e for e in loaded.errors}
    assert sorted(errors) == ["bad_colour.toml", "bad_variable.toml", "broken.toml", "unknown_key.toml"]
    assert "primary: 'not-a-colour' is not a colour" in errors["bad_colour.toml"]
    assert "variables.trainroom-ok: 'greenish' is not a colour" in errors["bad_variable.toml"]
    assert "flavour" in errors["unknown_key.toml"]
    assert "not valid TOML" in errors["broken.toml"]


def test_a_missing_theme_dir_is_an_error_not_a_crash(tmp_path) -> None:
    loaded = theming.load_themes([tmp_path / "nowhere"])
    assert loaded.themes == [] and "nowhere" in loaded.errors[0]


@in_loop
async def test_the_app_registers_the_themes_and_says_once_what_it_skipped(tmp_path) -> None:
    themes = tmp_path / "themes"
    themes.mkdir()
    write_bad_themes(themes)
    run = tmp_path / "run"
    run.mkdir()
    app, _, _ = make_app(str(run), dead_run_records(), theme="mine", theme_dirs=[*shipped_themes(), themes])
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await settle(app, pilot)
        assert app.theme == "mine"
        assert app.get_css_variables()["trainroom-crit"] == "#ff00ff"
        # a theme file that does not set an app variable gets it from the theme's own palette
        assert (
            app.get_css_variables()["trainroom-ok"]
            == app.current_theme.to_color_system().generate()["text-success"]
        )
        notice = app.theme_notice or ""
        for name in ("bad_colour.toml", "unknown_key.toml", "broken.toml", "bad_variable.toml"):
            assert name in notice
        assert len(app._notifications) == 1
        await pilot.press("t")  # the cycle goes through every loaded theme
        assert app.theme == "trainroom-dark"


@in_loop
async def test_light_theme_by_its_short_name(tmp_path) -> None:
    app, _, _ = make_app(str(tmp_path), dead_run_records(), theme="light")
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        assert app.theme == "trainroom-light"
        assert app.get_css_variables()["trainroom-state-dead"] == "#CF222E"
        assert app.theme_notice is None


RICH_SVG_DEFAULT_INK = "#c5c8c6"  # the SVG exporter's own default text colour, not the app's


def _colours(svg: str) -> set[str]:
    return {c.lower() for c in re.findall(r"fill:\s*(#[0-9a-fA-F]{6})", svg)} - {RICH_SVG_DEFAULT_INK}


def _grey(c: str) -> bool:
    r, g, b = int(c[1:3], 16), int(c[3:5], 16), int(c[5:7], 16)
    return max(r, g, b) - min(r, g, b) <= 2


@in_loop
async def test_no_color_turns_the_screen_grey_and_picks_the_contrast_theme(tmp_path, monkeypatch) -> None:
    app, _, _ = make_app(str(tmp_path), dead_run_records())
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        coloured = _colours(app.export_screenshot())
    assert app.theme == "trainroom-dark" and any(not _grey(c) for c in coloured)

    monkeypatch.setenv("NO_COLOR", "1")
    app, _, _ = make_app(str(tmp_path), dead_run_records())
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        svg = app.export_screenshot()
    assert app.no_color and app.theme == "trainroom-contrast"
    assert _colours(svg) and all(_grey(c) for c in _colours(svg)), sorted(_colours(svg))
    assert "DEAD" in svg  # the state still reads, in words


def test_run_app_refuses_an_unknown_theme_or_run(tmp_path, monkeypatch, capsys) -> None:
    import argparse

    monkeypatch.setenv("TRAINROOM_HOME", str(tmp_path))
    assert run_app(argparse.Namespace(run=None, theme="mauve")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown theme 'mauve'" in err and "dark, light, high-contrast" in err
    assert run_app(argparse.Namespace(run="nope", theme=None)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown run 'nope'" in err


def test_the_cli_theme_options_and_aliases(tmp_path, monkeypatch, capsys) -> None:
    import argparse

    monkeypatch.setenv("TRAINROOM_HOME", str(tmp_path))
    loaded = theming.load_themes(shipped_themes())
    assert loaded.find("high-contrast") is loaded.find("contrast") is loaded.find("trainroom-contrast")
    # `watch --theme` (dest watch_theme) wins over the top-level `--theme`; both are checked
    assert run_app(argparse.Namespace(run=None, theme="dark", watch_theme="mauve")) == 2
    assert "unknown theme 'mauve'" in capsys.readouterr().err


def test_an_unknown_theme_inside_the_app_falls_back(tmp_path) -> None:
    app = ControlRoom(None, "mauve", theme_dirs=shipped_themes())
    assert app.theme == "trainroom-dark"
    assert app._theme_note.startswith("unknown theme 'mauve'")


@pytest.mark.parametrize("name", ["trainroom-dark", "trainroom-light", "trainroom-contrast"])
def test_every_app_variable_is_a_colour(name: str) -> None:
    from textual.color import Color

    app = ControlRoom(None, name, theme_dirs=shipped_themes())
    variables = app.get_css_variables()
    for key in app.get_theme_variable_defaults():
        Color.parse(variables[key])


@in_loop
async def test_the_theme_t_chose_is_said_by_its_theme_flag_name_and_kept_for_the_next_session(
    tmp_path, private_settings
) -> None:
    from trainroom.tui import theming

    app, _, _ = make_app(str(tmp_path), dead_run_records())
    said: list[str] = []
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        assert app.theme == "trainroom-dark"
        app.notify = lambda message, **kw: said.append(str(message))  # type: ignore[method-assign]
        await pilot.press("t")
        await pilot.pause()
        assert app.theme == "trainroom-light"
    # The name `--theme` takes, not the file's full name.
    assert said == ["theme: light"]
    assert theming.settings_path().parent == private_settings  # the person's state dir, not a run's
    assert theming.remembered() == "light"
    again, _, _ = make_app(str(tmp_path), dead_run_records())
    async with again.run_test(size=(80, 24)) as pilot:
        await settle(again, pilot)
        assert again.theme == "trainroom-light"
    # `--theme` still wins over what was kept.
    flagged, _, _ = make_app(str(tmp_path), dead_run_records(), theme="high-contrast")
    async with flagged.run_test(size=(80, 24)) as pilot:
        await settle(flagged, pilot)
        assert flagged.theme == "trainroom-contrast"


def test_a_settings_file_that_cannot_be_read_is_forgotten_not_an_error(private_settings) -> None:
    from trainroom.tui import theming

    theming.settings_path().write_text("{not json")
    assert theming.remembered() is None
    assert theming.remember("trainroom-contrast") == "" and theming.remembered() == "high-contrast"
    assert [theming.short_name(n) for n in ("trainroom-dark", "trainroom-light", "trainroom-contrast")] == [
        "dark",
        "light",
        "high-contrast",
    ]
