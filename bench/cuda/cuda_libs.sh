# shellcheck shell=bash
# cuda_libs.sh — sourced (bash): loom_cublas_dir prints the directory that holds cuBLAS 13
# (libcublas.so.13 and libcublasLt.so.13), the shared libraries the CUDA binaries need at
# run time (the CUDA runtime itself is linked in statically), or nothing. A GPU machine may
# have them in the toolkit (/usr/local/cuda), in the system's library path, or only inside
# PyTorch's CUDA 13 wheels (site-packages/nvidia/cu13/lib; nvidia/cublas/lib in the older
# per-library layout). LOOM_CUBLAS_DIR, when set, is taken as is.
#
# Used by bench/cuda/run_on_gpu.sh, which exports LOOM_CUBLAS_DIR once, and by the
# wrappers bench/cuda/make_carry.sh writes, which call it only when that is not set.
# loom_copy_libs (below) picks the libraries the carries take along.

loom_cublas_ok() { [ -n "$1" ] && [ -e "$1/libcublasLt.so.13" ] && [ -e "$1/libcublas.so.13" ]; }

loom_cublas_dir() {
    local d x sp
    if [ -n "${LOOM_CUBLAS_DIR:-}" ]; then
        echo "$LOOM_CUBLAS_DIR"
        return 0
    fi
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/lib64 \
             /usr/local/cuda-13*/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu /usr/lib64; do
        if loom_cublas_ok "$d"; then echo "$d"; return 0; fi
    done
    x=$(PATH="$PATH:/sbin:/usr/sbin" ldconfig -p 2>/dev/null | awk '$1 == "libcublasLt.so.13" { print $NF; exit }')
    if [ -n "$x" ] && loom_cublas_ok "$(dirname "$x")"; then dirname "$x"; return 0; fi
    # the Python packages (PyTorch's wheels bring their CUDA libraries along)
    sp=$("${PYTHON:-python3}" -c 'import site; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' \
         2>/dev/null)
    for d in $sp; do
        for x in "$d"/nvidia/*/lib; do
            if loom_cublas_ok "$x"; then echo "$x"; return 0; fi
        done
    done
    # anywhere else on the machine (bounded)
    x=$(timeout 30 find / -xdev \( -path /proc -o -path /sys \) -prune -o -name 'libcublasLt.so.13' -print 2>/dev/null | head -1)
    if [ -n "$x" ] && loom_cublas_ok "$(dirname "$x")"; then dirname "$x"; return 0; fi
    return 1
}

# loom_copy_libs DEST FILE...: copies into DEST every shared library ldd resolves for the
# FILEs that a GPU machine may lack: not glibc's own libraries, the C++ runtime or CUDA's
# (those are there, and newer). For bench/cuda/make_carry.sh and make_e2e_carry.sh.
loom_copy_libs() {
    local dest=$1 f name path
    shift
    local skip='^(linux-vdso|ld-linux|libc\.|libm\.|libmvec|libpthread|libdl\.|librt\.|libresolv|libnsl|libutil|libanl|libgcc_s|libstdc\+\+|libcublas|libcublasLt|libcudart|libcudnn|libnccl|libcuda\.)'
    for f in "$@"; do
        ldd "$f" | awk '/=>/ {print $1, $3}' | while read -r name path; do
            if ! [[ $name =~ $skip ]] && [ -f "$path" ] && [ ! -f "$dest/$name" ]; then cp -L "$path" "$dest/$name"; fi
        done
    done
}

# loom_cudnn_library: PyTorch's wheel's libcudnn.so.9 (the GPU machine has no system cuDNN),
# or nothing; for LOOM_CUDNN_LIBRARY (backend/cuda/README.md, "cuDNN attention").
loom_cudnn_library() {
    "${PYTHON:-python3}" -c 'import glob, site; print(next(iter(sorted(f for p in site.getsitepackages() for f in glob.glob(p + "/nvidia/*/lib/libcudnn.so.9"))), ""))' 2>/dev/null
}
