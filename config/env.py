"""Small helpers that read settings from the environment and fail loudly on a bad value.

Every helper names the variable and what it accepts, so an operator who mistypes a value
learns which one at start-up instead of seeing odd behaviour later.
"""

from __future__ import annotations

import os
from urllib.parse import urlparse


class ConfigError(RuntimeError):
    """A setting in the environment has a value Myriad cannot use."""


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value not in choices:
        raise ConfigError(f"{name}={raw!r} is not one of {', '.join(choices)}")
    return value


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean; use one of 1/0, true/false, yes/no, on/off")


def _number(name: str, default, parse, what: str, minimum):
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = parse(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not {what}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ConfigError(f"{name}={raw!r} is not a finite number")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name}={raw!r} must be at least {minimum:g}")
    return value


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    return _number(name, default, int, "a whole number", minimum)


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    return _number(name, default, float, "a number", minimum)


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    items = [item.strip() for item in raw.split(",") if item.strip()]
    if not items:
        raise ConfigError(
            f"{name} is set but empty; give a comma-separated list such as 'localhost,127.0.0.1'"
        )
    return items


def env_url(name: str, default: str | None, *, schemes: tuple[str, ...]) -> str | None:
    """A URL whose scheme must be one of ``schemes``; ``None`` when unset and no default."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    parsed = urlparse(raw)
    if parsed.scheme not in schemes:
        allowed = ", ".join(f"{s}://" for s in schemes)
        raise ConfigError(f"{name}={raw!r} has an unsupported scheme; allowed: {allowed}")
    if parsed.scheme not in ("sqlite",) and not parsed.hostname:
        raise ConfigError(f"{name}={raw!r} names no host")
    return raw


def env_networks(name: str) -> list:
    """Networks (``10.0.0.0/8``) or single addresses, comma-separated; empty when unset."""
    import ipaddress

    raw = os.environ.get(name, "")
    out = []
    for item in (i.strip() for i in raw.split(",")):
        if not item:
            continue
        try:
            out.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ConfigError(f"{name}: {item!r} is not an address or network such as 10.0.0.0/8") from None
    return out


SECRETS = ("MYRIAD_SECRET_KEY", "MYRIAD_DATABASE_URL", "MYRIAD_REDIS_URL", "MYRIAD_METRICS_TOKEN")


def load_secret_files(names=SECRETS, environ=os.environ) -> None:
    """``NAME_FILE`` (a mounted secret: Docker, Kubernetes, systemd credentials) supplies NAME when
    NAME itself is unset; the file's content, without its final newline. Both set is an error."""
    for name in names:
        path = environ.get(f"{name}_FILE")
        if not path:
            continue
        if environ.get(name):
            raise ConfigError(f"{name} and {name}_FILE are both set; set one")
        try:
            with open(path, encoding="utf-8") as f:
                value = f.read().rstrip("\r\n")
        except OSError as exc:
            raise ConfigError(f"{name}_FILE={path!r} cannot be read ({exc.strerror})") from None
        if not value:
            raise ConfigError(f"{name}_FILE={path!r} is empty")
        environ[name] = value
