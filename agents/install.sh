#!/usr/bin/env bash
# Install the hetcluster device agent on a Linux device with systemd (server, Jetson, Raspberry Pi).
#
#   sudo agents/install.sh [--dry-run] [--prefix /opt/hetcluster] [--source PATH_OR_WHEEL]
#                          [--python python3] [--system-site-packages] [--pip-arg ARG]...
#
# Idempotent: re-running upgrades the package and re-installs unit and rules, and never
# overwrites /etc/hetcluster/agent.toml or credentials. --dry-run prints every command instead
# of running it. Android/Termux has no systemd: see agents/README.md.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PREFIX=/opt/hetcluster
SOURCE="$(dirname "$HERE")"
PYTHON=python3
DRY_RUN=0
SYSTEM_SITE=0
PIP_ARGS=()
USER_NAME=hetcluster
ETC=/etc/hetcluster
STATE=/var/lib/hetcluster
UNIT_DIR=/etc/systemd/system
UDEV_DIR=/etc/udev/rules.d
TMPFILES_DIR=/etc/tmpfiles.d

usage() { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --prefix) PREFIX="$2"; shift ;;
    --source) SOURCE="$2"; shift ;;
    --python) PYTHON="$2"; shift ;;
    --system-site-packages) SYSTEM_SITE=1 ;;
    --pip-arg) PIP_ARGS+=("$2"); shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install.sh: unknown option $1 (try --help)" >&2; exit 2 ;;
  esac
  shift
done

run() {
  if [ "$DRY_RUN" = 1 ]; then
    printf '+'; printf ' %q' "$@"; printf '\n'
  else
    "$@"
  fi
}

note() { echo "install.sh: $*"; }

if [ "$DRY_RUN" = 0 ] && [ "$(id -u)" != 0 ]; then
  echo "install.sh: run as root (sudo), or pass --dry-run to see the steps." >&2
  exit 1
fi
command -v "$PYTHON" >/dev/null || { echo "install.sh: $PYTHON not found; install Python >= 3.10 or pass --python." >&2; exit 1; }

# 1. system user and group (GPU access through video/render, added where those groups exist)
if getent group "$USER_NAME" >/dev/null; then note "group $USER_NAME exists"; else run groupadd --system "$USER_NAME"; fi
if id -u "$USER_NAME" >/dev/null 2>&1; then
  note "user $USER_NAME exists"
else
  run useradd --system --gid "$USER_NAME" --home-dir "$STATE" --no-create-home --shell /usr/sbin/nologin "$USER_NAME"
fi
for group in video render; do
  if getent group "$group" >/dev/null; then run usermod -aG "$group" "$USER_NAME"; fi
done

# 2. virtual environment and package
VENV="$PREFIX/venv"
if [ -x "$VENV/bin/python" ]; then
  note "venv $VENV exists"
else
  run mkdir -p "$PREFIX"
  if [ "$SYSTEM_SITE" = 1 ]; then run "$PYTHON" -m venv --system-site-packages "$VENV"; else run "$PYTHON" -m venv "$VENV"; fi
fi
run "$VENV/bin/python" -m pip install --upgrade pip
run "$VENV/bin/python" -m pip install --upgrade ${PIP_ARGS[@]+"${PIP_ARGS[@]}"} "$SOURCE"

# 3. configuration, state, credentials (kept if present)
run install -d -m 0750 -o root -g "$USER_NAME" "$ETC"
run install -d -m 0750 -o "$USER_NAME" -g "$USER_NAME" "$STATE"
if [ -e "$ETC/agent.toml" ]; then
  note "$ETC/agent.toml exists; not touched"
else
  run install -m 0640 -o root -g "$USER_NAME" "$HERE/agent.toml" "$ETC/agent.toml"
fi
if [ -e "$ETC/token" ] || [ -e "$ETC/server.crt" ]; then
  note "credentials in $ETC exist; not touched"
else
  note "no credentials yet: make them once for the fleet (hetcluster agent credentials --out DIR --host <this device>)"
  note "and copy token, server.crt, server.key, ca.crt to $ETC (root:$USER_NAME, mode 0640);"
  note "a TF task needs all of cert_file, key_file and client_ca_file in agent.toml (mutual TLS)"
fi

# 4. systemd unit, RAPL permission rules
run install -m 0644 "$HERE/hetcluster-agent.service" "$UNIT_DIR/hetcluster-agent.service"
run install -m 0644 "$HERE/60-hetcluster-rapl.rules" "$UDEV_DIR/60-hetcluster-rapl.rules"
run install -m 0644 "$HERE/hetcluster-rapl.tmpfiles.conf" "$TMPFILES_DIR/hetcluster-rapl.conf"
if command -v systemctl >/dev/null || [ "$DRY_RUN" = 1 ]; then
  run systemctl daemon-reload
  run systemd-tmpfiles --create "$TMPFILES_DIR/hetcluster-rapl.conf"
  if command -v udevadm >/dev/null || [ "$DRY_RUN" = 1 ]; then
    run udevadm control --reload
    run udevadm trigger --subsystem-match=powercap
  fi
fi

# 5. the training plane: each TF server needs a network namespace the agent's user may make
if [ "$DRY_RUN" = 1 ]; then
  run runuser -u "$USER_NAME" -- "$VENV/bin/python" -c "from hetcluster.plane.isolation import isolation_problem; print(isolation_problem() or 'ok')"
else
  problem=$(runuser -u "$USER_NAME" -- "$VENV/bin/python" -c \
    "from hetcluster.plane.isolation import isolation_problem; print(isolation_problem() or 'ok')" 2>&1 | tail -1)
  if [ "$problem" = ok ]; then
    note "training plane: $USER_NAME can give each TF server a network namespace of its own"
  else
    note "training plane: $USER_NAME cannot make a network namespace ($problem); the agent will refuse TF tasks."
    note "allow unprivileged user namespaces (sysctl user.max_user_namespaces=15000; on Ubuntu >= 24.04"
    note "kernel.apparmor_restrict_unprivileged_userns=0), or opt out with [tf_plane] isolation = \"none\" (see docs/agent.md)"
  fi
fi

note "done. Edit $ETC/agent.toml (name, credentials), then: systemctl enable --now hetcluster-agent"
note "check it with: hetcluster agent info --address <host:port> --token-file ... --ca-file ..."
