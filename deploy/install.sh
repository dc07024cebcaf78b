#!/usr/bin/env bash
# Install tesla-gateway on Raspberry Pi OS (Debian bookworm, arm64 or armhf). Idempotent: a second
# run with the same inputs changes nothing (files are replaced only when their content differs,
# users, passwords and certificates are created only when missing).
#
#   sudo deploy/install.sh [--gateway-id ID] [--node ID]... [--broker-host NAME]
#                          [--root DIR] [--dry-run] [--arch arm64|armhf|amd64] [--pip-args ARGS]
#
# --root DIR   install into DIR instead of / (a throwaway tree: no apt, no systemctl; the
#              users are created in DIR/etc with useradd --root)
# --dry-run    print what would be done, change nothing
# --node ID    a sensor node allowed to publish sensors/ID/raw (repeatable; kept across runs
#              in /etc/tesla-gateway/mqtt-nodes)
# --wheelhouse DIR  install the gateway from the wheels in DIR (offline installs; with
#              --pip-args "--no-index" pip never touches the network)
# --pip-args   extra arguments for pip (e.g. "--no-index")
#
# Layout (docs/deployment.md): /opt/tesla-gateway/{venv,models,docs}, /etc/tesla-gateway,
# /var/lib/tesla-gateway, /etc/systemd/system/tesla-gateway.service, /etc/mosquitto/conf.d/
# tesla-gateway.conf with its password file, ACL and TLS certificates under /etc/mosquitto.
set -euo pipefail

SOURCE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROOT="/"
DRY_RUN=0
ARCH=""
PIP_ARGS=""
WHEELHOUSE=""
GATEWAY_ID="$(hostname -s 2>/dev/null || echo gateway)"
BROKER_HOST="$(hostname -f 2>/dev/null || hostname)"
NODES=()

SERVICE_USER="tesla-gateway"
PREFIX="/opt/tesla-gateway"
CONF_DIR="/etc/tesla-gateway"
STATE_DIR="/var/lib/tesla-gateway"
MOSQ_DIR="/etc/mosquitto"
MQTT_GATEWAY_USER="tesla-gateway"
MQTT_READER_USER="tesla-reader"
MQTT_RELEASE_USER="tesla-release"

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --root) ROOT="$2"; shift 2 ;;
        --dry-run) DRY_RUN=1; shift ;;
        --arch) ARCH="$2"; shift 2 ;;
        --pip-args) PIP_ARGS="$2"; shift 2 ;;
        --wheelhouse) WHEELHOUSE="$2"; shift 2 ;;
        --gateway-id) GATEWAY_ID="$2"; shift 2 ;;
        --broker-host) BROKER_HOST="$2"; shift 2 ;;
        --node) NODES+=("$2"); shift 2 ;;
        -h|--help) usage 0 ;;
        *) echo "install.sh: unknown argument $1" >&2; usage 2 ;;
    esac
done

ID_PATTERN='^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$'
[[ "$GATEWAY_ID" =~ $ID_PATTERN ]] || { echo "install.sh: bad --gateway-id $GATEWAY_ID" >&2; exit 2; }
for node in "${NODES[@]+"${NODES[@]}"}"; do
    [[ "$node" =~ $ID_PATTERN ]] || { echo "install.sh: bad --node $node" >&2; exit 2; }
done
[[ "$BROKER_HOST" =~ ^[A-Za-z0-9.:-]+$ ]] || { echo "install.sh: bad --broker-host" >&2; exit 2; }
ROOT="${ROOT%/}"
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
uid_of() { awk -F: -v n="$1" '$1 == n { print $3 }' "$R/etc/passwd" 2>/dev/null; }
gid_of() { awk -F: -v n="$1" '$1 == n { print $3 }' "$R/etc/group" 2>/dev/null; }

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
    ensure_file "$temp" "$1" "$2" "$3" "$4"
    rm -f "$temp"
}

