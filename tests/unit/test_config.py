"""trainroom.toml: lookup order, typed decoding, and one-line errors that name key, file and type."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainroom.core.configuration.config import DEFAULT_LOG_PATTERN, Config, load_config
from trainroom.core.configuration.sections import ConfigError
from trainroom.core.ops.resume import resume_argv


def write(d: Path, text: str) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    p = d / "trainroom.toml"
    p.write_text(text)
    return p


def test_no_file_gives_the_defaults(tmp_path: Path) -> None:
    config, source = load_config(tmp_path / "proj", tmp_path / "state")
    assert source is None
    assert config == Config()
    assert config.thresholds.stall_floor_s == 10.0
    assert config.thresholds.host_ram_low_bytes == 3 << 30
    assert config.kill.vram_tolerance_bytes == 512 << 20
    assert config.kill.vram_timeout_s == 50.0
    assert config.log.pattern is None  # the built-in recognisers (core/logs/logformats)


def test_project_dir_wins_over_state_dir(tmp_path: Path) -> None:
    proj = write(tmp_path / "proj", "[checkpoints]\nkeep = 5\n")
    write(tmp_path / "state", "[checkpoints]\nkeep = 7\n")
    config, source = load_config(tmp_path / "proj", tmp_path / "state")
    assert source == proj
    assert config.checkpoints.keep == 5


def test_state_dir_is_used_when_the_project_has_none(tmp_path: Path) -> None:
    state = write(tmp_path / "state", "theme = 'nord'\n")
    config, source = load_config(tmp_path / "proj", tmp_path / "state")
    assert source == state
    assert config.theme == "nord"


def test_state_dir_defaults_to_trainroom_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = write(tmp_path / "home", "[kill]\ngrace_s = 3\n")
    monkeypatch.setenv("TRAINROOM_HOME", str(tmp_path / "home"))
    config, source = load_config(tmp_path / "proj")
    assert source == home
    assert config.kill.grace_s == 3.0


def test_a_full_file_decodes_into_typed_sections(tmp_path: Path) -> None:
    write(
        tmp_path,
        """
theme = "gruvbox"
lock_files = ["out/train.lock"]
host_processes = ["vmmem", "wslhost"]

[checkpoints]
root = "out"
keep = 3
watch = ["out/ckpt*.pt"]

[thresholds]
stall_floor_s = 20
ghost_factor = 2.0
disk_warn = 0.8
disk_critical = 0.9
repeat_death_window_steps = 30

[kill]
grace_s = 5.0
vram_tolerance_mib = 256

[resume]
command = "python train.py --init_from=resume --out_dir={ckpt_dir}"

[auto_resume]
max = 3
backoff_s = 10

