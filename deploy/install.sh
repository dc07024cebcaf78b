#!/usr/bin/env bash
# Install tesla-gateway on Raspberry Pi OS (Debian bookworm, arm64 or armhf). Idempotent: a second
# run with the same inputs changes nothing (files are replaced only when their content differs,
# users, passwords and certificates are created only when missing).
#
#   sudo deploy/install.sh [--gateway-id ID] [--node ID]... [--broker local|remote]
#                          [--broker-host NAME] [--broker-port N] [--broker-user NAME]
#                          [--broker-ca FILE] [--root DIR] [--dry-run] [--arch arm64|armhf|amd64]
#                          [--wheelhouse DIR] [--pip-args ARGS]
#
# --gateway-id ID  default: the host name. Gateways that share a broker need different ids
#              (their MQTT client ids derive from it); Raspberry Pi OS's default host name
#              "raspberrypi" gets a warning.
# --broker local   (default) the gateway gets its own listeners on this machine's mosquitto,
#              with their own users and ACL; every client the broker served keeps exactly what
#              it had (docs/deployment.md, "A broker already in use")
# --broker remote  use an existing broker elsewhere (Home Assistant OS's Mosquitto add-on):
#              installs the gateway only, no mosquitto configuration at all
# --broker-host NAME  local: the name clients reach this broker by (the TLS certificate's);
#              remote: the broker to connect to (required)
# --broker-port N, --broker-user NAME, --broker-ca FILE  remote only: port (1883, or 8883
#              with --broker-ca), user name (tesla-gateway) and the CA that signed the broker's
#              certificate (TLS); the password goes into
#              /etc/tesla-gateway/credentials/tesla-gateway
# --node ID    a sensor node allowed to publish sensors/ID/raw (repeatable; kept across runs
#              in /etc/tesla-gateway/mqtt-nodes; local broker only)
# --root DIR   install into DIR instead of / (a throwaway tree: no apt, no systemctl; the
#              users are created in DIR/etc with useradd --root)
# --dry-run    print what would be done (and who can connect to mosquitto, before and after),
#              change nothing
# --wheelhouse DIR  install the gateway from the wheels in DIR (offline installs; with
#              --pip-args "--no-index" pip never touches the network)
# --pip-args   extra arguments for pip (e.g. "--no-index")
#
# Layout (docs/deployment.md): /opt/tesla-gateway/{venv,models,docs}, /etc/tesla-gateway,
# /var/lib/tesla-gateway, /etc/systemd/system/tesla-gateway.service, /etc/mosquitto/conf.d/
# 00-tesla-gateway.conf with its password file, ACL and TLS certificates under /etc/mosquitto.
set -euo pipefail
trap 'echo "install.sh: failed (exit $?) at line $LINENO: $BASH_COMMAND" >&2' ERR

SOURCE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROOT="/"
DRY_RUN=0
ARCH=""
PIP_ARGS=""
WHEELHOUSE=""
GATEWAY_ID="$(hostname -s 2>/dev/null || echo gateway)"
GATEWAY_ID_GIVEN=0
BROKER="local"
BROKER_HOST=""
BROKER_PORT=""
BROKER_USER=""
BROKER_CA=""
NODES=()

SERVICE_USER="tesla-gateway"
PREFIX="/opt/tesla-gateway"
CONF_DIR="/etc/tesla-gateway"
STATE_DIR="/var/lib/tesla-gateway"
MOSQ_DIR="/etc/mosquitto"
MQTT_GATEWAY_USER="tesla-gateway"
MQTT_READER_USER="tesla-reader"
MQTT_RELEASE_USER="tesla-release"

usage() {  # the comment block at the top of this file
    awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit "${1:-0}"
}

while [[ $# -gt 0 ]]; do
    case "$1" in
        --root) ROOT="$2"; shift 2 ;;
        --dry-run) DRY_RUN=1; shift ;;
        --arch) ARCH="$2"; shift 2 ;;
        --pip-args) PIP_ARGS="$2"; shift 2 ;;
        --wheelhouse) WHEELHOUSE="$2"; shift 2 ;;
        --gateway-id) GATEWAY_ID="$2"; GATEWAY_ID_GIVEN=1; shift 2 ;;
        --broker) BROKER="$2"; shift 2 ;;
        --broker-host) BROKER_HOST="$2"; shift 2 ;;
        --broker-port) BROKER_PORT="$2"; shift 2 ;;
        --broker-user) BROKER_USER="$2"; shift 2 ;;
        --broker-ca) BROKER_CA="$2"; shift 2 ;;
        --node) NODES+=("$2"); shift 2 ;;
        -h|--help) usage 0 ;;
        *) echo "install.sh: unknown argument $1" >&2; usage 2 ;;
    esac
