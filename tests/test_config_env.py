from pathlib import Path

import pytest

from config.env import ConfigError, env_bool, env_float, env_int, env_list, env_url, load_secret_files


def test_it_reads_booleans_in_the_usual_spellings(monkeypatch):
    monkeypatch.setenv("MYRIAD_DEBUG", "yes")
    assert env_bool("MYRIAD_DEBUG", False) is True
    monkeypatch.setenv("MYRIAD_DEBUG", "0")
    assert env_bool("MYRIAD_DEBUG", True) is False


def test_it_names_the_variable_when_a_boolean_is_garbled(monkeypatch):
    monkeypatch.setenv("MYRIAD_DEBUG", "maybe")
    with pytest.raises(ConfigError, match="MYRIAD_DEBUG='maybe' is not a boolean"):
        env_bool("MYRIAD_DEBUG", False)


def test_it_rejects_a_database_url_with_an_unknown_scheme(monkeypatch):
    monkeypatch.setenv("MYRIAD_DATABASE_URL", "mysql://root@localhost/x")
    with pytest.raises(ConfigError, match="MYRIAD_DATABASE_URL.*allowed: sqlite://, postgres://"):
        env_url("MYRIAD_DATABASE_URL", None, schemes=("sqlite", "postgres", "postgresql"))


def test_it_rejects_a_redis_url_without_a_host(monkeypatch):
    monkeypatch.setenv("MYRIAD_REDIS_URL", "redis://")
    with pytest.raises(ConfigError, match="names no host"):
        env_url("MYRIAD_REDIS_URL", None, schemes=("redis",))


def test_an_unset_redis_url_means_the_embedded_default(monkeypatch):
    monkeypatch.delenv("MYRIAD_REDIS_URL", raising=False)
    assert env_url("MYRIAD_REDIS_URL", None, schemes=("redis",)) is None


def test_it_rejects_an_empty_host_list_and_bad_numbers(monkeypatch):
    monkeypatch.setenv("MYRIAD_ALLOWED_HOSTS", " , ")
    with pytest.raises(ConfigError, match="MYRIAD_ALLOWED_HOSTS is set but empty"):
        env_list("MYRIAD_ALLOWED_HOSTS", [])
    monkeypatch.setenv("MYRIAD_TASK_TIME_LIMIT", "0")
    with pytest.raises(ConfigError, match="must be at least 1"):
        env_int("MYRIAD_TASK_TIME_LIMIT", 300, minimum=1)


def test_it_reads_fractions_and_names_a_bad_one(monkeypatch):
    monkeypatch.setenv("MYRIAD_CYCLE_MIN_INTERVAL_S", "0.5")
    assert env_float("MYRIAD_CYCLE_MIN_INTERVAL_S", 1.0, minimum=0.0) == 0.5
    for raw, message in (("soon", "is not a number"), ("nan", "not a finite"), ("-1", "at least 0")):
        monkeypatch.setenv("MYRIAD_CYCLE_MIN_INTERVAL_S", raw)
        with pytest.raises(ConfigError, match=f"MYRIAD_CYCLE_MIN_INTERVAL_S='{raw}' .*{message}"):
            env_float("MYRIAD_CYCLE_MIN_INTERVAL_S", 1.0, minimum=0.0)


def test_settings_refuse_to_start_on_a_bad_value():
    import subprocess
    import sys

    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django, os; os.environ['DJANGO_SETTINGS_MODULE']='config.settings'; django.setup()",
        ],
        env={"MYRIAD_DEBUG": "perhaps", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert out.returncode != 0
    assert "MYRIAD_DEBUG='perhaps' is not a boolean" in out.stderr


def test_secrets_come_from_mounted_files_and_a_bad_file_is_named(tmp_path):
    secret = tmp_path / "key"
    secret.write_text("s3cr3t\n")
    env = {"MYRIAD_SECRET_KEY_FILE": str(secret)}
    load_secret_files(environ=env)
    assert env["MYRIAD_SECRET_KEY"] == "s3cr3t"
    with pytest.raises(ConfigError, match="both set"):
        load_secret_files(environ={"MYRIAD_SECRET_KEY_FILE": str(secret), "MYRIAD_SECRET_KEY": "x"})
    with pytest.raises(ConfigError, match="MYRIAD_METRICS_TOKEN_FILE='/nope' cannot be read"):
        load_secret_files(environ={"MYRIAD_METRICS_TOKEN_FILE": "/nope"})
    (tmp_path / "empty").write_text("")
    with pytest.raises(ConfigError, match="is empty"):
        load_secret_files(environ={"MYRIAD_DATABASE_URL_FILE": str(tmp_path / "empty")})