# --- packages (real installs only) -------------------------------------------------------
if [[ -z "$ROOT" ]]; then
    missing=()
    for pkg in python3-venv mosquitto mosquitto-clients openssl; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
    done
    if [[ ${#missing[@]} -gt 0 ]]; then
        act apt-get update
        act apt-get install -y --no-install-recommends "${missing[@]}"
    fi
else
    say "target root $ROOT: skipping apt-get and systemctl (they act on the running system)"
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
    stamp_text="$(cd "$SOURCE" && cat pyproject.toml gateway/*.py gateway/*/*.py \
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
if [[ ! -e "$R$CONF_DIR/gateway.toml" ]]; then  # never overwrite the operator's configuration
    ensure_content "$CONF_DIR/gateway.toml" 0640 root "$SERVICE_USER" \
        < <(sed -e "s/@GATEWAY_ID@/$GATEWAY_ID/g" "$SOURCE/deploy/gateway.toml.in")
else
    ensure_meta "$CONF_DIR/gateway.toml" 0640 root "$SERVICE_USER"
fi

# Node list: the union of earlier runs and this one's --node arguments.
nodes_file="$R$CONF_DIR/mqtt-nodes"
all_nodes="$( { cat "$nodes_file" 2>/dev/null || true; printf '%s\n' "${NODES[@]+"${NODES[@]}"}"; } \
    | grep -E "$ID_PATTERN" | sort -u || true)"
ensure_content "$CONF_DIR/mqtt-nodes" 0640 root root < <(printf '%s\n' "$all_nodes" | sed '/^$/d')

# --- MQTT credentials: one random password per user, created once ------------------------
ensure_dir "$CONF_DIR/credentials" 0750 root "$SERVICE_USER"
PASSWD_FILE="$MOSQ_DIR/tesla-gateway.passwd"
ensure_dir "$MOSQ_DIR" 0755 root root
ensure_dir "$MOSQ_DIR/certs" 0755 root root
if [[ ! -e "$R$PASSWD_FILE" ]]; then act install -m 0640 /dev/null "$R$PASSWD_FILE"; fi
users=("$MQTT_GATEWAY_USER" "$MQTT_READER_USER" "$MQTT_RELEASE_USER")
while IFS= read -r node; do [[ -n "$node" ]] && users+=("$node"); done <<< "$all_nodes"
for user in "${users[@]}"; do
    secret="$CONF_DIR/credentials/$user"
    if [[ ! -s "$R$secret" ]]; then
        if [[ $DRY_RUN -eq 1 ]]; then echo "would: create password $secret"; CHANGED=$((CHANGED + 1))
        else (umask 077; openssl rand -hex 24 > "$R$secret"); CHANGED=$((CHANGED + 1)); fi
    fi
    if [[ "$user" == "$MQTT_GATEWAY_USER" ]]; then
        ensure_meta "$secret" 0640 root "$SERVICE_USER"  # the daemon's password_file
    else
        ensure_meta "$secret" 0600 root root  # for the operator to hand to that client
    fi
    if ! grep -q "^$user:" "$R$PASSWD_FILE" 2>/dev/null; then
        if [[ $DRY_RUN -eq 1 ]]; then echo "would: add $user to $PASSWD_FILE"; CHANGED=$((CHANGED + 1))
        else act mosquitto_passwd -b "$R$PASSWD_FILE" "$user" "$(cat "$R$secret")"; fi
    fi
done
ensure_meta "$PASSWD_FILE" 0640 root "$MOSQ_GROUP"

# --- MQTT ACL ----------------------------------------------------------------------------------
acl_text() {
    echo "# Generated by deploy/install.sh from $CONF_DIR/mqtt-nodes; rerun it after editing."
    echo "# Anonymous clients are refused (allow_anonymous false); no line applies to them."
    echo
    echo "# The gateway: reads raw readings and releases, publishes its calibrated topics."
    echo "user $MQTT_GATEWAY_USER"
    echo "topic read sensors/+/raw"
    echo "topic read tesla/releases/#"
    echo "topic readwrite tesla/$GATEWAY_ID/#"
    echo "topic write homeassistant/#"
    echo
    echo "# Subscribers (dashboards, Home Assistant): calibrated readings, status and stats only."
    echo "user $MQTT_READER_USER"
    echo "topic read tesla/$GATEWAY_ID/+/+"
    echo "topic read tesla/$GATEWAY_ID/status"
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
ensure_content "$MOSQ_DIR/tesla-gateway.acl" 0640 root "$MOSQ_GROUP" < <(acl_text)

# --- TLS: a local CA and a server certificate, created once (replace with your own) ---------
CA="$MOSQ_DIR/certs/tesla-ca.pem"
if [[ ! -e "$R$CA" ]]; then
    if [[ $DRY_RUN -eq 1 ]]; then echo "would: create CA and server certificate for $BROKER_HOST"
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

ensure_dir "$MOSQ_DIR/conf.d" 0755 root root
ensure_content "$MOSQ_DIR/conf.d/tesla-gateway.conf" 0644 root root <<EOF
# Generated by deploy/install.sh (tesla-gateway). Every client authenticates; per-user ACLs.
per_listener_settings false
allow_anonymous false
password_file $PASSWD_FILE
acl_file $MOSQ_DIR/tesla-gateway.acl
set_tcp_nodelay true
max_queued_messages 100000
# Also the MQTT 5 Receive Maximum announced to clients: the gateway keeps up to
# publisher.in_flight (256) calibrated messages awaiting PUBACK; mosquitto's default 20
# throttles per-sensor topics at thousands of sensors.
max_inflight_messages 1000
# Bounded input: no MQTT packet above 1 MiB (release bundles of issue 5 fit; readings are tiny).
max_packet_size 1048576

# Local clients (the gateway on this machine): loopback only, still authenticated.
listener 1883 127.0.0.1

# Everyone else: TLS.
listener 8883
cafile $CA
certfile $MOSQ_DIR/certs/tesla-server.pem
keyfile $MOSQ_DIR/certs/tesla-server.key
tls_version tlsv1.2
EOF

# --- activate (real installs only) ------------------------------------------------------
if [[ -z "$ROOT" && $CHANGED -gt 0 ]]; then
    act systemctl daemon-reload
    act systemctl enable tesla-gateway.service
    act systemctl restart mosquitto.service
    act systemctl restart tesla-gateway.service
fi
say "done: $CHANGED change(s)$([[ $DRY_RUN -eq 1 ]] && echo ' (dry run: nothing changed)')"