done

ID_PATTERN='^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$'
[[ "$GATEWAY_ID" =~ $ID_PATTERN ]] || { echo "install.sh: bad --gateway-id $GATEWAY_ID" >&2; exit 2; }
if [[ $GATEWAY_ID_GIVEN -eq 0 && "$GATEWAY_ID" == "raspberrypi" ]]; then
    echo "install.sh: warning: gateway_id is the host name \"raspberrypi\", Raspberry Pi OS's" \
        "default: gateways that share a broker with the same id take each other's MQTT" \
        "sessions over. Give each its own (--gateway-id, or a host name of its own)." >&2
fi
for node in "${NODES[@]+"${NODES[@]}"}"; do
    [[ "$node" =~ $ID_PATTERN ]] || { echo "install.sh: bad --node $node" >&2; exit 2; }
done
case "$BROKER" in
    local)
        if [[ -n "$BROKER_PORT$BROKER_USER$BROKER_CA" ]]; then
            echo "install.sh: --broker-port, --broker-user and --broker-ca are for" \
                "--broker remote" >&2
            exit 2
        fi
        [[ -n "$BROKER_HOST" ]] || BROKER_HOST="$(hostname -f 2>/dev/null || hostname)" ;;
    remote)
        if [[ -z "$BROKER_HOST" ]]; then
            echo "install.sh: --broker remote needs --broker-host" >&2; exit 2
        fi
        if [[ -n "$BROKER_CA" && ! -r "$BROKER_CA" ]]; then
            echo "install.sh: cannot read --broker-ca $BROKER_CA" >&2; exit 2
        fi
        [[ -n "$BROKER_PORT" ]] || BROKER_PORT="$([[ -n "$BROKER_CA" ]] && echo 8883 || echo 1883)"
        [[ -n "$BROKER_USER" ]] || BROKER_USER="tesla-gateway"
        [[ "$BROKER_PORT" =~ ^[0-9]{1,5}$ && "$BROKER_PORT" -ge 1 && "$BROKER_PORT" -le 65535 ]] \
            || { echo "install.sh: bad --broker-port $BROKER_PORT" >&2; exit 2; }
        [[ "$BROKER_USER" =~ $ID_PATTERN ]] || { echo "install.sh: bad --broker-user" >&2; exit 2; }
        if [[ ${#NODES[@]} -gt 0 ]]; then
            echo "install.sh: warning: --node is ignored with --broker remote: the remote" \
                "broker's users and access rules are its own" >&2
            NODES=()
        fi ;;
    *) echo "install.sh: --broker is local or remote, not $BROKER" >&2; exit 2 ;;
esac
[[ "$BROKER_HOST" =~ ^[A-Za-z0-9.:-]+$ ]] || { echo "install.sh: bad --broker-host" >&2; exit 2; }
ROOT="${ROOT%/}"
[[ -n "$ROOT" ]] && ROOT="$(realpath -m "$ROOT")"
R="${ROOT}"  # prefix for every target path; empty for a real install into /
[[ -z "$ARCH" ]] && ARCH="$(dpkg --print-architecture 2>/dev/null || uname -m)"
case "$ARCH" in
    arm64|aarch64|amd64|x86_64) EXTRA="" ;;
    armhf|armv7l|armv6l) EXTRA="[legacy-runtime]" ;;  # ai-edge-litert has no 32-bit ARM wheels
    *) echo "install.sh: unsupported architecture $ARCH (arm64, armhf, amd64)" >&2; exit 2 ;;
esac
[[ $EUID -eq 0 || $DRY_RUN -eq 1 ]] || { echo "install.sh: run as root (or --dry-run)" >&2; exit 1; }

CHANGED=0
say() { echo "install.sh: $*"; }
act() {  # run a command, or only show it with --dry-run
    CHANGED=$((CHANGED + 1))
    if [[ $DRY_RUN -eq 1 ]]; then echo "would: $*"; else "$@"; fi
}

