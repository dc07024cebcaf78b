#!/usr/bin/env bash
# Install tesla-gateway on Raspberry Pi OS (Debian bookworm, arm64 or armhf). Idempotent: a second
# run with the same inputs changes nothing (files are replaced only when their content differs,
# users, passwords and certificates are created only when missing).
#
#   sudo deploy/install.sh [--gateway-id ID] [--node ID]... [--broker-host NAME]
#                          [--root DIR] [--dry-run] [--arch arm64|armhf|amd64] [--pip-args ARGS]
#
# --gateway-id ID  default: the host name. Gateways that share a broker need different ids
#              (their MQTT client ids derive from it); Raspberry Pi OS's default host name
#              "raspberrypi" gets a warning.
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
trap 'echo "install.sh: failed (exit $?) at line $LINENO: $BASH_COMMAND" >&2' ERR

SOURCE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROOT="/"
DRY_RUN=0
ARCH=""
PIP_ARGS=""
WHEELHOUSE=""
GATEWAY_ID="$(hostname -s 2>/dev/null || echo gateway)"
GATEWAY_ID_GIVEN=0
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

usage() { sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --root) ROOT="$2"; shift 2 ;;
        --dry-run) DRY_RUN=1; shift ;;
        --arch) ARCH="$2"; shift 2 ;;
        --pip-args) PIP_ARGS="$2"; shift 2 ;;
        --wheelhouse) WHEELHOUSE="$2"; shift 2 ;;
        --gateway-id) GATEWAY_ID="$2"; GATEWAY_ID_GIVEN=1; shift 2 ;;
        --broker-host) BROKER_HOST="$2"; shift 2 ;;
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

