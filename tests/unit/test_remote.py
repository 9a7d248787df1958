"""ssh:// targets, the ssh command line, [hosts], job names from torchrun's flags, and backoff."""

from __future__ import annotations

import shlex

import msgspec
import pytest

from trainroom.core.configuration import config as cfg
from trainroom.core.configuration import sections
from trainroom.core.configuration.settings import job_options
from trainroom.core.remote import ssh
from trainroom.core.remote.link import Backoff, Reachability
from trainroom.core.remote.target import SshTarget, TargetError, parse_target


@pytest.mark.parametrize(
    ("spec", "host", "user", "port", "run"),
    [
        ("ssh://gpu1", "gpu1", None, None, None),
        ("ssh://me@gpu1:2222/20261201-train-ab12", "gpu1", "me", 2222, "20261201-train-ab12"),
        ("ssh://[::1]:22/ab12", "[::1]", None, 22, "ab12"),
        ("ssh://10.0.0.5/", "10.0.0.5", None, None, None),
    ],
)
def test_targets_parse(spec: str, host: str, user: str | None, port: int | None, run: str | None) -> None:
    t = parse_target(spec)
    assert (t.host, t.user, t.port, t.run) == (host, user, port, run)
    assert parse_target(str(t)) == t  # the address round-trips


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("ssh://", "expected ssh://"),
        ("ssh://-oProxyCommand=x/run", "expected ssh://"),
        ("ssh://h:99999/r", "not in [1, 65535]"),
        ("ssh://h/-rf", "is not a run id"),
        ("ssh://h/a;rm -rf", "is not a run id"),
        ("http://h/r", "expected ssh://"),
    ],
)
def test_bad_targets_say_why_in_one_line(spec: str, why: str) -> None:
    with pytest.raises(TargetError, match="^.*" + why.replace("[", r"\[").replace("]", r"\]")) as e:
        parse_target(spec)
    assert "\n" not in str(e.value)


def test_a_hosts_alias_brings_its_user_port_and_remote_command_and_the_target_wins() -> None:
    hosts = {"node1": sections.Host(target="ssh://me@10.0.0.5:2222", remote_command="~/venv/bin/trainroom")}
    t = parse_target("ssh://node1/abc", hosts)
    assert (t.host, t.user, t.port, t.run, t.remote_command) == (
        "10.0.0.5",
        "me",
        2222,
        "abc",
        "~/venv/bin/trainroom",
    )
    assert str(t) == "ssh://me@node1:2222/abc" and parse_target(str(t), hosts) == t
    assert parse_target("ssh://you@node1:22", hosts).user == "you"


def test_config_hosts_are_checked_naming_the_key() -> None:
    ok = cfg.decode_config('[hosts.node1]\ntarget = "ssh://me@h:2222"\n')
    assert ok.hosts["node1"].target == "ssh://me@h:2222"
    with pytest.raises(sections.ConfigError, match=r"hosts\.node1\.target: expected ssh://"):
        cfg.decode_config('[hosts.node1]\ntarget = "me@h"\n')
    with pytest.raises(sections.ConfigError, match=r"trainroom.toml: hosts\[\.\.\.\]\.bogus: unknown key"):
        cfg.decode_config('[hosts.node1]\ntarget = "ssh://h"\nbogus = 1\n')


def test_ssh_argv_batch_mode_user_options_first_and_remote_words_quoted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ssh.ENV_SSH_COMMAND, "ssh -i '/k ey' -o BatchMode=no")
    monkeypatch.setenv(ssh.ENV_REMOTE_COMMAND, "env TRAINROOM_HOME=/x trainroom")
    argv = ssh.ssh_argv(SshTarget(host="h", user="u", port=2200, run="r"), ["bridge", "a b;c"])
    assert argv[:5] == ["ssh", "-i", "/k ey", "-o", "BatchMode=no"]  # ssh takes the first value given
    assert "BatchMode=yes" in argv and argv[argv.index("-p") + 1] == "2200" and "-T" in argv
    assert argv[-2] == "u@h"
    assert shlex.split(argv[-1]) == ["env", "TRAINROOM_HOME=/x", "trainroom", "bridge", "a b;c"]