# Numeric ids from the target root's own /etc/passwd and /etc/group (not the host's).
uid_of() { [[ -r "$R/etc/passwd" ]] || return 0; awk -F: -v n="$1" '$1 == n { print $3 }' "$R/etc/passwd"; }
gid_of() { [[ -r "$R/etc/group" ]] || return 0; awk -F: -v n="$1" '$1 == n { print $3 }' "$R/etc/group"; }
if [[ ! -r "$R/etc/passwd" || ! -r "$R/etc/group" ]]; then
    if [[ $DRY_RUN -eq 0 ]]; then
        echo "install.sh: $ROOT/etc/passwd or /etc/group is missing: --root needs a target with" \
            "a Debian /etc (passwd, group, shadow, gshadow) to create the service user in" >&2
        exit 1
    fi
    say "note: $ROOT/etc has no passwd/group: users and ownership are shown, not resolved"
fi

ensure_dir() {  # ensure_dir PATH MODE OWNER GROUP
    local path="$R$1"
    if [[ ! -d "$path" ]]; then act install -d -m "$2" "$path"; fi
    ensure_meta "$1" "$2" "$3" "$4"
}

ensure_meta() {  # ensure_meta PATH MODE OWNER GROUP  (mode and numeric ownership)
    local path="$R$1" uid gid
    uid="$(uid_of "$3")"; gid="$(gid_of "$4")"
    if [[ $DRY_RUN -eq 1 && ! -e "$path" ]]; then return; fi
    if [[ -z "$uid" || -z "$gid" ]]; then
        if [[ $DRY_RUN -eq 1 ]]; then echo "would: chown $3:$4 $1"; return; fi
        echo "install.sh: no user $3 or group $4 in $R/etc" >&2; exit 1
    fi
    [[ "$(stat -c %a "$path")" == "${2#0}" ]] || act chmod "$2" "$path"
    [[ "$(stat -c %u:%g "$path")" == "$uid:$gid" ]] || act chown "$uid:$gid" "$path"
}

ensure_file() {  # ensure_file SOURCE TARGET MODE OWNER GROUP: copy only if the content differs
    local target="$R$2"
    if ! cmp -s "$1" "$target"; then act install -m "$3" "$1" "$target"; fi
    ensure_meta "$2" "$3" "$4" "$5"
}

ensure_content() {  # ensure_content TARGET MODE OWNER GROUP < content
    local temp
    temp="$(mktemp)"
    cat > "$temp"
    if [[ $DRY_RUN -eq 1 ]] && ! cmp -s "$temp" "$R$1"; then
        preview "$temp" "$1"
        CHANGED=$((CHANGED + 1))
        ensure_meta "$1" "$2" "$3" "$4"
    else
        ensure_file "$temp" "$1" "$2" "$3" "$4"
    fi
    rm -f "$temp"
}

preview() {  # preview NEW_CONTENT_FILE TARGET: what --dry-run would write there
    if [[ -e "$R$2" ]]; then
        echo "would: change $2:"
        diff -u --label "$2 (now)" --label "$2 (new)" "$R$2" "$1" | sed 's/^/    /' || true
    else
        echo "would: write $2:"
        sed 's/^/    /' "$1"
    fi
}

replace_text() {  # replace_text TARGET NEW_CONTENT_FILE: a file someone else owns, in place
    if ! cmp -s "$2" "$R$1"; then
        CHANGED=$((CHANGED + 1))
        if [[ $DRY_RUN -eq 1 ]]; then preview "$2" "$1"
        else cat "$2" > "$R$1"; fi  # in place: the owner's mode and ownership stay
    fi
}

