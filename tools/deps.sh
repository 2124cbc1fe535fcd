#!/usr/bin/env bash
# Checks that the Debian packages some targets need are installed, before
# anything is built. The list is tools/debian-packages.txt (package, then the
# targets needing it). Silent when everything is there (one dpkg-query call).
# When packages are missing: as root, `apt-get update` once and
# `apt-get install -y --no-install-recommends` them; otherwise print the exact
# sudo line and exit 1.
#
# Usage: tools/deps.sh TARGET...         check (build, run, test; all = every line)
#        tools/deps.sh --list TARGET...  print the packages, one per line
# Environment: SKIP_DEPS=1 reports what is missing and goes on (the optional
# parts then say what they leave out); DEPS_LIST overrides the list file.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
list_file=${DEPS_LIST:-$here/debian-packages.txt}

list_only=0
if [ "${1:-}" = --list ]; then list_only=1; shift; fi
[ $# -gt 0 ] || { echo "usage: tools/deps.sh [--list] TARGET... (build, run, test, all)" >&2; exit 2; }
[ -r "$list_file" ] || { echo "deps: cannot read the package list $list_file" >&2; exit 2; }

# the packages whose targets meet the requested ones, in file order
pkgs=()
lineno=0
while read -r pkg targets || [ -n "${pkg:-}" ]; do
    lineno=$((lineno + 1))
    case "${pkg:-#}" in '#'*) continue ;; esac
    [ -n "${targets:-}" ] || { echo "deps: $list_file:$lineno: '$pkg' names no target (build, run, test)" >&2; exit 2; }
    for want in "$@"; do
        case " $targets " in
            *" $want "*) pkgs+=("$pkg"); break ;;
        esac
        if [ "$want" = all ]; then pkgs+=("$pkg"); break; fi
    done
done < "$list_file"
[ ${#pkgs[@]} -gt 0 ] || { echo "deps: no package in $list_file is needed by: $*" >&2; exit 2; }

if [ "$list_only" = 1 ]; then
    printf '%s\n' "${pkgs[@]}"
    exit 0
fi

if ! command -v dpkg-query >/dev/null 2>&1; then
    echo "deps: dpkg-query not found (not Debian?): not checking; this needs the equivalents of: ${pkgs[*]}" >&2
    exit 0
fi

# "ii" = installed and configured; a package dpkg has never seen is not listed
installed=$(dpkg-query -W -f='${Package} ${db:Status-Abbrev}\n' "${pkgs[@]}" 2>/dev/null || true)
missing=()
for p in "${pkgs[@]}"; do
    grep -qxF "$p ii " <<<"$installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

install_args=(install -y --no-install-recommends "${missing[@]}")
if [ "${SKIP_DEPS:-0}" = 1 ]; then
    echo "deps: missing Debian packages (SKIP_DEPS=1, going on without them): ${missing[*]}" >&2
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "deps: missing Debian packages: ${missing[*]}" >&2
    echo "deps: install them with" >&2
    echo "    sudo apt-get ${install_args[*]}" >&2
    echo "deps: then run the same command again (SKIP_DEPS=1 goes on without them; optional parts say what they leave out)" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
log=${DEPS_LOG:-${TMPDIR:-/tmp}/attn-deps-apt.log}
: > "$log"
start=$SECONDS
echo "deps: missing Debian packages: ${missing[*]}"
echo "deps: apt-get update && apt-get ${install_args[*]} (log: $log)"
if ! apt-get update >>"$log" 2>&1 || ! apt-get "${install_args[@]}" >>"$log" 2>&1; then
    tail -n 20 "$log" >&2
    echo "deps: apt-get failed (full log: $log)" >&2
    exit 1
fi
installed=$(dpkg-query -W -f='${Package} ${db:Status-Abbrev}\n' "${missing[@]}" 2>/dev/null || true)
for p in "${missing[@]}"; do
    grep -qxF "$p ii " <<<"$installed" || { echo "deps: $p is still not installed after apt-get (log: $log)" >&2; exit 1; }
done
echo "deps: installed ${#missing[@]} packages (and their dependencies) in $((SECONDS - start)) s"
