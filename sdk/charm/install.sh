#!/usr/bin/env bash
# Builds Canopy's Charm++ trace module against a Charm++ build and installs it there, so that any program linked
# with `charmc -tracemode canopy` reports to the node's Canopy agent with no source change.
#
#   sdk/charm/install.sh CHARM_DIR [LIBCANOPY]
#
# CHARM_DIR is a Charm++ build with tracing (its bin/charmc, include/ and lib/; sdk/charm/build-charm.sh makes
# one). LIBCANOPY is the C SDK the module loads when a program starts (CANOPY_LIBRARY overrides it at run time);
# by default the one cargo built in this checkout (release, else debug), else an installed libcanopy.so.0.
set -euo pipefail

usage() {
  echo "usage: $0 CHARM_DIR [LIBCANOPY]" >&2
  exit 2
}
[ $# -ge 1 ] && [ $# -le 2 ] || usage
charm=$(cd "$1" 2>/dev/null && pwd) || { echo "$0: $1: no such directory" >&2; exit 1; }
charmc="$charm/bin/charmc"
if [ ! -x "$charmc" ]; then
  echo "$0: $charmc not found: CHARM_DIR must be a Charm++ build (sdk/charm/build-charm.sh makes one)" >&2
  exit 1
fi
if [ ! -e "$charm/lib/libtrace-projections.a" ]; then
  echo "$0: $charm was built without tracing (--with-production alone disables it): rebuild it with" \
       "--enable-tracing, as sdk/charm/build-charm.sh does" >&2
  exit 1
fi

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
if [ $# -eq 2 ]; then
  lib=$2
else
  lib=""
  for candidate in "${CARGO_TARGET_DIR:-$repo/target}/release/libcanopy.so.0" \
                   "${CARGO_TARGET_DIR:-$repo/target}/debug/libcanopy.so.0"; do
    if [ -e "$candidate" ]; then lib=$candidate; break; fi
  done
  if [ -z "$lib" ]; then
    lib=libcanopy.so.0
    echo "$0: no libcanopy built in this checkout (cargo build -p canopy); the module will load libcanopy.so.0" \
         "from the loader's path, or CANOPY_LIBRARY" >&2
  fi
fi
case $lib in
  /*|libcanopy.so.0) ;;
  *) lib=$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib") ;;
esac

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$charmc" -O2 -DCANOPY_DEFAULT_LIBRARY="\"$lib\"" -c "$here/trace-canopy.C" -o "$work/trace-canopy.o"
rm -f "$work/libtrace-canopy.a"
ar rcs "$work/libtrace-canopy.a" "$work/trace-canopy.o"
install -m 0644 "$work/libtrace-canopy.a" "$charm/lib/libtrace-canopy.a"
echo "installed $charm/lib/libtrace-canopy.a (loads $lib); link programs with: $charmc -tracemode canopy"