# --- packages (real installs only) -------------------------------------------------------
OWNED=0  # mosquitto installed by this installer: its local only mode served nobody
if [[ -z "$ROOT" ]]; then
    missing=()
    packages=(python3-venv openssl)
    [[ "$BROKER" == "local" ]] && packages+=(mosquitto mosquitto-clients)
    for pkg in "${packages[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
    done
    [[ " ${missing[*]-} " == *" mosquitto "* ]] && OWNED=1
    if [[ ${#missing[@]} -gt 0 ]]; then
        act apt-get update
        act apt-get install -y --no-install-recommends "${missing[@]}"
    fi
else
    say "target root $ROOT: skipping apt-get and systemctl (they act on the running system)"
fi

# --- the broker: the gateway's own listeners, every other client kept as it was ------------
# deploy/mosquitto_layout reads what mosquitto reads (mosquitto.conf and conf.d/*.conf), plans
# the gateway's listeners with per_listener_settings true and the edits that keep every other
# listener's settings as they were, and checks that by modelling the result: a configuration it
# cannot keep exactly stops the installer here, before anything else is changed (only apt-get
# ran). docs/deployment.md, "A broker already in use".
OWN_PASSWD="$MOSQ_DIR/tesla-gateway.passwd"
OWN_ACL="$MOSQ_DIR/tesla-gateway.acl"
CA="$MOSQ_DIR/certs/tesla-ca.pem"
LEGACY="$CONF_DIR/mqtt-shared"  # the operator's files the installer edited (for uninstall.sh)
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
all_nodes=""
users=()
if [[ "$BROKER" == "local" ]]; then
    # Node list: the union of earlier runs and this one's --node arguments.
    nodes_file="$R$CONF_DIR/mqtt-nodes"
    all_nodes="$( { cat "$nodes_file" 2>/dev/null || true; printf '%s\n' "${NODES[@]+"${NODES[@]}"}"; } \
        | grep -E "$ID_PATTERN" | sort -u || true)"
    users=("$MQTT_GATEWAY_USER" "$MQTT_READER_USER" "$MQTT_RELEASE_USER")
    while IFS= read -r node; do [[ -n "$node" ]] && users+=("$node"); done <<< "$all_nodes"
fi

gateway_acl() {  # the gateway's users: what each may read and write
    echo "# Generated by deploy/install.sh from $CONF_DIR/mqtt-nodes; rerun it after editing."
    echo "# Only the gateway's listeners use this file: no other client may read or write anything."
    echo
    echo "# The gateway: reads raw readings and releases, publishes its calibrated topics."
    echo "user $MQTT_GATEWAY_USER"
    echo "topic read sensors/+/raw"
    echo "topic read tesla/releases/#"
    echo "topic readwrite tesla/$GATEWAY_ID/#"
    echo "topic write homeassistant/#"
    echo
    echo "# Subscribers (dashboards, Home Assistant): everything the gateway publishes"
    echo "# (calibrated, batched, health, drift, stats, status, OTA status) and discovery."
    echo "user $MQTT_READER_USER"
    echo "topic read tesla/$GATEWAY_ID/#"
    echo "topic read homeassistant/#"
    echo
    echo "# The release-key holder: the only client that may publish model releases."
    echo "user $MQTT_RELEASE_USER"
    echo "topic write tesla/releases/#"
    while IFS= read -r node; do
        [[ -z "$node" ]] && continue
        echo
        echo "# Sensor node $node: its own raw topic only."
        echo "user $node"
        echo "topic write sensors/$node/raw"
    done <<< "$all_nodes"
}

PLAIN_PORT=1883
OWN_CONF=""
if [[ "$BROKER" == "local" ]]; then
    [[ $OWNED -eq 1 || -e "$R$CONF_DIR/mqtt-broker-owned" ]] && OWNED=1
    gateway_acl > "$WORK/acl"
    user_args=()
    for user in "${users[@]}"; do user_args+=(--user "$user"); done
    mkdir "$WORK/layout"
    owned_arg=()
    [[ $OWNED -eq 1 ]] && owned_arg=(--owned)
    PYTHONPATH="$SOURCE/deploy${PYTHONPATH:+:$PYTHONPATH}" python3 -B -m mosquitto_layout plan \
        --root "${ROOT:-/}" --out "$WORK/layout" --legacy "$R$LEGACY" "${user_args[@]}" \
        "${owned_arg[@]+"${owned_arg[@]}"}" --acl-text "$WORK/acl" \
        --passwd "$OWN_PASSWD" --acl "$OWN_ACL" --ca "$CA" \
        --cert "$MOSQ_DIR/certs/tesla-server.pem" --key "$MOSQ_DIR/certs/tesla-server.key" \
        || { echo "install.sh: the broker's configuration is left as it was" >&2; exit 1; }
    read -r OWN_CONF PLAIN_PORT TLS_PORT < "$WORK/layout/ports"
    sed 's/^/install.sh: /' "$WORK/layout/access"
    say "the gateway connects to 127.0.0.1:$PLAIN_PORT; nodes and subscribers use TLS on $TLS_PORT"
else
    say "--broker remote: no mosquitto configuration; the gateway connects to" \
        "$BROKER_HOST:$BROKER_PORT as $BROKER_USER$([[ -n "$BROKER_CA" ]] && echo ' over TLS')"
fi

# --- users ---------------------------------------------------------------------------------
useradd_root=()
[[ -n "$ROOT" ]] && useradd_root=(--root "$ROOT")
if [[ -z "$(uid_of "$SERVICE_USER")" ]]; then
    act useradd "${useradd_root[@]+"${useradd_root[@]}"}" --system --user-group \
        --home-dir "$STATE_DIR" --no-create-home --shell /usr/sbin/nologin \
        --groups dialout "$SERVICE_USER"
fi
MOSQ_GROUP="mosquitto"
[[ -n "$(gid_of mosquitto)" ]] || MOSQ_GROUP="root"  # broker not installed in this root

# --- program: venv with only the gateway's dependencies ------------------------------------
ensure_dir "$PREFIX" 0755 root root
VENV="$PREFIX/venv"
if [[ -n "$WHEELHOUSE" ]]; then
    PACKAGE=("--find-links" "$WHEELHOUSE" "tesla-gateway$EXTRA")
    stamp_text="$(cat "$WHEELHOUSE"/*.whl | sha256sum | cut -d' ' -f1) extra=$EXTRA"
else
    PACKAGE=("$SOURCE$EXTRA")
    stamp_text="$(cd "$SOURCE" && cat pyproject.toml $(find tesla_gateway -name '*.py' | LC_ALL=C sort) \
        | sha256sum | cut -d' ' -f1) extra=$EXTRA"
fi
if [[ "$(cat "$R$VENV/.tesla-gateway-installed" 2>/dev/null)" != "$stamp_text" ]]; then
    [[ -x "$R$VENV/bin/python" ]] || act python3 -m venv "$R$VENV"
    # shellcheck disable=SC2086  # PIP_ARGS is a list of words on purpose
    act "$R$VENV/bin/pip" install --quiet --disable-pip-version-check $PIP_ARGS "${PACKAGE[@]}"
    if [[ $DRY_RUN -eq 0 ]]; then echo "$stamp_text" > "$R$VENV/.tesla-gateway-installed"; fi
fi

# --- default models (read-only for the daemon: root-owned under ProtectSystem=strict) -------
ensure_dir "$PREFIX/models" 0755 root root
for pair in "pm10:pm10-ispra-1min" "pm2_5:pm2_5-antwerp-1h"; do
    feature="${pair%%:*}"; model="${pair#*:}"
    ensure_dir "$PREFIX/models/$feature" 0755 root root
    for file in "$SOURCE/models/$model"/*; do
        ensure_file "$file" "$PREFIX/models/$feature/$(basename "$file")" 0644 root root
    done
done
ensure_dir "$PREFIX/docs" 0755 root root
for doc in deployment.md mqtt.md serial-protocol.md; do
    [[ -f "$SOURCE/docs/$doc" ]] && ensure_file "$SOURCE/docs/$doc" "$PREFIX/docs/$doc" 0644 root root
done

# --- systemd unit ------------------------------------------------------------------------------
ensure_dir /etc/systemd/system 0755 root root
ensure_file "$SOURCE/systemd/tesla-gateway.service" /etc/systemd/system/tesla-gateway.service \
    0644 root root

# --- configuration -------------------------------------------------------------------------
ensure_dir "$CONF_DIR" 0750 root "$SERVICE_USER"
ensure_dir "$STATE_DIR" 0750 "$SERVICE_USER" "$SERVICE_USER"
ensure_file "$SOURCE/deploy/gateway.example.toml" "$CONF_DIR/gateway.example.toml" 0640 root \
    "$SERVICE_USER"
if [[ "$BROKER" == "local" ]]; then
    BROKER_CONNECT=(127.0.0.1 "$PLAIN_PORT" "$MQTT_GATEWAY_USER" "")
else
    BROKER_CONNECT=("$BROKER_HOST" "$BROKER_PORT" "$BROKER_USER"
        "${BROKER_CA:+$CONF_DIR/broker-ca.pem}")
    [[ -n "$BROKER_CA" ]] && ensure_file "$BROKER_CA" "$CONF_DIR/broker-ca.pem" 0644 root root
fi
gateway_toml() {  # gateway.toml.in for this gateway and its broker (host, port, user, CA)
    sed -e "s/@GATEWAY_ID@/$GATEWAY_ID/g" \
        -e "s/^host = \"127.0.0.1\"$/host = \"${BROKER_CONNECT[0]}\"/" \
        -e "s/^port = 1883$/port = ${BROKER_CONNECT[1]}/" \
        -e "s/^username = \"tesla-gateway\"$/username = \"${BROKER_CONNECT[2]}\"/" \
        "$SOURCE/deploy/gateway.toml.in" \
    | awk -v ca="${BROKER_CONNECT[3]}" '
        /^\[sources\.broker\]$/ { table = "sources.broker" }
        /^\[publisher\.broker\]$/ { table = "publisher.broker" }
        { print }
        ca != "" && /^password_file = / { printf "[%s.tls]\nca_file = \"%s\"\n", table, ca }'
}
if [[ ! -e "$R$CONF_DIR/gateway.toml" ]]; then  # never overwrite the operator's configuration
    ensure_content "$CONF_DIR/gateway.toml" 0640 root "$SERVICE_USER" < <(gateway_toml)
else
    ensure_meta "$CONF_DIR/gateway.toml" 0640 root "$SERVICE_USER"
    if ! grep -q "^host = \"${BROKER_CONNECT[0]}\"$" "$R$CONF_DIR/gateway.toml" \
        || ! grep -q "^port = ${BROKER_CONNECT[1]}$" "$R$CONF_DIR/gateway.toml"; then
        say "warning: $CONF_DIR/gateway.toml (kept as it is) does not name the broker this run" \
            "set up (${BROKER_CONNECT[0]}:${BROKER_CONNECT[1]}); edit it, or remove it and rerun"
    fi
fi

# --- MQTT credentials: one random password per user, created once ------------------------
ensure_dir "$CONF_DIR/credentials" 0750 root "$SERVICE_USER"
new_secret() {  # new_secret FILE: a random password, unless there is one
    if [[ ! -s "$R$1" ]]; then
        if [[ $DRY_RUN -eq 1 ]]; then echo "would: create password $1"; CHANGED=$((CHANGED + 1))
        else (umask 077; openssl rand -hex 24 > "$R$1"); CHANGED=$((CHANGED + 1)); fi
    fi
}
if [[ "$BROKER" == "remote" ]]; then
    secret="$CONF_DIR/credentials/tesla-gateway"
    new_secret "$secret"
    ensure_meta "$secret" 0640 root "$SERVICE_USER"
    say "give the broker at $BROKER_HOST a user $BROKER_USER with the password in $secret" \
        "(or write its existing password there); in Home Assistant: a user of its own" \
        "(Settings, People) or a login of the Mosquitto add-on"
fi

# --- the local broker: the gateway's users, ACL, certificates and listeners --------------
BROKER_CHANGED=0  # mosquitto restarts only for its own files
if [[ "$BROKER" == "local" ]]; then
    broker_before=$CHANGED
    ensure_content "$CONF_DIR/mqtt-nodes" 0640 root root \
        < <(printf '%s\n' "$all_nodes" | sed '/^$/d')
    if [[ $OWNED -eq 1 && ! -e "$R$CONF_DIR/mqtt-broker-owned" ]]; then
        ensure_content "$CONF_DIR/mqtt-broker-owned" 0640 root root \
            <<< "mosquitto was installed by deploy/install.sh: its local only mode served nobody"
    fi
    ensure_dir "$MOSQ_DIR" 0755 root root
    ensure_dir "$MOSQ_DIR/certs" 0755 root root
    ensure_dir "$MOSQ_DIR/conf.d" 0755 root root
    if [[ ! -e "$R$OWN_PASSWD" ]]; then act install -m 0640 /dev/null "$R$OWN_PASSWD"; fi
    for user in "${users[@]}"; do
        secret="$CONF_DIR/credentials/$user"
        new_secret "$secret"
        if [[ "$user" == "$MQTT_GATEWAY_USER" ]]; then
            ensure_meta "$secret" 0640 root "$SERVICE_USER"  # the daemon's password_file
        else
            ensure_meta "$secret" 0600 root root  # for the operator to hand to that client
        fi
        if ! grep -q "^$user:" "$R$OWN_PASSWD" 2>/dev/null; then
            if [[ $DRY_RUN -eq 1 ]]; then
                echo "would: add $user to $OWN_PASSWD"; CHANGED=$((CHANGED + 1))
            else act mosquitto_passwd -b "$R$OWN_PASSWD" "$user" "$(cat "$R$secret")"; fi
        fi
    done
    ensure_meta "$OWN_PASSWD" 0640 root "$MOSQ_GROUP"
    ensure_content "$OWN_ACL" 0640 root "$MOSQ_GROUP" < "$WORK/acl"

    # --- TLS: a local CA and a server certificate, created once (replace with your own) -----
    if [[ ! -e "$R$CA" ]]; then
        if [[ $DRY_RUN -eq 1 ]]; then
            echo "would: create CA and server certificate for $BROKER_HOST"
        else
            work="$(mktemp -d)"
            ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
            openssl req -x509 "${ec[@]}" -keyout "$work/ca.key" -out "$work/ca.pem" -days 3650 \
                -subj "/CN=tesla-gateway local CA" 2>/dev/null
            san="subjectAltName=DNS:$BROKER_HOST,DNS:localhost,IP:127.0.0.1"
            printf '%s\nextendedKeyUsage=serverAuth\n' "$san" > "$work/ext"
            openssl req "${ec[@]}" -keyout "$work/server.key" -out "$work/server.csr" \
                -subj "/CN=$BROKER_HOST" 2>/dev/null
            openssl x509 -req -in "$work/server.csr" -CA "$work/ca.pem" -CAkey "$work/ca.key" \
                -CAcreateserial -out "$work/server.pem" -days 825 -extfile "$work/ext" 2>/dev/null
            install -m 0600 "$work/ca.key" "$R$CONF_DIR/credentials/tesla-ca.key"
            install -m 0644 "$work/server.pem" "$R$MOSQ_DIR/certs/tesla-server.pem"
            install -m 0640 "$work/server.key" "$R$MOSQ_DIR/certs/tesla-server.key"
            install -m 0644 "$work/ca.pem" "$R$CA"
            rm -rf "$work"
            CHANGED=$((CHANGED + 1))
        fi
    fi
    ensure_meta "$CA" 0644 root root
    ensure_meta "$MOSQ_DIR/certs/tesla-server.pem" 0644 root root
    ensure_meta "$MOSQ_DIR/certs/tesla-server.key" 0640 root "$MOSQ_GROUP"
    ensure_meta "$CONF_DIR/credentials/tesla-ca.key" 0600 root root

    # --- mosquitto's configuration: the plan made above ----------------------------------
    while IFS=$'\t' read -r target source; do
        [[ -n "$target" ]] && replace_text "$target" "$source"
    done < "$WORK/layout/edits"
    # The operator's files that carry the installer's marks, for uninstall.sh (it also finds them).
    if [[ -s "$WORK/layout/marked" || -e "$R$LEGACY" ]]; then
        ensure_content "$LEGACY" 0640 root root < <(sed 's/^/edited /' "$WORK/layout/marked")
    fi
    old="$MOSQ_DIR/conf.d/tesla-gateway.conf"  # the name earlier installers used
    if head -n 1 "$R$old" 2>/dev/null | grep -q '^# Generated by deploy/install.sh'; then
        act rm -f "$R$old"
    fi
    ensure_content "$OWN_CONF" 0644 root root < "$WORK/layout/own.conf"
    [[ $CHANGED -gt $broker_before ]] && BROKER_CHANGED=1
fi

# --- activate (real installs only) ------------------------------------------------------
if [[ -z "$ROOT" && $CHANGED -gt 0 ]]; then
    act systemctl daemon-reload
    act systemctl enable tesla-gateway.service
    [[ $BROKER_CHANGED -eq 1 ]] && act systemctl restart mosquitto.service
    act systemctl restart tesla-gateway.service
fi
say "done: $CHANGED change(s)$([[ $DRY_RUN -eq 1 ]] && echo ' (dry run: nothing changed)')"
