# Sourced (from the repository root, on the GPU machine) by bench/gpu_run.sh
# and bench/gpu_backend.sh: unpacks the build bench/gpu_bundle.sh carried
# there (.gpu/bundle.tar.xz) into /tmp/cb and sets B (that build), OUT (the
# logs' folder), LD_LIBRARY_PATH (the bundle's libraries, the machine's
# NCCL and cudart, PyTorch's wheels, and libcrypto last: the machine's own
# where it has one), COLLIE_LIBRARY and PYTHONUNBUFFERED.
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT" /tmp/cb
tar -C /tmp/cb -xJf .gpu/bundle.tar.xz || exit 1
B=/tmp/cb/build
libdirs=/tmp/cb/lib
for l in libnccl.so.2 libcudart.so.13; do
  f=$(find /usr/local /opt /usr/lib -name "$l" 2>/dev/null | head -1)
  [ -n "$f" ] && libdirs="$libdirs:$(dirname "$f")"
done
export LD_LIBRARY_PATH="$libdirs:$B:${LD_LIBRARY_PATH:-}:/tmp/cb/fallback"
export COLLIE_LIBRARY=$B/libcollie.so.0 PYTHONUNBUFFERED=1
