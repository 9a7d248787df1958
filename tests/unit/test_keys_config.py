"""`[keys]` in trainroom.toml: the control room's keymap, checked like every other section."""

from __future__ import annotations

import pytest

from trainroom.core.configuration.config import decode_config
from trainroom.core.configuration.sections import ConfigError


def test_keys_given_by_their_names_in_the_file() -> None:
    c = decode_config('[keys]\nkill = "ctrl+k,K"\ncontinue = "U"\nsearch = "/"\n')
    assert c.keys.given() == {"kill": "ctrl+k,K", "continue": "U", "search": "/"}
    assert decode_config("").keys.given() == {}


@pytest.mark.parametrize(
    "text,said",
    [
        (
            '[keys]\nkil = "x"',
            "keys.kil: unknown key (known keys: kill, reclaim, prune, resume, dump, continue,",
        ),
        ('[keys]\nkill = "ctrl k"', "keys.kill: expected key names such as"),
        ('[keys]\nkill = ""', "keys.kill: expected key names such as"),
        ('[keys]\nzoom = "z,,f11"', "keys.zoom: expected key names such as"),
        ("[keys]\nkill = 3", "keys.kill: expected str | null, got int"),
    ],
)
def test_a_bad_key_names_the_key_and_the_file(text: str, said: str) -> None:
    with pytest.raises(ConfigError) as e:
        decode_config(text, "/p/trainroom.toml")
    assert str(e.value).startswith("/p/trainroom.toml: ") and said in str(e.value), str(e.value)
