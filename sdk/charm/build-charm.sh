#!/usr/bin/env bash
# Builds Charm++ from a source tree (the public repository charmplusplus/charm) with tracing, for Canopy's trace
# module and its tests:
#
#   sdk/charm/build-charm.sh CHARM_SOURCE [TARGET] [-- BUILD_OPTIONS...]
#
# TARGET is Charm++'s build target (netlrts-linux-x86_64 by default; netlrts-linux-x86_64-smp for PEs as threads).
# The build lands in CHARM_SOURCE/TARGET, the directory to give sdk/charm/install.sh and the tests (CHARM_DIR).
# About 5 to 10 minutes on 2 cores.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 CHARM_SOURCE [TARGET] [-- BUILD_OPTIONS...]" >&2; exit 2; }
src=$1
shift
target=netlrts-linux-x86_64
if [ $# -gt 0 ] && [ "$1" != "--" ]; then target=$1; shift; fi
[ $# -gt 0 ] && [ "$1" = "--" ] && shift
[ -x "$src/build" ] || { echo "$0: $src/build not found: CHARM_SOURCE must be Charm++'s source tree" >&2; exit 1; }
platform=${target%-smp}
options=(--with-production --enable-tracing "-j$(nproc)")
[ "$platform" != "$target" ] && options=(smp "${options[@]}")
cd "$src"
# --with-production alone configures --disable-tracing: no trace module would link.
./build charm++ "$platform" "${options[@]}" "$@"
echo "CHARM_DIR=$src/$target"
