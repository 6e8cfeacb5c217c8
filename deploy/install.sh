#!/bin/sh
# Installs a Canopy build: the daemons and the canopy command, the filter plugins, the application SDK (library,
# header, the Fortran module's source, pkg-config file), the systemd units and the example configuration.
#
#   deploy/install.sh [--prefix /usr] [--destdir DIR] [--profile release] [--unitdir DIR] [--confdir DIR]
#
# Run `cargo build --release --workspace` first. --destdir stages everything under DIR (for packaging, or to
# inspect); without it files go to their places on this machine (run as root). /etc/canopy/canopy.toml is
# installed only if absent.
set -eu

prefix=/usr
destdir=
profile=release
unitdir=
confdir=
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) prefix=$2; shift 2 ;;
        --destdir) destdir=$2; shift 2 ;;
        --profile) profile=$2; shift 2 ;;
        --unitdir) unitdir=$2; shift 2 ;;
        --confdir) confdir=$2; shift 2 ;;
        -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
        *) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 64 ;;
    esac
done

root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}/$profile
for bin in canopy canopy-frontend canopy-relay canopy-agent; do
    if [ ! -x "$target/$bin" ]; then
        echo "install.sh: $target/$bin is not built: run cargo build --workspace${profile:+ --$profile} first" >&2
        exit 1
    fi
done
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n 1)

bindir=$destdir$prefix/bin
libdir=$destdir$prefix/lib
filterdir=$libdir/canopy/filters
incdir=$destdir$prefix/include
pcdir=$libdir/pkgconfig
unitdir=${unitdir:-$destdir/lib/systemd/system}
sysusersdir=$destdir$prefix/lib/sysusers.d
confdir=${confdir:-$destdir/etc/canopy}
docdir=$destdir$prefix/share/doc/canopy

install -d "$bindir" "$filterdir" "$incdir" "$pcdir" "$unitdir" "$sysusersdir" "$confdir" "$docdir"
for bin in canopy canopy-frontend canopy-relay canopy-agent; do
    install -m 0755 "$target/$bin" "$bindir/$bin"
done
for plugin in "$target"/libcanopy_filter_*.so; do
    case "$plugin" in
        *faulty*) ;;  # the broken plugin the tests build
        *) install -m 0644 "$plugin" "$filterdir/" ;;
    esac
done
install -m 0755 "$target/libcanopy.so" "$libdir/libcanopy.so"
install -m 0644 "$target/libcanopy.a" "$libdir/libcanopy.a"
# The MPI wrapper (link -lcanopy_mpi or preload it; canopy-run --mpi finds it in ../lib).
install -m 0755 "$target/libcanopy_mpi.so" "$libdir/libcanopy_mpi.so"
install -m 0644 "$root/sdk/c/include/canopy.h" "$incdir/canopy.h"
# The Fortran module as source: a .mod file is specific to the compiler that made it, so applications compile
# canopy.f90 with their own (sdk/README.md).
install -m 0644 "$root/sdk/c/fortran/canopy.f90" "$incdir/canopy.f90"
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" "$root/sdk/c/canopy.pc.in" > "$pcdir/canopy.pc"
for unit in "$root"/deploy/systemd/*.service; do
    sed -e "s|/usr/bin/|$prefix/bin/|g" "$unit" > "$unitdir/$(basename "$unit")"
    chmod 0644 "$unitdir/$(basename "$unit")"
done
install -m 0644 "$root/deploy/systemd/canopy.sysusers" "$sysusersdir/canopy.conf"
if [ ! -e "$confdir/canopy.toml" ]; then
    install -m 0644 "$root/deploy/canopy.toml" "$confdir/canopy.toml"
fi
for doc in README.md docs/deploy.md docs/architecture.md; do
    [ -e "$root/$doc" ] && install -m 0644 "$root/$doc" "$docdir/"
done
echo "installed Canopy $version under ${destdir:-/}$prefix (units in $unitdir, config in $confdir)"
if [ -z "$destdir" ]; then
    echo "next: systemd-sysusers; systemctl daemon-reload; systemctl enable --now canopy-agent (or -relay, -frontend)"
fi