[log]
pattern = 'step (?P<step>\\d+) loss (?P<loss>\\S+)'
""",
    )
    config, _ = load_config(tmp_path, tmp_path / "nostate")
    assert config.thresholds.stall_floor_s == 20.0
    assert isinstance(config.thresholds.stall_floor_s, float)
    assert config.thresholds.repeat_death_window_steps == 30
    assert config.kill.vram_tolerance_bytes == 256 << 20
    assert config.auto_resume.max == 3
    assert config.host_processes == ["vmmem", "wslhost"]
    assert [config.auto_resume.delay_s(n) for n in (1, 2, 3)] == [10.0, 20.0, 40.0]
    resolved = config.resolved(tmp_path)
    assert resolved.checkpoints.root == str(tmp_path / "out")
    assert resolved.checkpoints.watch == [str(tmp_path / "out" / "ckpt*.pt")]
    assert resolved.lock_files == [str(tmp_path / "out" / "train.lock")]


def test_wrong_type_names_key_file_and_expected_type(tmp_path: Path) -> None:
    p = write(tmp_path, '[thresholds]\nstall_floor_s = "ten"\n')
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path, tmp_path / "nostate")
    assert str(err.value) == f"{p}: thresholds.stall_floor_s: expected float, got str"


def test_unknown_key_is_refused_and_the_known_ones_listed(tmp_path: Path) -> None:
    p = write(tmp_path, "[kill]\ngrace = 5\n")
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path, tmp_path / "nostate")
    message = str(err.value)
    assert message.startswith(f"{p}: kill.grace: unknown key (known keys: grace_s,")
    assert "\n" not in message


def test_unknown_top_level_section_is_refused(tmp_path: Path) -> None:
    p = write(tmp_path, "[threshold]\nstall_floor_s = 5\n")
    with pytest.raises(ConfigError, match=r"^" + str(p) + r": threshold: unknown key \(known keys: theme,"):
        load_config(tmp_path, tmp_path / "nostate")


def test_out_of_range_value(tmp_path: Path) -> None:
    p = write(tmp_path, "[thresholds]\ndisk_warn = 1.5\n")
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path, tmp_path / "nostate")
    assert str(err.value) == f"{p}: thresholds.disk_warn: expected float <= 1.0"


def test_list_item_of_wrong_type(tmp_path: Path) -> None:
    p = write(tmp_path, "lock_files = ['a', 3]\n")
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path, tmp_path / "nostate")
    assert str(err.value) == f"{p}: lock_files[1]: expected str, got int"


def test_invalid_toml(tmp_path: Path) -> None:
    p = write(tmp_path, "[kill\ngrace_s = 1\n")
    with pytest.raises(ConfigError, match=r"^" + str(p) + r": not valid TOML: "):
        load_config(tmp_path, tmp_path / "nostate")


def test_disk_warn_must_be_below_critical(tmp_path: Path) -> None:
    write(tmp_path, "[thresholds]\ndisk_warn = 0.95\n")
    with pytest.raises(
        ConfigError, match=r"thresholds\.disk_warn: expected less than thresholds\.disk_critical"
    ):
        load_config(tmp_path, tmp_path / "nostate")


def test_log_pattern_must_compile_and_not_match_an_empty_line(tmp_path: Path) -> None:
    write(tmp_path, "[log]\npattern = 'iter ('\n")
    with pytest.raises(ConfigError, match=r"log\.pattern: expected a regular expression"):
        load_config(tmp_path, tmp_path / "nostate")
    write(tmp_path, "[log]\npattern = '(?P<loss>\\d*)'\n")
    with pytest.raises(ConfigError, match=r"log\.pattern: expected a pattern an empty line does not match"):
        load_config(tmp_path, tmp_path / "nostate")
    # Without a step group each matching line is a step (logformats.PatternLog counts them).
    write(tmp_path, "[log]\npattern = 'train loss (?P<loss>\\S+)'\n")
    config, _path = load_config(tmp_path, tmp_path / "nostate")
    assert config.log.pattern == "train loss (?P<loss>\\S+)"


def test_resume_template_placeholders_are_checked(tmp_path: Path) -> None:
    write(tmp_path, "[resume]\ncommand = 'python train.py --from={checkpoint}'\n")
    with pytest.raises(
        ConfigError, match=r"resume\.command: expected placeholders among \{ckpt\}.*got \{checkpoint\}"
    ):
        load_config(tmp_path, tmp_path / "nostate")


def test_resume_argv_fills_each_word(tmp_path: Path) -> None:
    ckpt_dir = tmp_path / "my ckpts" / "step-000300"
    ckpt_dir.mkdir(parents=True)
    argv = resume_argv(
        "python train.py --init_from=resume --out_dir={ckpt_dir} --step {step}", ckpt=str(ckpt_dir), step=300
    )
    assert argv == ["python", "train.py", "--init_from=resume", f"--out_dir={ckpt_dir}", "--step", "300"]
    ckpt_file = ckpt_dir / "ckpt.pt"
    assert resume_argv("python t.py --resume {ckpt} --dir {ckpt_dir}", ckpt=str(ckpt_file)) == [
        "python",
        "t.py",
        "--resume",
        str(ckpt_file),
        "--dir",
        str(ckpt_dir),
    ]


def test_default_log_pattern_reads_a_nanogpt_line() -> None:
    import re

    m = re.search(DEFAULT_LOG_PATTERN, "iter 100: loss 2.3456, time 123.45ms, mfu 12.34%")
    assert m is not None
    assert (m.group("step"), m.group("loss")) == ("100", "2.3456")