ensure_block() {  # ensure_block TARGET < block: our marked block in a file someone else owns
    local target="$R$1" temp
    temp="$(mktemp)"
    { awk '/^# BEGIN tesla-gateway/ { skip = 1 } !skip { print } /^# END tesla-gateway/ { skip = 0 }' \
          "$target" 2>/dev/null || true
      echo "# BEGIN tesla-gateway (deploy/install.sh: rerun it instead of editing this block)"
      cat
      echo "# END tesla-gateway"
    } > "$temp"
    if ! cmp -s "$temp" "$target"; then
        CHANGED=$((CHANGED + 1))
        if [[ $DRY_RUN -eq 1 ]]; then preview "$temp" "$1"
        else cat "$temp" > "$target"; fi  # in place: the owner's mode and ownership stay
    fi
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

# --- an existing broker configuration (Zigbee2MQTT, Home Assistant, ...) is kept working ----
# mosquitto reads mosquitto.conf and (Debian) every conf.d/*.conf. What those already set is not
# set again: a second password_file or a global "allow_anonymous false" would lock out the
# clients already using the broker. docs/deployment.md, "A broker already in use".
existing_conf=()
for file in "$R$MOSQ_DIR/mosquitto.conf" "$R$MOSQ_DIR"/conf.d/*.conf; do
    if [[ -f "$file" && "$(basename "$file")" != tesla-gateway.conf ]]; then
        existing_conf+=("$file")
    fi
done
conf_value() {  # conf_value KEY: its last value in the existing files (the one mosquitto keeps)
    [[ ${#existing_conf[@]} -gt 0 ]] || return 0
    awk -v k="$1" '$1 == k { v = $2 } END { if (v != "") print v }' "${existing_conf[@]}"
}
EX_PASSWD="$(conf_value password_file)"
EX_ACL="$(conf_value acl_file)"
EX_ANON="$(conf_value allow_anonymous)"
EX_PER_LISTENER="$(conf_value per_listener_settings)"
EX_PORTS=" "
if [[ ${#existing_conf[@]} -gt 0 ]]; then
    EX_PORTS+="$(awk '$1 == "listener" || $1 == "port" { printf "%s ", $2 }' "${existing_conf[@]}")"
fi
port_taken() { [[ "$EX_PORTS" == *" $1 "* ]]; }
free_port_from() { local port="$1"; while port_taken "$port"; do port=$((port + 1)); done; echo "$port"; }
MQTT_MODE="own"  # own: the broker is ours; shared: global settings exist; listener: per listener
if [[ "$EX_PER_LISTENER" == "true" ]]; then
    MQTT_MODE="listener"
elif [[ -n "$EX_PASSWD$EX_ACL$EX_ANON" || -n "${EX_PORTS// /}" ]]; then
    MQTT_MODE="shared"
fi
PLAIN_PORT=1883
TLS_PORT=8883
if [[ "$MQTT_MODE" == "listener" ]]; then  # our own listeners, on ports nobody else uses
    PLAIN_PORT="$(free_port_from 1883)"
    TLS_PORT="$(free_port_from 8883)"
fi
if [[ "$MQTT_MODE" != "own" ]]; then
    say "existing mosquitto configuration found (${existing_conf[*]#"$R"}): mode $MQTT_MODE" \
        "(password_file ${EX_PASSWD:-none}, acl_file ${EX_ACL:-none}," \
        "allow_anonymous ${EX_ANON:-unset}, listeners${EX_PORTS% })"
fi

# --- configuration -------------------------------------------------------------------------
ensure_dir "$CONF_DIR" 0750 root "$SERVICE_USER"
ensure_dir "$STATE_DIR" 0750 "$SERVICE_USER" "$SERVICE_USER"
ensure_file "$SOURCE/deploy/gateway.example.toml" "$CONF_DIR/gateway.example.toml" 0640 root \
    "$SERVICE_USER"
if [[ ! -e "$R$CONF_DIR/gateway.toml" ]]; then  # never overwrite the operator's configuration
    ensure_content "$CONF_DIR/gateway.toml" 0640 root "$SERVICE_USER" \
        < <(sed -e "s/@GATEWAY_ID@/$GATEWAY_ID/g" -e "s/^port = 1883$/port = $PLAIN_PORT/" \
            "$SOURCE/deploy/gateway.toml.in")
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
OWN_PASSWD="$MOSQ_DIR/tesla-gateway.passwd"
OWN_ACL="$MOSQ_DIR/tesla-gateway.acl"
PASSWD_FILE="$OWN_PASSWD"
[[ "$MQTT_MODE" == "shared" && -n "$EX_PASSWD" ]] && PASSWD_FILE="$EX_PASSWD"  # add our users
ensure_dir "$MOSQ_DIR" 0755 root root
ensure_dir "$MOSQ_DIR/certs" 0755 root root
if [[ ! -e "$R$PASSWD_FILE" ]]; then act install -m 0640 /dev/null "$R$PASSWD_FILE"; fi
# Users of the existing password file (not ours): their access is kept (see the ACL below).
existing_users="$(if [[ "$PASSWD_FILE" != "$OWN_PASSWD" ]]; then
    cut -d: -f1 "$R$PASSWD_FILE" 2>/dev/null | grep -E "$ID_PATTERN" || true; fi)"
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
[[ "$PASSWD_FILE" == "$OWN_PASSWD" ]] && ensure_meta "$PASSWD_FILE" 0640 root "$MOSQ_GROUP"
existing_users="$(grep -vxF -f <(printf '%s\n' "${users[@]}") <<< "$existing_users" || true)"

# --- MQTT ACL ----------------------------------------------------------------------------------
gateway_acl() {  # the gateway's users: what each may read and write
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
kept_acl() {  # an ACL file now restricts everyone: the broker's earlier clients keep it all
    if [[ "$EX_ANON" == "true" ]]; then
        echo "# Anonymous clients (allow_anonymous true in the existing configuration):"
        echo "# unrestricted, as before this file existed."
        echo "topic readwrite #"
        echo
    fi
    while IFS= read -r user; do
        [[ -z "$user" ]] && continue
        echo "# $user (from $PASSWD_FILE, before the gateway): unrestricted, as before."
        echo "user $user"
        echo "topic readwrite #"
        echo
    done <<< "$existing_users"
}
ACL_FILE="$OWN_ACL"
if [[ "$MQTT_MODE" == "shared" && -n "$EX_ACL" ]]; then
    ACL_FILE="$EX_ACL"  # the operator's ACL: our users go into a marked block at its end
    ensure_block "$EX_ACL" < <(gateway_acl)
else
    ensure_content "$OWN_ACL" 0640 root "$MOSQ_GROUP" < <(
        echo "# Generated by deploy/install.sh from $CONF_DIR/mqtt-nodes; rerun it after editing."
        [[ "$MQTT_MODE" == "shared" ]] && kept_acl
        echo "# No other client may read or write anything."
        echo
        gateway_acl
    )
fi
# What uninstall.sh must take out of files that are not ours.
ensure_content "$CONF_DIR/mqtt-shared" 0640 root root < <(
    [[ "$PASSWD_FILE" != "$OWN_PASSWD" ]] && echo "password_file $PASSWD_FILE"
    [[ "$ACL_FILE" != "$OWN_ACL" ]] && echo "acl_file $ACL_FILE"
    true
)

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

unset_global() {  # unset_global KEY VALUE: the line, unless the existing configuration sets KEY
    [[ -n "$(conf_value "$1")" ]] || echo "$1 $2"
}
listener_auth() {  # per_listener_settings true: our listeners carry their own settings
    if [[ "$MQTT_MODE" == "listener" ]]; then
        echo "allow_anonymous false"
        echo "password_file $PASSWD_FILE"
        echo "acl_file $ACL_FILE"
    fi
}
mosquitto_conf() {
    echo "# Generated by deploy/install.sh (tesla-gateway), mode $MQTT_MODE (docs/deployment.md)."
    case "$MQTT_MODE" in
        own)
            echo "# Every client authenticates; per-user ACLs."
            echo "per_listener_settings false"
            echo "allow_anonymous false"
            echo "password_file $PASSWD_FILE"
            echo "acl_file $ACL_FILE" ;;
        shared)
            echo "# The broker was already configured: its allow_anonymous, listeners and (if set)"
            echo "# password_file and acl_file are kept; the gateway's users were added to them."
            [[ -z "$EX_PASSWD" ]] && echo "password_file $PASSWD_FILE"
            [[ -z "$EX_ACL" ]] && echo "acl_file $ACL_FILE" ;;
        listener)
            echo "# per_listener_settings true: the gateway has its own listeners and settings." ;;
    esac
    unset_global set_tcp_nodelay true
    unset_global max_queued_messages 100000
    echo "# Also the MQTT 5 Receive Maximum announced to clients: the gateway keeps up to"
    echo "# publisher.in_flight (256) calibrated messages awaiting PUBACK; mosquitto's default 20"
    echo "# throttles per-sensor topics at thousands of sensors."
    unset_global max_inflight_messages 1000
    if [[ "$MQTT_MODE" == "own" ]]; then
        echo "# Bounded input: no MQTT packet above 1 MiB (release bundles fit; readings are tiny)."
        echo "max_packet_size 1048576"
    fi
    if port_taken "$PLAIN_PORT"; then
        echo
        echo "# Port $PLAIN_PORT is already a listener of this broker: the gateway connects to it."
    else
        echo
        echo "# Local clients (the gateway on this machine): loopback only, still authenticated."
        echo "listener $PLAIN_PORT 127.0.0.1"
        listener_auth
    fi
    echo
    if port_taken "$TLS_PORT"; then
        echo "# Port $TLS_PORT is already a listener of this broker: remote clients use it."
    else
        echo "# Everyone else: TLS."
        echo "listener $TLS_PORT"
        listener_auth
        echo "cafile $CA"
        echo "certfile $MOSQ_DIR/certs/tesla-server.pem"
        echo "keyfile $MOSQ_DIR/certs/tesla-server.key"
        echo "tls_version tlsv1.2"
    fi
}
ensure_dir "$MOSQ_DIR/conf.d" 0755 root root
ensure_content "$MOSQ_DIR/conf.d/tesla-gateway.conf" 0644 root root < <(mosquitto_conf)

# --- activate (real installs only) ------------------------------------------------------
if [[ -z "$ROOT" && $CHANGED -gt 0 ]]; then
    act systemctl daemon-reload
    act systemctl enable tesla-gateway.service
    act systemctl restart mosquitto.service
    act systemctl restart tesla-gateway.service
fi
say "done: $CHANGED change(s)$([[ $DRY_RUN -eq 1 ]] && echo ' (dry run: nothing changed)')"
