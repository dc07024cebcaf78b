#!/usr/bin/env bash
# Remove tesla-gateway installed by deploy/install.sh. Idempotent.
#
#   sudo deploy/uninstall.sh [--purge] [--root DIR] [--dry-run]
#
# Removes the program (/opt/tesla-gateway), the systemd unit and the mosquitto configuration
# (conf.d file, password file, ACL, server certificate). Keeps the configuration, credentials
# and state (/etc/tesla-gateway, /var/lib/tesla-gateway) and the user unless --purge.
set -euo pipefail

ROOT="/"
DRY_RUN=0
PURGE=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --root) ROOT="$2"; shift 2 ;;
        --dry-run) DRY_RUN=1; shift ;;
        --purge) PURGE=1; shift ;;
        -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "uninstall.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
ROOT="${ROOT%/}"
R="$ROOT"
[[ $EUID -eq 0 || $DRY_RUN -eq 1 ]] || { echo "uninstall.sh: run as root (or --dry-run)" >&2; exit 1; }

CHANGED=0
act() {
    CHANGED=$((CHANGED + 1))
    if [[ $DRY_RUN -eq 1 ]]; then echo "would: $*"; else "$@"; fi
}
remove() {  # remove PATH...: files or trees, only if present
    local path
    for path in "$@"; do
        if [[ -e "$R$path" || -L "$R$path" ]]; then act rm -rf -- "$R$path"; fi
    done
}

if [[ -z "$ROOT" ]]; then
    if systemctl list-unit-files tesla-gateway.service >/dev/null 2>&1; then
        act systemctl disable --now tesla-gateway.service || true
    fi
fi
# A broker that was already in use kept its own password and ACL files; install.sh added the
# gateway's users to them (listed in /etc/tesla-gateway/mqtt-shared): take those out again.
shared="$R/etc/tesla-gateway/mqtt-shared"
if [[ -s "$shared" ]]; then
    ours=(tesla-gateway tesla-reader tesla-release)
    while IFS= read -r node; do [[ -n "$node" ]] && ours+=("$node"); done \
        < <(cat "$R/etc/tesla-gateway/mqtt-nodes" 2>/dev/null || true)
    while read -r kind path; do
        [[ -f "$R$path" ]] || continue
        if [[ "$kind" == "password_file" ]]; then
            for user in "${ours[@]}"; do
                if grep -q "^$user:" "$R$path"; then act mosquitto_passwd -D "$R$path" "$user"; fi
            done
        elif [[ "$kind" == "acl_file" ]] && grep -q "^# BEGIN tesla-gateway" "$R$path"; then
            CHANGED=$((CHANGED + 1))
            if [[ $DRY_RUN -eq 1 ]]; then echo "would: remove the tesla-gateway block of $path"
            else
                kept="$(awk '/^# BEGIN tesla-gateway/ { skip = 1 } !skip { print }
                    /^# END tesla-gateway/ { skip = 0 }' "$R$path")"
                printf '%s\n' "$kept" > "$R$path"  # in place: mode and owner stay
            fi
        fi
    done < "$shared"
    if [[ $DRY_RUN -eq 0 ]]; then : > "$shared"; fi
fi
remove /etc/systemd/system/tesla-gateway.service /opt/tesla-gateway \
    /etc/mosquitto/conf.d/tesla-gateway.conf /etc/mosquitto/tesla-gateway.passwd \
    /etc/mosquitto/tesla-gateway.acl /etc/mosquitto/certs/tesla-server.pem \
    /etc/mosquitto/certs/tesla-server.key /etc/mosquitto/certs/tesla-ca.pem
if [[ $PURGE -eq 1 ]]; then
    remove /etc/tesla-gateway /var/lib/tesla-gateway /var/log/tesla-gateway
    if awk -F: '$1 == "tesla-gateway" { found = 1 } END { exit !found }' "$R/etc/passwd"; then
        if [[ -n "$ROOT" ]]; then act userdel --root "$ROOT" tesla-gateway
        else act userdel tesla-gateway; fi
    fi
fi
if [[ -z "$ROOT" && $CHANGED -gt 0 ]]; then
    act systemctl daemon-reload
    if systemctl is-active --quiet mosquitto.service; then act systemctl restart mosquitto.service; fi
fi
echo "uninstall.sh: done: $CHANGED change(s)$([[ $DRY_RUN -eq 1 ]] && echo ' (dry run: nothing changed)')"
