#!/usr/bin/env bash
# Check unit files with `systemd-analyze verify` (syntax, known keys, valid values, dependencies).
#
# verify needs every ExecStart binary to exist, so the units are copied to a temporary directory with
# /usr/local/bin/tritonctl and /opt/tritonserver/bin/tritonserver replaced by $TRITONCTL_BIN and
# $TRITONSERVER_BIN (default /bin/true). verify exits 0 even for unknown keys and unparsable values,
# so any message that names one of the units counts as a failure here.
#
#   examples/systemd/verify.sh [UNIT_FILE...]      (default: the two units next to this script)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
units=("$@")
if [ ${#units[@]} -eq 0 ]; then
    units=("$here/tritonctl.service" "$here/tritonserver.service")
fi
tritonctl_bin="${TRITONCTL_BIN:-/bin/true}"
tritonserver_bin="${TRITONSERVER_BIN:-/bin/true}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
copies=()
for unit in "${units[@]}"; do
    copy="$tmp/$(basename "$unit")"
    sed -e "s#/usr/local/bin/tritonctl#${tritonctl_bin}#g" \
        -e "s#/opt/tritonserver/bin/tritonserver#${tritonserver_bin}#g" "$unit" > "$copy"
    copies+=("$copy")
done
status=0
output="$(systemd-analyze verify --man=no "${copies[@]}" 2>&1)" || status=$?
problems=""
for copy in "${copies[@]}"; do
    name="$(basename "$copy")"
    problems+="$(printf '%s\n' "$output" | grep -F -e "$copy" -e "$name" || true)"
done
if [ "$status" -ne 0 ] || [ -n "$problems" ]; then
    printf 'systemd-analyze verify failed (exit %s):\n%s\n' "$status" "$output" >&2
    exit 1
fi
echo "systemd-analyze verify: ok (${units[*]##*/})"
