#!/bin/sh
# Installs a Canopy build: the daemons and the canopy command, the filter plugins, the application SDK (libraries
# with their SONAME links, headers, the Fortran module's source, pkg-config files, a CMake package), the
# interfaces (.proto files, canopy_filter.h), shell completions and man pages, the systemd units and the example
# configuration.
#
#   deploy/install.sh [--prefix /usr] [--libdir DIR] [--destdir DIR] [--profile release] [--unitdir DIR]
#                     [--confdir DIR]
#
# Run `cargo build --release --workspace` first. --destdir stages everything under DIR (for packaging, or to
# inspect); without it files go to their places on this machine (run as root). /etc/canopy/canopy.toml is
# installed only if absent. --libdir (relative to the prefix, or absolute under it) is where the libraries,
# plugins, pkg-config and CMake files go: by default lib64 when PREFIX/lib64 is a real directory on a system
# that is not Debian-style (Fedora, RHEL, SUSE), else lib.
set -eu

usage() { sed -n '2,14p' "$0"; }
die() { echo "install.sh: $*" >&2; exit 1; }

prefix=/usr
libdir=
destdir=
profile=release
unitdir=
confdir=
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix|--libdir|--destdir|--profile|--unitdir|--confdir)
            if [ $# -lt 2 ] || [ -z "$2" ]; then
                echo "install.sh: $1 needs a value (see --help)" >&2
                exit 64
            fi ;;
    esac
    case "$1" in
        --prefix) prefix=$2; shift 2 ;;
        --libdir) libdir=$2; shift 2 ;;
        --destdir) destdir=$2; shift 2 ;;
        --profile) profile=$2; shift 2 ;;
        --unitdir) unitdir=$2; shift 2 ;;
        --confdir) confdir=$2; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 64 ;;
    esac
done
case "$prefix" in
    /*) prefix=${prefix%/} ;;
    *) echo "install.sh: --prefix must be an absolute path, got $prefix" >&2; exit 64 ;;
esac

# Debian and its derivatives put 64-bit libraries in lib (or lib/<multiarch>, which --libdir can name); RPM-based
# systems in lib64, which they have as a real directory (on Debian /usr/lib64 may exist, holding the loader).
if [ -z "$libdir" ]; then
    if [ -e /etc/debian_version ] || command -v dpkg-architecture >/dev/null 2>&1; then
        libdir=lib
    elif [ -d "$prefix/lib64" ] && [ ! -L "$prefix/lib64" ]; then
        libdir=lib64
    else
        libdir=lib
    fi
fi
case "$libdir" in
    "$prefix"/*) libdir=${libdir#"$prefix"/} ;;
    /*) echo "install.sh: --libdir $libdir is not under --prefix $prefix" >&2; exit 64 ;;
esac
libdir=${libdir%/}
case "/$libdir/" in
    */../*|*/./*|//) echo "install.sh: --libdir must name a directory under the prefix, got $libdir" >&2; exit 64 ;;
esac

root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}/$profile
for file in canopy canopy-frontend canopy-relay canopy-agent libcanopy.so libcanopy.a libcanopy_mpi.so libcanopy_omp.so; do
    if [ ! -e "$target/$file" ]; then
        die "$target/$file is not built: run cargo build --workspace${profile:+ --$profile} first"
    fi
done
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n 1)
major=${version%%.*}
minor=${version#*.}
minor=${minor%%.*}
# The libraries carry their SONAME from the build (sdk/c/build.rs, sdk/mpi/build.rs); a build from before a
# version change would install under names its SONAME does not match.
if command -v objdump >/dev/null 2>&1; then
    for lib in libcanopy libcanopy_mpi; do
        soname=$(objdump -p "$target/$lib.so" | awk '$1 == "SONAME" {print $2}')
        [ "$soname" = "$lib.so.$major" ] ||
            die "$target/$lib.so has SONAME '${soname}', not $lib.so.$major: rebuild it (cargo build --workspace)"
    done
fi
# The system libraries libcanopy.a needs, as `cargo rustc -p canopy-sdk-c --crate-type staticlib -- --print
# native-static-libs` reports them.
native_static_libs="-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc"
native_static_libs_cmake=$(echo "$native_static_libs" | sed -e 's/-l//g' -e 's/ /;/g')
# From <libdir>/cmake/Canopy back up to the prefix: the CMake package finds the rest from its own place.
cmake_to_prefix=../..
rest=$libdir
while [ -n "$rest" ]; do
    cmake_to_prefix=$cmake_to_prefix/..
    case "$rest" in */*) rest=${rest#*/} ;; *) rest= ;; esac
done

bindir=$destdir$prefix/bin
libpath=$destdir$prefix/$libdir
filterdir=$libpath/canopy/filters
incdir=$destdir$prefix/include
pcdir=$libpath/pkgconfig
cmakedir=$libpath/cmake/Canopy
datadir=$destdir$prefix/share
protodir=$datadir/canopy/proto
mandir=$datadir/man/man1
unitdir=${unitdir:-$destdir/lib/systemd/system}
sysusersdir=$destdir$prefix/lib/sysusers.d
confdir=${confdir:-$destdir/etc/canopy}
docdir=$datadir/doc/canopy

install -d "$bindir" "$filterdir" "$incdir" "$pcdir" "$cmakedir" "$protodir" "$mandir" \
    "$datadir/bash-completion/completions" "$datadir/zsh/site-functions" "$datadir/fish/vendor_completions.d" \
    "$unitdir" "$sysusersdir" "$confdir" "$docdir"
for bin in canopy canopy-frontend canopy-relay canopy-agent; do
    install -m 0755 "$target/$bin" "$bindir/$bin"
done
# A run over a Slurm allocation's nodes (canopy run hands srun jobs of several nodes to it).
install -m 0755 "$root/deploy/slurm/canopy-run" "$bindir/canopy-run"
# The test plugins are libcanopy_testfilter_*.so: not installed, and not offered by a build tree's daemons. A
# build tree from before they were named so may still hold libcanopy_filter_faulty.so.
for plugin in "$target"/libcanopy_filter_*.so; do
    case "$plugin" in
        *faulty*) ;;
        *) install -m 0644 "$plugin" "$filterdir/" ;;
    esac
