"""What mosquitto 2.0 makes of the directives: its listeners and the security of each.

With ``per_listener_settings false`` (the default) allow_anonymous, password_file, acl_file and
the other security settings are broker-wide, wherever they stand; with ``true`` each belongs to
the listener context it stands in, the settings before any listener of a file to the default
listener. A configuration without any listener is mosquitto 2's "local only mode": 127.0.0.1
and ::1, port 1883, anonymous clients allowed (src/mosquitto.c listeners__start_local_only).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from mosquitto_layout.conf import ConfError, Directive

__all__ = [
    "SECURITY_KEYS",
    "Broker",
    "LayoutError",
    "Listener",
    "Security",
    "fold",
    "is_security",
    "model",
]

SECURITY_STRINGS = ("password_file", "acl_file", "psk_file", "auto_id_prefix")
SECURITY_BOOLS = ("allow_anonymous", "allow_zero_length_clientid")
PLUGIN_KEYS = ("plugin", "auth_plugin")
PLUGIN_OPTION_PREFIXES = ("plugin_opt_", "auth_opt_")
SECURITY_KEYS = (*SECURITY_STRINGS, *SECURITY_BOOLS, *PLUGIN_KEYS)
# Settings of a listener which, before any `listener` line, create the default listener
# (src/conf.c, config__parse_args); `port` and `bind_address` configure it directly.
DEFAULT_LISTENER_KEYS = frozenset(
    {
        "port", "bind_address", "bind_interface", "cafile", "capath", "certfile", "keyfile",
        "tls_engine", "tls_keyform", "tls_engine_kpass_sha1", "ciphers", "ciphers_tls1.3",
        "dhparamfile", "psk_hint", "crlfile", "max_connections", "max_qos", "mount_point",
        "protocol", "socket_domain", "require_certificate", "use_identity_as_username",
        "use_subject_as_username", "use_username_as_clientid",
    }
)  # fmt: skip
# ... and these, when they belong to the default listener (per_listener_settings true).
DEFAULT_LISTENER_SECURITY = frozenset({"password_file", "psk_file", *PLUGIN_KEYS})
LOCAL_ONLY_PORT = 1883


class LayoutError(ConfError):
    """mosquitto would refuse the configuration, or the installer cannot keep it as it is."""


def is_security(directive: Directive) -> bool:
    """A setting that per_listener_settings makes per listener (and that must follow it)."""
    return directive.key in SECURITY_KEYS or directive.key.startswith(PLUGIN_OPTION_PREFIXES)


def _bool(directive: Directive) -> bool:
    word = directive.value.split(" ")[0]
    if word not in ("true", "false"):
        raise LayoutError(f"{directive.path}:{directive.index + 1}: {directive.key} {word}?")
    return word == "true"


@dataclass(frozen=True)
class Security:
    """A listener's (or the broker's) security settings; None: not set."""

    allow_anonymous: bool | None = None
    allow_zero_length_clientid: bool | None = None
    password_file: str | None = None
    acl_file: str | None = None
    psk_file: str | None = None
    auto_id_prefix: str | None = None
    plugins: tuple[str, ...] = ()  # each plugin line with its options, in order

    def with_(self, directive: Directive) -> Security:
        """This security with one more directive; a second password_file (or acl_file, ...)
        for the same listener is mosquitto's "Duplicate ... value" error."""
        key = directive.key
        change: dict[str, Any] = {}
        if key in SECURITY_BOOLS:
            change[key] = _bool(directive)
        elif key in SECURITY_STRINGS:
            if getattr(self, key) is not None:
                raise LayoutError(
                    f"{directive.path}:{directive.index + 1}: a second {key} for the same "
                    "listener (mosquitto: Duplicate value in configuration)"
                )
            change[key] = directive.value
        if change:
            return replace(self, **change)
        if key in PLUGIN_KEYS:
            return replace(self, plugins=(*self.plugins, directive.value))
        if key.startswith(PLUGIN_OPTION_PREFIXES) and self.plugins:
            last = f"{self.plugins[-1]} {key} {directive.value}"
            return replace(self, plugins=(*self.plugins[:-1], last))
        return self

    def anonymous(self, local_only: bool = False) -> bool:
        """Whether clients without a user name are let in (mosquitto 2: unset means no)."""
        return True if local_only else bool(self.allow_anonymous)


@dataclass(frozen=True)
class Listener:
    """One listener as mosquitto opens it, with the security that applies to its clients."""

    port: int
    host: str | None  # None: every address
    security: Security
    anonymous: bool
    tls: bool = False
    protocol: str = "mqtt"
    mount_point: str | None = None
    origin: str = ""  # where it comes from, for people

    @property
    def endpoint(self) -> tuple[int, str | None]:
        return (self.port, self.host)

    def same_access(self, other: Listener) -> bool:
        """Whether a client gets exactly the same from both (what it may connect as and
        reach)."""
        return (
            self.endpoint == other.endpoint
            and self.anonymous == other.anonymous
            and replace(self.security, allow_anonymous=None)
            == replace(other.security, allow_anonymous=None)
            and (self.tls, self.protocol, self.mount_point)
            == (other.tls, other.protocol, other.mount_point)
        )


