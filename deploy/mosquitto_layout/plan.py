"""The gateway's listeners on a broker that may serve others, and the edits that keep those others
exactly where they were.

The gateway needs its own password file and ACL without touching anyone else's: only
``per_listener_settings true`` allows that, and it changes what the broker-wide settings mean
(each then belongs to the listener context it stands in). So the plan:

- writes ``per_listener_settings true`` where mosquitto reads it before any security setting
  (the installer's conf.d file, whose name sorts first; else a block at the top of the main file);
- gives every listener of the operator's, in a marked block at the end of its context, the
  broker-wide settings it lacks there, and comments out (marked) the broker-wide settings that
  would otherwise land on the default listener, and any ``per_listener_settings`` line;
- spells out mosquitto's local only mode (no listener configured) as the loopback listeners it
  opens, anonymous clients allowed, since any listener of the gateway's would end that mode;
- adds the gateway's loopback and TLS listeners on ports no other listener uses.

Then it models the result and refuses (LayoutError) unless every listener of before is still
there with the same security, so a plan that would change what a client gets is never applied.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path

from mosquitto_layout.conf import BLOCK_BEGIN, BLOCK_END, MOVED, Directive, Tree, restored
from mosquitto_layout.model import Broker, LayoutError, Security, fold, is_security, model

__all__ = ["GatewayFiles", "Plan", "legacy_edits", "make_plan", "restore_edits"]

OWN_CONF = "00-tesla-gateway.conf"  # sorts first in conf.d
OLD_OWN_CONFS = ("tesla-gateway.conf",)  # the name earlier installers used
ORDER_SENSITIVE = ("per_listener_settings", "check_retain_source")


@dataclass(frozen=True)
class GatewayFiles:
    """Where the gateway's own password file, ACL and TLS files are (paths on the broker)."""

    passwd: str
    acl: str
    ca: str
    cert: str
    key: str


@dataclass(frozen=True)
class Plan:
    own_path: str
    own_text: str
    texts: dict[str, str]  # every file of the operator's that mosquitto reads, as planned
    edits: dict[str, str]  # those that change: path -> new text
    plain_port: int
    tls_port: int
    before: Broker
    after: Broker
    ours: frozenset[tuple[int, str | None]]


def _line(name: str, value: object) -> str:
    return (
        f"{name} {'true' if value else 'false'}" if isinstance(value, bool) else f"{name} {value}"
    )


def _security_lines(security: Security) -> list[str]:
    """The settings of ``security`` as configuration lines (plugins excepted)."""
    values = ((item.name, getattr(security, item.name)) for item in fields(Security))
    return [_line(name, value) for name, value in values if isinstance(value, bool | str)]


def _missing(wanted: Security, have: Security) -> list[str]:
    """The lines that turn a context's own settings ``have`` into the broker-wide ``wanted``."""
    lines = []
    for item in fields(Security):
        want, got = getattr(wanted, item.name), getattr(have, item.name)
        if item.name != "plugins" and want is not None and want != got:
            lines.append(_line(item.name, want))
    return lines


def _block(why: str, lines: Sequence[str]) -> list[str]:
    return [
        f"{BLOCK_BEGIN} (deploy/install.sh): {why}\n",
        *(f"{x}\n" for x in lines),
        f"{BLOCK_END}\n",
    ]


@dataclass
class _Edits:
    """Marks to apply to the operator's files: lines to comment out, blocks to insert."""

    texts: dict[str, list[str]]
    moved: set[tuple[str, int]]
    inserts: dict[tuple[str, int], list[str]]

    def insert(self, path: str, before: int, block: list[str]) -> None:
        self.inserts.setdefault((path, before), []).extend(block)

    def text(self, path: str) -> str:
        lines = list(self.texts[path])
        if lines and not lines[-1].endswith("\n") and (path, len(lines)) in self.inserts:
            lines[-1] += "\n"
        out: list[str] = []
        for index in range(len(lines) + 1):
            out += self.inserts.get((path, index), [])
            if index < len(lines):
                moved = (path, index) in self.moved
                out.append(MOVED + lines[index] if moved else lines[index])
        return "".join(out)


