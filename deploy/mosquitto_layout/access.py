"""Who can connect to each listener, and which topics each client reaches, for people.

Read from the listener's security and the files it names, the way mosquitto 2.0's default
security checks them (src/security_default.c): without a password_file any user name is let
in and no password is checked; without an acl_file every client reaches every topic, $SYS
included; with one, a client reaches what its own lines (anonymous clients: the lines before
the first ``user``) and the ``pattern`` lines give, and a rule only reaches ``$SYS`` topics if
it starts with ``$`` itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mosquitto_layout.model import Broker, Listener

__all__ = ["Acl", "Files", "describe", "parse_acl", "reads", "table"]

SYS_PROBE = "$SYS/broker/uptime"
Rule = tuple[str, str]  # (access, topic filter): access read, write, readwrite or deny


@dataclass(frozen=True)
class Acl:
    anonymous: tuple[Rule, ...]
    users: dict[str, tuple[Rule, ...]]
    patterns: tuple[Rule, ...]

    def rules(self, user: str | None) -> tuple[Rule, ...]:
        own = self.anonymous if user is None else self.users.get(user, ())
        patterns = tuple(
            (access, topic.replace("%u", user) if user is not None else topic)
            for access, topic in self.patterns
            if user is not None or "%u" not in topic
        )
        return own + patterns


def parse_acl(text: str) -> Acl:
    """An acl_file, as mosquitto reads it (``topic [read|write|readwrite|deny] filter``)."""
    anonymous: list[Rule] = []
    users: dict[str, list[Rule]] = {}
    patterns: list[Rule] = []
    user: str | None = None
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line or line[0] == "#":
            continue
        word, _, rest = line.strip(" ").partition(" ")
        if word == "user":
            user = rest.strip()
            users.setdefault(user, [])
        elif word in ("topic", "pattern"):
            access, _, topic = rest.strip(" ").partition(" ")
            rule = (access, topic.strip()) if topic.strip() else ("readwrite", access)
            if word == "pattern":
                patterns.append(rule)
            elif user is None:
                anonymous.append(rule)
            else:
                users[user].append(rule)
    return Acl(tuple(anonymous), {k: tuple(v) for k, v in users.items()}, tuple(patterns))


def _matches(topic_filter: str, topic: str) -> bool:
    if topic.startswith("$") and not topic_filter.startswith("$"):
        return False
    parts, levels = topic_filter.split("/"), topic.split("/")
    for at, part in enumerate(parts):
        if part == "#":
            return True
        if at >= len(levels) or part not in ("+", levels[at]):
            return False
    return len(parts) == len(levels)


def reads(rules: tuple[Rule, ...], topic: str) -> bool:
    """Whether ``rules`` let a client receive ``topic`` (a matching deny wins)."""
    matching = [access for access, f in rules if "%c" not in f and _matches(f, topic)]
    return "deny" not in matching and any(a in ("read", "readwrite") for a in matching)


@dataclass(frozen=True)
class Files:
    """The broker's files: from ``root``, or ``pending`` for those not written yet."""

    root: Path
    pending: Mapping[str, str]

    def read(self, path: str) -> str | None:
        if path in self.pending:
            return self.pending[path]
        try:
            return (self.root / path.lstrip("/")).read_text(encoding="utf-8")
        except OSError:
            return None


def _topics(files: Files, listener: Listener, user: str | None) -> str:
    acl_file = listener.security.acl_file
    if acl_file is None:
        return "all topics, $SYS included"
    text = files.read(acl_file)
    if text is None:
        return f"as {acl_file} says (not readable here)"
    rules = parse_acl(text).rules(user)
    if not rules:
        return "no topic"
    shown = ", ".join(f"{access} {topic}" for access, topic in rules)
    sys = "$SYS readable" if reads(rules, SYS_PROBE) else "$SYS not readable"
    return f"{shown} ({sys})"


def describe(files: Files, listener: Listener) -> list[tuple[str, str]]:
    """(who, what they get) for one listener."""
    security = listener.security
    if security.plugins:
        return [("every client", "as its plugin decides: " + "; ".join(security.plugins))]
    rows = [
        (
            "anonymous clients",
            _topics(files, listener, None) if listener.anonymous else "refused",
        )
    ]
    if security.password_file is not None:
        text = files.read(security.password_file)
        if text is None:
            rows.append((f"users of {security.password_file}", "(not readable here)"))
        else:
            names = sorted({line.split(":")[0] for line in text.splitlines() if ":" in line})
            rows += [(f"user {name}, password checked", _topics(files, listener, name))
                     for name in names]  # fmt: skip
        rows.append(("any other user name", "refused"))
        return rows
    acl_users: list[str] = []
    if security.acl_file is not None:
        acl_users = sorted(parse_acl(files.read(security.acl_file) or "").users)
    rows += [(f"user {name}, password not checked", _topics(files, listener, name))
             for name in acl_users]  # fmt: skip
    other = "any other user name" if acl_users else "any user name"
    rows.append((f"{other}, password not checked", _topics(files, listener, "%u")))
    return rows


def _label(listener: Listener) -> str:
    host = listener.host or "every address"
    host = f"[{host}]" if ":" in host else host
    extras = [e for e in ("TLS" if listener.tls else "", listener.protocol) if e and e != "mqtt"]
    if listener.mount_point:
        extras.append(f"mount_point {listener.mount_point}")
    suffix = f" ({', '.join(extras)})" if extras else ""
    return f"{host}:{listener.port}{suffix} ({listener.origin})"


def table(
    files: Files, broker: Broker, ours: frozenset[tuple[int, str | None]] = frozenset()
) -> list[str]:
    """The who-can-connect lines of a broker, one block per listener."""
    if not broker.configured:
        return ["  nobody: there is no mosquitto configuration (mosquitto does not start)"]
    if broker.unused:
        return ["  nobody: mosquitto was installed by deploy/install.sh, for the gateway alone"]
    lines: list[str] = []
    for listener in sorted(broker.listeners, key=lambda item: (item.port, item.host or "")):
        mark = " [tesla-gateway]" if listener.endpoint in ours else ""
        lines.append(f"  listener {_label(listener)}{mark}")
        rows = describe(files, listener)
        width = max(len(who) for who, _ in rows)
        lines += [f"    {who.ljust(width)}  {what}" for who, what in rows]
    return lines
