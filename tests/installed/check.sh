#!/bin/sh
# Installs the build into a scratch DESTDIR, then builds a C and a C++
# program against the installed headers and pkg-config files alone and runs
# them with the installed collie-run on 2 ranks, with no LD_LIBRARY_PATH:
# the installed programs and the ones linked through pkg-config find
# libcollie by their RPATH.
set -e
meson="$1"; build="$2"; src="$3"; hook="$4"
dest=$(mktemp -d)
trap 'rm -rf "$dest"' EXIT
"$meson" install -C "$build" --destdir "$dest" --quiet >/dev/null
pc=$(find "$dest" -name collie.pc | head -n 1)
prefix=$(sed -n 's/^prefix=//p' "$pc")
root="$dest$prefix"
flags="--define-variable=prefix=$root"
export PKG_CONFIG_PATH="$(dirname "$pc")"
# A versioned soname, so that programs linked against this release keep
# working across compatible ones.
lib=$(find "$dest" -name 'libcollie.so.*.*' | head -n 1)
soname=$(readelf -d "$lib" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
case "$soname" in
  libcollie.so.[0-9]*) ;;
  *) echo "libcollie's soname is '$soname', not versioned"; exit 1 ;;
esac
cc -std=c11 -o "$dest/uses_c_abi" "$src/uses_c_abi.c" $(pkg-config $flags --cflags --libs collie)
c++ -o "$dest/uses_reducer" "$src/uses_reducer.cc" $(pkg-config $flags --cflags --libs collie-cxx)
unset LD_LIBRARY_PATH
"$root/bin/collie-run" -n 2 "$dest/uses_c_abi"
"$root/bin/collie-run" -n 2 "$dest/uses_reducer" "$hook"