def _end_of_context(directives: Sequence[Directive], path: str, number: int, size: int) -> int:
    """The line before which a setting still belongs to listener ``number`` of ``path``: the
    next `listener` line, or an `include_dir` line (mosquitto 2.0 keeps a pointer into its
    listener array across the included files, which may move that array when they add
    listeners: a setting after include_dir can land nowhere), or the end of the file."""
    start = _listener_line(directives, path, number)
    ends = [
        d.index
        for d in directives
        if d.path == path and d.key in ("listener", "include_dir") and d.index > start
    ]
    return min(ends, default=size)


def _listener_line(directives: Sequence[Directive], path: str, number: int) -> int:
    return next(
        d.index
        for d in directives
        if d.path == path and d.key == "listener" and d.listener == number
    )


def _translate(
    tree: Tree, directives: Sequence[Directive], before: Broker
) -> tuple[_Edits, list[str]]:
    """Marks that keep each of the operator's listeners on the settings it had, and the lines
    the installer's file must hold before its own listeners for the default listener."""
    edits = _Edits(
        texts={p: (tree.text(p) or "").splitlines(keepends=True) for p in tree.files()},
        moved={(d.path, d.index) for d in directives if d.key == "per_listener_settings"},
        inserts={},
    )
    if before.per_listener_settings:
        return edits, []
    wide = before.broker_wide
    if wide.plugins:
        raise LayoutError(
            "the broker-wide plugin settings ("
            + "; ".join(wide.plugins)
            + ") would have to be repeated per listener: the installer does not do that. "
            "Use --broker remote, or set per_listener_settings true yourself and rerun"
        )
    contexts: dict[tuple[str, int | None], list[Directive]] = {}
    for directive in directives:
        if directive.lost:  # broker-wide now, but on no listener once per listener
            if is_security(directive):
                edits.moved.add((directive.path, directive.index))
            continue
        contexts.setdefault(directive.context, []).append(directive)
    why = "per_listener_settings true: this listener keeps the broker-wide settings it had"
    for (path, number), members in contexts.items():
        if number is None:
            if not before.default_listener:  # they would land on a default listener, or make one
                edits.moved |= {(d.path, d.index) for d in members if is_security(d)}
            continue
        lines = _missing(wide, fold(members))
        if lines:
            end = _end_of_context(directives, path, number, len(edits.texts[path]))
            edits.insert(path, end, _block(why, lines))
    default_lines: list[str] = []
    if before.default_listener:
        default_lines = _missing(wide, fold(d for d in directives if d.listener is None))
    return edits, default_lines


def _local_only_lines(before: Broker) -> list[str]:
    """mosquitto's local only mode, spelled out (any listener of the gateway's would end it)."""
    if not before.listeners or not before.local_only:
        return []
    lines = [
        "",
        "# Before the gateway this broker had no listener of its own: mosquitto's local only",
        "# mode, anonymous clients allowed on the loopback addresses. Kept as it was.",
    ]
    for listener in before.listeners:
        security = listener.security if not before.per_listener_settings else Security()
        lines += [f"listener {listener.port} {listener.host}"]
        lines += _security_lines(replace(security, allow_anonymous=True))
    return lines


def _free(used: set[int], start: int) -> int:
    port = start
    while port in used:
        port += 1
    return port


