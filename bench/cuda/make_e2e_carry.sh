#!/usr/bin/env bash
# make_e2e_carry.sh — run HERE (Debian 12, nvcc, no GPU): packs what the whole service needs
# on a GPU machine that has neither Loom's libraries nor PostgreSQL into
# .gpu-carry/e2e.tar.gz (git-ignored; ~45 MiB: it travels alone, without carry.tar.gz), for
# bench/cuda/e2e_on_gpu.sh to unpack and run there:
#
#   real/loom, real/libloom_backend_cuda.so   the service and its CUDA backend module
#                                             (found next to the binary, backend/backends.c)
#   pg/usr/lib/postgresql/<v>/bin             initdb, pg_ctl, postgres, psql
#   pg/usr/lib/postgresql/<v>/lib             the server's modules (plpgsql, encodings,
#                                             snowball), not the JIT's bitcode
#   pg/usr/share/postgresql/<v>               the server's share files; PostgreSQL finds them
#                                             relative to its bin directory, so the layout
#                                             under pg/ is Debian's
#   zoneinfo/                                 UTC, GMT and Etc/ zones: Debian's server reads
#                                             /usr/share/zoneinfo, which a bare image may lack
#   lib/                                      every library ldd names for these that is not
#                                             glibc's, the C++ runtime's or CUDA's
#
#   bash bench/cuda/make_e2e_carry.sh [build-dir]        (default: build)
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build}
C=.gpu-carry
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$B" -j2 --target loom loom_backend_cuda_module
PGBIN=$(dirname "$(ls /usr/lib/postgresql/*/bin/initdb | sort -V | tail -1)")
PGV=$(basename "$(dirname "$PGBIN")")
S=$(mktemp -d)
trap 'rm -rf "$S"' EXIT
mkdir -p "$S/real" "$S/lib" "$S/pg/usr/lib/postgresql/$PGV/bin" "$S/pg/usr/lib/postgresql/$PGV/lib" \
    "$S/pg/usr/share/postgresql" "$S/zoneinfo" "$C"
objcopy --strip-debug "$B/loom" "$S/real/loom"
objcopy --strip-debug "$B/libloom_backend_cuda.so" "$S/real/libloom_backend_cuda.so"
for p in initdb pg_ctl postgres psql; do cp "$PGBIN/$p" "$S/pg/usr/lib/postgresql/$PGV/bin/"; done
find "/usr/lib/postgresql/$PGV/lib" -maxdepth 1 -name '*.so' ! -name 'llvmjit*' -exec cp {} "$S/pg/usr/lib/postgresql/$PGV/lib/" \;
cp -r "/usr/share/postgresql/$PGV" "$S/pg/usr/share/postgresql/"
cp -rL /usr/share/zoneinfo/UTC /usr/share/zoneinfo/GMT /usr/share/zoneinfo/Etc "$S/zoneinfo/"
source bench/cuda/cuda_libs.sh
loom_copy_libs "$S/lib" "$S"/real/* "$S"/pg/usr/lib/postgresql/"$PGV"/bin/* "$S"/pg/usr/lib/postgresql/"$PGV"/lib/*.so
git rev-parse HEAD > "$S/commit" 2>/dev/null || true
git status --short | grep -v '^??' > "$S/dirty" || true
chmod 755 "$S" # the archive's "./": PostgreSQL runs as an unprivileged user there
tar -C "$S" -czf "$C/e2e.tar.gz" .
echo "packed: loom, PostgreSQL $PGV, $(ls "$S/lib" | wc -l) libraries ($(du -sh "$S" | cut -f1) unpacked)"
du -sh "$C/e2e.tar.gz"
# It travels alone (carry [".gpu-carry/e2e.tar.gz"]), in a command of its own: with the
# checkout it must stay under the device tool's 64 MiB.
size=$(du -sb "$C/e2e.tar.gz" | cut -f1)
if [ "$size" -gt $((56 * 1024 * 1024)) ]; then echo "make_e2e_carry: $C/e2e.tar.gz is over 56 MiB" >&2; exit 1; fi