done
# The shared libraries under their full version, with the SONAME link the loader follows and the link the
# linker's -l finds. libcanopy_mpi: the MPI wrapper (link -lcanopy_mpi or preload it; canopy-run --mpi finds it
# beside the binaries' ../lib or ../lib64); libcanopy_mpi_mpich: the same built for MPICH, which canopy run picks
# for a program linked with MPICH's libmpi (installed when it was built).
mpi_libs=libcanopy_mpi
if [ -e "$target/libcanopy_mpi_mpich.so" ]; then
    mpi_libs="$mpi_libs libcanopy_mpi_mpich"
fi
for lib in libcanopy $mpi_libs; do
    install -m 0755 "$target/$lib.so" "$libpath/$lib.so.$version"
    ln -sfn "$lib.so.$version" "$libpath/$lib.so.$major"
    ln -sfn "$lib.so.$major" "$libpath/$lib.so"
done
install -m 0644 "$target/libcanopy.a" "$libpath/libcanopy.a"
# The OMPT tool: the OpenMP runtime loads it by path (OMP_TOOL_LIBRARIES, canopy run --openmp), so it has no
# SONAME links.
install -m 0755 "$target/libcanopy_omp.so" "$libpath/libcanopy_omp.so"
install -m 0644 "$root/sdk/c/include/canopy.h" "$incdir/canopy.h"
# The filter ABI, for plugins written in C (filters/README.md).
install -m 0644 "$root/filters/abi/include/canopy_filter.h" "$incdir/canopy_filter.h"
# The Fortran module as source: a .mod file is specific to the compiler that made it, so applications compile
# canopy.f90 with their own (sdk/README.md).
install -m 0644 "$root/sdk/c/fortran/canopy.f90" "$incdir/canopy.f90"
subst() {
    sed -e "s|@PREFIX@|$prefix|g" -e "s|@LIBDIR@|$libdir|g" -e "s|@VERSION@|$version|g" \
        -e "s|@MAJOR@|$major|g" -e "s|@MINOR@|$minor|g" -e "s|@CMAKE_TO_PREFIX@|$cmake_to_prefix|g" \
        -e "s|@NATIVE_STATIC_LIBS@|$native_static_libs|g" \
        -e "s|@NATIVE_STATIC_LIBS_CMAKE@|$native_static_libs_cmake|g" "$1" > "$2"
    chmod 0644 "$2"
}
subst "$root/sdk/c/canopy.pc.in" "$pcdir/canopy.pc"
subst "$root/sdk/c/canopy-static.pc.in" "$pcdir/canopy-static.pc"
subst "$root/sdk/c/cmake/CanopyConfig.cmake.in" "$cmakedir/CanopyConfig.cmake"
subst "$root/sdk/c/cmake/CanopyConfigVersion.cmake.in" "$cmakedir/CanopyConfigVersion.cmake"
# The gRPC and wire interfaces, in their package layout (grpcurl -import-path PREFIX/share/canopy/proto).
(cd "$root/proto" && find canopy -name '*.proto') | while read -r proto; do
    install -d "$protodir/$(dirname "$proto")"
    install -m 0644 "$root/proto/$proto" "$protodir/$proto"
done
# Completions and man pages, written by the canopy command from its own definition.
"$target/canopy" completions bash > "$datadir/bash-completion/completions/canopy"
"$target/canopy" completions zsh > "$datadir/zsh/site-functions/_canopy"
"$target/canopy" completions fish > "$datadir/fish/vendor_completions.d/canopy.fish"
"$target/canopy" man -o "$mandir"
chmod 0644 "$datadir/bash-completion/completions/canopy" "$datadir/zsh/site-functions/_canopy" \
    "$datadir/fish/vendor_completions.d/canopy.fish" "$mandir"/canopy*.1
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
echo "installed Canopy $version under ${destdir:-/}$prefix, libraries in $libdir (units in $unitdir, config in $confdir)"
if [ -z "$destdir" ]; then
    echo "next: systemd-sysusers; systemctl daemon-reload; systemctl enable --now canopy-agent (or -relay, -frontend)"
fi