def _own_text(
    files: GatewayFiles,
    *,
    flag: bool,
    fresh: bool,
    unset: set[str],
    default_lines: list[str],
    local: list[str],
    plain: int,
    tls: int,
) -> str:
    lines = [
        "# Generated by deploy/install.sh (tesla-gateway): rerun it instead of editing this file.",
        '# mosquitto reads it first (its name sorts first); docs/deployment.md, "A broker',
        "# already in use\". Each listener has its own settings: the gateway's do not touch",
        "# what the other listeners' clients may do.",
    ]
    if flag:
        lines.append("per_listener_settings true")
    tuning = {"set_tcp_nodelay": "true", "max_queued_messages": "100000"}
    lines += [f"{key} {value}" for key, value in tuning.items() if key in unset]
    if "max_inflight_messages" in unset:
        lines += [
            "# Also the MQTT 5 Receive Maximum announced to clients: the gateway keeps up to",
            "# publisher.in_flight (256) calibrated messages awaiting PUBACK; mosquitto's default",
            "# 20 throttles per-sensor topics at thousands of sensors.",
            "max_inflight_messages 1000",
        ]
    if fresh:
        lines += [
            "# Bounded input (no other client uses this broker): no MQTT packet above 1 MiB.",
            "max_packet_size 1048576",
        ]
    if default_lines:
        lines += ["# The default listener keeps the broker-wide settings it had.", *default_lines]
    lines += local
    auth = ["allow_anonymous false", f"password_file {files.passwd}", f"acl_file {files.acl}"]
    lines += [
        "",
        "# The gateway on this machine: loopback only, authenticated.",
        f"listener {plain} 127.0.0.1",
        *auth,
        "",
        "# Sensor nodes, subscribers and the release key holder: TLS, authenticated.",
        f"listener {tls}",
        *auth,
        f"cafile {files.ca}",
        f"certfile {files.cert}",
        f"keyfile {files.key}",
        "tls_version tlsv1.2",
    ]
    return "\n".join(lines) + "\n"


def _check(before: Broker, after: Broker, ours: frozenset[tuple[int, str | None]]) -> None:
    if not after.per_listener_settings:
        raise LayoutError("the plan would leave per_listener_settings false")
    found = {listener.endpoint: listener for listener in after.listeners}
    for listener in before.listeners:
        kept = found.get(listener.endpoint)
        if kept is None or not listener.same_access(kept):
            raise LayoutError(
                f"the plan would change listener {listener.port} ({listener.origin}): "
                "configure per_listener_settings true yourself, or use --broker remote"
            )
    extra = set(found) - {listener.endpoint for listener in before.listeners} - ours
    if extra or not ours <= set(found):
        raise LayoutError(f"the plan would open unexpected listeners: {sorted(map(str, extra))}")
    for endpoint in ours:
        if found[endpoint].anonymous or found[endpoint].security.acl_file is None:
            raise LayoutError(f"the gateway's listener {endpoint[0]} would not be protected")


