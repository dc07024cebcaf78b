#!/usr/bin/env bash
# Installs the Debian packages the tests and the demo need, only when something is missing.
# mosquitto: the real broker the tests start on loopback; socat: pty pairs for serial tests;
# gcc-arm-none-eabi + libnewlib-arm-none-eabi: the Cortex-M4 firmware build (the compiler and
# its C library headers, which --no-install-recommends would leave out); libstdc++-arm-none-eabi-newlib +
# qemu-system-arm: the node firmware linked for the Cortex-M4F and run on qemu's mps2-an386
# (tests/firmware/test_firmware_m4.py); libsodium-dev: Ed25519 in the firmware tests;
# systemd: systemd-analyze verify for the unit files; mosquitto-clients: mosquitto_sub (the
# broker limit's earlier yardstick, for comparison); gcc + libc6-dev: cc builds the bench's own C
# subscriber (devkit/bench/limit_sub.c).
set -euo pipefail

need=()
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || need+=(mosquitto)
command -v socat >/dev/null 2>&1 || need+=(socat)
command -v mosquitto_sub >/dev/null 2>&1 || need+=(mosquitto-clients)
command -v arm-none-eabi-gcc >/dev/null 2>&1 || need+=(gcc-arm-none-eabi)
[ -f /usr/lib/arm-none-eabi/include/string.h ] || need+=(libnewlib-arm-none-eabi)
dpkg -s libstdc++-arm-none-eabi-newlib >/dev/null 2>&1 || need+=(libstdc++-arm-none-eabi-newlib)
command -v qemu-system-arm >/dev/null 2>&1 || need+=(qemu-system-arm)
command -v g++ >/dev/null 2>&1 || need+=(g++)
command -v cc >/dev/null 2>&1 || need+=(gcc)
[ -f /usr/include/stdio.h ] || need+=(libc6-dev)
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
dpkg -s libsodium-dev >/dev/null 2>&1 || need+=(libsodium-dev)

if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi

echo "Installing Debian packages: ${need[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    sudo="sudo"
  else
    echo "error: need root (or sudo) to install ${need[*]}; install them and re-run." >&2
    exit 1
  fi
fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
