#!/usr/bin/env bash
# One-time, per node, as root: the CNI network polar's Apptainer sandboxes join (polar.conflist).
#   - installs polar.conflist into Apptainer's network configuration directory;
#   - allows unprivileged users to join it (apptainer.conf: allow net users / networks);
#   - creates the bridge with its gateway IP now, so polar can listen there before any instance;
#   - lets the bridge reach the host on 80/443 only (polar), refusing everything else.
# The network has no masquerade and no default route: instances reach the gateway and nothing else.
# Not run on the machine this was written on (no Apptainer there); see polar/sandboxes/apptainer_runtime.py.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
BRIDGE=polar0
GATEWAY=10.87.0.1/24
ALLOW_USERS="${POLAR_APPTAINER_USERS:-$(id -un "${SUDO_USER:-root}")}"

SYSCONFDIR="$(apptainer buildcfg SYSCONFDIR)"
NETDIR="$SYSCONFDIR/apptainer/network"
CONF="$SYSCONFDIR/apptainer/apptainer.conf"
install -m 0644 "$HERE/polar.conflist" "$NETDIR/40_polar.conflist"

set_conf() {  # set_conf "allow net users" "alice"
  if grep -q "^$1 *=" "$CONF"; then
    grep -q "^$1 *=.*\b$2\b" "$CONF" || sed -i "s|^\($1 *=.*\)|\1, $2|" "$CONF"
  else
    echo "$1 = $2" >> "$CONF"
  fi
}
set_conf "allow net users" "$ALLOW_USERS"
set_conf "allow net networks" "polar"

if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
  ip link add "$BRIDGE" type bridge
fi
ip addr replace "$GATEWAY" dev "$BRIDGE"
ip link set "$BRIDGE" up

iptables -C INPUT -i "$BRIDGE" -j REJECT 2>/dev/null || {
  iptables -I INPUT -i "$BRIDGE" -j REJECT
  iptables -I INPUT -i "$BRIDGE" -p tcp -m multiport --dports 80,443 -j ACCEPT
  iptables -I INPUT -i "$BRIDGE" -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
}
echo "polar network ready: bridge $BRIDGE at ${GATEWAY%/*}; users allowed: $ALLOW_USERS"