@dataclass(frozen=True)
class Broker:
    """Every listener mosquitto would open for a configuration."""

    per_listener_settings: bool
    local_only: bool
    listeners: tuple[Listener, ...]
    broker_wide: Security = field(default_factory=Security)
    default_listener: bool = False  # created by settings before any `listener` line
    configured: bool = True  # False: there is no configuration (mosquitto cannot start)
    unused: bool = False  # local only mode of a mosquitto the installer installed: no clients


def _listener_options(directives: Iterable[Directive]) -> dict[str, str]:
    return {d.key: d.value for d in directives if d.key in DEFAULT_LISTENER_KEYS}


def _check_order(directives: Sequence[Directive]) -> None:
    """mosquitto refuses ``per_listener_settings true`` after any security setting."""
    seen: Directive | None = None
    for directive in directives:
        if directive.key == "per_listener_settings" and _bool(directive) and seen is not None:
            raise LayoutError(
                f"{directive.path}:{directive.index + 1}: per_listener_settings true after "
                f"{seen.key} ({seen.path}:{seen.index + 1}); mosquitto refuses to start"
            )
        if is_security(directive) or directive.key == "check_retain_source":
            seen = seen or directive


def _declared(
    contexts: dict[tuple[str, int | None], list[Directive]],
    security: Callable[[Iterable[Directive]], Security],
) -> list[Listener]:
    """The listeners of `listener` lines; ``security(members)`` gives each its settings."""
    listeners = []
    for (path, number), members in contexts.items():
        if number is None:
            continue
        port_text, _, rest = members[0].value.partition(" ")
        host: str | None = rest.strip()
        if not host or host.startswith("#"):
            host = None
        options = _listener_options(members)
        applied = security(members)
        listeners.append(
            Listener(
                port=int(port_text),
                host=host,
                security=applied,
                anonymous=applied.anonymous(),
                tls="certfile" in options or "psk_hint" in options,
                protocol=options.get("protocol", "mqtt"),
                mount_point=options.get("mount_point"),
                origin=f"in {path}",
            )
        )
    return listeners


def _default(before_any: list[Directive], applied: Security, per_listener: bool) -> Listener | None:
    """The default listener, if settings before any `listener` line create it."""
    options = _listener_options(before_any)
    triggers = set(options)
    if per_listener:
        triggers |= {d.key for d in before_any if d.key in DEFAULT_LISTENER_SECURITY}
        if applied.allow_zero_length_clientid is False:
            triggers.add("allow_zero_length_clientid")
    if not triggers:
        return None
    return Listener(
        port=int(options.get("port", LOCAL_ONLY_PORT)),
        host=options.get("bind_address"),
        security=applied,
        anonymous=applied.anonymous(),
        tls="certfile" in options,
        protocol=options.get("protocol", "mqtt"),
        mount_point=options.get("mount_point"),
        origin="default listener: " + ", ".join(sorted(triggers)),
    )


def model(directives: Sequence[Directive], *, ipv6: bool, configured: bool = True) -> Broker:
    """The listeners and their security, as mosquitto 2.0 would set them up."""
    if not configured:
        return Broker(per_listener_settings=False, local_only=False, listeners=(), configured=False)
    _check_order(directives)
    per_listener = False
    for directive in directives:
        if directive.key == "per_listener_settings":
            per_listener = _bool(directive)
    contexts: dict[tuple[str, int | None], list[Directive]] = {}
    for directive in directives:
        if not directive.lost:
            contexts.setdefault(directive.context, []).append(directive)
    broker_wide = Security()
    if not per_listener:
        broker_wide = fold(directives)

    def security_of(members: Iterable[Directive]) -> Security:
        return fold(members) if per_listener else broker_wide

    listeners = _declared(contexts, security_of)
    before_any = [d for d in directives if d.listener is None]
    default = _default(before_any, security_of(before_any), per_listener)
    if default is not None:
        listeners.insert(0, default)
    local_only = not any(d.key in ("listener", "port", "bind_address") for d in directives)
    if local_only and not listeners:
        security = broker_wide if not per_listener else Security(allow_anonymous=True)
        hosts = ["127.0.0.1", "::1"] if ipv6 else ["127.0.0.1"]
        origin = "local only mode: no listener configured"
        listeners = [Listener(LOCAL_ONLY_PORT, h, security, True, origin=origin) for h in hosts]
    return Broker(per_listener, local_only, tuple(listeners), broker_wide, default is not None)


def fold(directives: Iterable[Directive]) -> Security:
    """The security settings of ``directives``, one after the other."""
    security = Security()
    for directive in directives:
        if is_security(directive):
            security = security.with_(directive)
    return security