def test_an_ssh_that_is_not_there_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ssh.ENV_SSH_COMMAND, "/nonexistent/ssh")
    with pytest.raises(ssh.RemoteRefused, match="cannot run '/nonexistent/ssh'"):
        ssh.dial(SshTarget(host="h"))


def test_a_failing_ssh_is_unreachable_with_its_own_words(monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in ssh that fails the way ssh does (exit 255, its reason on stderr).
    monkeypatch.setenv(
        ssh.ENV_SSH_COMMAND,
        "sh -c 'echo \"ssh: connect to host h port 22: Connection refused\" >&2; exit 255' --",
    )
    with pytest.raises(
        ssh.Unreachable, match="ssh://h unreachable: ssh: connect to host h port 22: Connection refused"
    ):
        ssh.dial(SshTarget(host="h"))


def test_a_remote_without_trainroom_is_refused_naming_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        ssh.ENV_SSH_COMMAND, "sh -c 'echo \"bash: trainroom: command not found\" >&2; exit 127' --"
    )
    with pytest.raises(ssh.RemoteRefused, match=r"command not found.*TRAINROOM_REMOTE_COMMAND"):
        ssh.dial(SshTarget(host="h"))


@pytest.mark.parametrize(
    ("given", "argv", "env", "name", "source", "node_rank", "nnodes"),
    [
        ("j", ["python", "train.py"], {}, "j", "--job", None, None),
        (
            None,
            ["torchrun", "--nnodes=2", "--node-rank", "1", "--rdzv-id", "exp7", "train.py", "--rdzv-id", "x"],
            {},
            "exp7",
            "--rdzv-id",
            1,
            "2",
        ),
        (
            None,
            ["python", "-m", "torch.distributed.run", "--node_rank=0", "--rdzv_id=e", "-m", "pkg.train"],
            {},
            "e",
            "--rdzv-id",
            0,
            None,
        ),
        (
            None,
            ["torchrun", "--nnodes=2", "train.py"],
            {"TORCHELASTIC_RUN_ID": "r9"},
            "r9",
            "TORCHELASTIC_RUN_ID",
            None,
            "2",
        ),
    ],
)
def test_the_job_name_and_node_rank_come_from_torchruns_flags(
    given: str | None,
    argv: list[str],
    env: dict[str, str],
    name: str,
    source: str,
    node_rank: int | None,
    nnodes: str | None,
) -> None:
    job = job_options(given, argv, env, "host-a")
    assert job is not None
    assert (job.name, job.source, job.node_rank, job.nnodes, job.host) == (
        name,
        source,
        node_rank,
        nnodes,
        "host-a",
    )


def test_no_job_without_a_name_and_torchruns_default_id_names_none() -> None:
    assert job_options(None, ["python", "train.py"], {}, "h") is None
    assert job_options(None, ["torchrun", "--rdzv-id=none", "t.py"], {}, "h") is None
    with pytest.raises(msgspec.ValidationError):
        job_options("a b", [], {}, "h")


def test_backoff_doubles_to_its_cap_and_resets() -> None:
    b = Backoff(first_s=0.5, max_s=4.0, jitter=0.0)
    assert [b.next_wait() for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    b.reset()
    assert b.next_wait() == 0.5


def test_reachability_keeps_the_first_loss_time_and_says_unreachable_since() -> None:
    r = Reachability()
    r.lost(100.0, "link lost", 101.0)
    r.lost(105.0, "Connection refused", 107.0)
    assert (r.since, r.tries, r.reachable) == (100.0, 2, False)
    text = r.describe(106.0)
    assert text.startswith("unreachable since") and "Connection refused" in text and "dead" not in text
    r.found()
    assert r.reachable and r.describe(110.0) == "reachable"