def make_plan(
    root: Path,
    files: GatewayFiles,
    *,
    ipv6: bool,
    owned: bool = False,
    conf_dir: str = "/etc/mosquitto/conf.d",
    main: str = "/etc/mosquitto/mosquitto.conf",
) -> Plan:
    """The plan for the configuration under ``root``. ``owned``: the installer installed
    mosquitto itself, so its local only mode served nobody and is not kept (the gateway's
    loopback listener takes port 1883); listeners configured since are kept all the same."""
    own_path = f"{conf_dir}/{OWN_CONF}"
    hidden = frozenset({own_path, *(f"{conf_dir}/{name}" for name in OLD_OWN_CONFS)})
    tree = Tree(root, main, hidden=hidden)
    fresh = tree.text(main) is None
    if not fresh and conf_dir not in [d.rstrip("/") for d in tree.include_dirs()]:
        raise LayoutError(f"{main} has no 'include_dir {conf_dir}': add it, then rerun")
    directives = tree.directives()
    before = model(directives, ipv6=ipv6, configured=not fresh)
    if owned and before.local_only:
        before = replace(before, listeners=(), unused=True)
    edits, default_lines = _translate(tree, directives, before)
    used = {listener.port for listener in before.listeners}
    plain = _free(used, 1883)
    tls = _free(used | {plain}, 8883)
    ours = frozenset({(plain, "127.0.0.1"), (tls, None)})
    unset = {"set_tcp_nodelay", "max_queued_messages", "max_inflight_messages"}
    unset -= {d.key for d in directives}
    local = _local_only_lines(before)

    def attempt(flag_here: bool) -> tuple[dict[str, str], str, Tree]:
        own = _own_text(
            files,
            flag=flag_here,
            fresh=fresh or before.unused,
            unset=unset,
            default_lines=default_lines,
            local=local,
            plain=plain,
            tls=tls,
        )
        if not flag_here:
            first = "first, before any security setting (docs/deployment.md)"
            edits.insert(main, 0, _block(first, ["per_listener_settings true"]))
        texts = {path: edits.text(path) for path in edits.texts}
        planned = {**texts, own_path: own}
        if fresh:  # as Debian's mosquitto.conf will, once apt-get installs it
            planned[main] = f"include_dir {conf_dir}\n"
        return texts, own, Tree(root, main, texts=planned, hidden=hidden - {own_path})

    texts, own, after_tree = attempt(flag_here=True)
    order = after_tree.directives()
    first_own = next(i for i, d in enumerate(order) if d.path == own_path)
    if any(is_security(d) or d.key in ORDER_SENSITIVE for d in order[:first_own]):
        texts, own, after_tree = attempt(flag_here=False)  # something is read before our file
    planned = after_tree.directives()
    was_lost = {(d.path, d.index) for d in directives if d.lost}
    for directive in planned:
        if directive.lost and (directive.path, directive.index) not in was_lost:
            raise LayoutError(
                f"{directive.path}:{directive.index + 1}: {directive.key} belongs to a listener "
                "above an include_dir line; once the gateway's listeners are in conf.d mosquitto "
                "would lose it. Move it above include_dir (next to its listener) and rerun"
            )
    after = model(planned, ipv6=ipv6)
    _check(before, after, ours)
    changed = {p: t for p, t in texts.items() if t != _raw(tree, p)}
    return Plan(own_path, own, texts, changed, plain, tls, before, after, ours)


def _raw(tree: Tree, path: str) -> str | None:
    try:
        return tree.disk(path).read_text(encoding="utf-8")
    except OSError:
        return None


def restore_edits(
    root: Path,
    *,
    conf_dir: str = "/etc/mosquitto/conf.d",
    main: str = "/etc/mosquitto/mosquitto.conf",
) -> dict[str, str]:
    """The files mosquitto reads as they were before the installer: its marks taken out."""
    hidden = frozenset(f"{conf_dir}/{name}" for name in (OWN_CONF, *OLD_OWN_CONFS))
    tree = Tree(root, main, hidden=hidden)
    result: dict[str, str] = {}
    for path in tree.files():
        raw = _raw(tree, path)
        if raw is not None and restored(raw) != raw:
            result[path] = restored(raw)
    return result


def legacy_edits(
    root: Path, *, users: Iterable[str], legacy: Iterable[tuple[str, str]]
) -> dict[str, str]:
    """What the installer put into files of the operator's, taken out again: the gateway's
    users from a password_file and its block from an acl_file (earlier installers), its marks
    from an ``edited`` file (``legacy``: the (kind, path) lines of
    /etc/tesla-gateway/mqtt-shared)."""
    tree = Tree(root)
    ours = set(users)
    result: dict[str, str] = {}
    for kind, path in legacy:
        raw = _raw(tree, path)
        if raw is None:
            continue
        if kind == "password_file":
            lines = raw.splitlines(keepends=True)
            new = "".join(line for line in lines if line.split(":")[0] not in ours)
        elif kind in ("acl_file", "edited"):
            new = restored(raw)
        else:
            continue
        if new != raw:
            result[path] = new
    return result
