#!/usr/bin/env bash
# The GPU check's bundle: amsp built with CUDA, packed with every non-CUDA shared
# library it needs, so that a GPU machine with nothing but a driver, CUDA's
# libraries (a toolkit, or the nvidia-* wheels of a Python environment with
# PyTorch) and Python can run validation/gpu/check.sh without building or
# installing anything (doc/gpu.md, "Checking a GPU machine").
#
#   validation/gpu/bundle.sh [--out FILE] [--build DIR] [--arch "80;90"] [--werror]
#
# Runs where the CUDA toolkit compiles (nvcc 13; this repository's development
# machines). The archive holds:
#   bin/       amsp, mpiexec, check.sh: small sh wrappers that find CUDA's libraries
#              (libexec/cuda-libs.sh) and run the real programs
#   libexec/   amsp (RPATH $ORIGIN/../lib), MPICH's mpiexec.hydra and hydra_pmi_proxy
#   lib/       every shared library those need, from MPICH, UCX, parallel HDF5,
#              OpenBLAS, Boost, SentencePiece, protobuf and the C++ runtime, each
#              with RPATH $ORIGIN; UCX's transport modules in lib/ucx
#   share/amsp inputs/ (presets), the check's scripts, a prepared corpus, and in
#              tree/ the benchmarks the check runs on the CPU cores
#   MANIFEST   the commit, the architectures, the newest glibc symbol version any
#              packed file needs, and each packed library with where it came from
#   lib/glibc  this machine's glibc and its loader, used only on a machine whose
#              own glibc is older than MANIFEST says (libexec/cuda-libs.sh)
# CUDA's own libraries (cuBLAS, NCCL) are not packed: they are large and must
# match the driver.
#
# The archive must stay under 48 MiB so that it travels with a repository to a
# GPU machine; the script fails if it does not.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=$repo/build-bundle/amsp-gpu.tar.xz
build=$repo/build-bundle/cuda
arch="80;90"
werror=OFF
max_bytes=$((48 * 1024 * 1024))
while (($#)); do
  case $1 in
    --out) out=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --arch) arch=$2; shift 2 ;;
    --werror) werror=ON; shift ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "bundle.sh: unknown option $1 (expected --out FILE, --build DIR, --arch LIST or --werror)" >&2; exit 2 ;;
  esac
done
for tool in patchelf xz ldd objdump; do
  command -v $tool >/dev/null || { echo "bundle.sh: $tool not found (apt-get install patchelf xz-utils binutils)" >&2; exit 2; }
done
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[[ -x $nvcc ]] || { echo "bundle.sh: no nvcc (the CUDA toolkit): the bundle is built where CUDA compiles" >&2; exit 2; }

# --- 1. amsp with CUDA, for any x86-64 (no -march=native) --------------------------
cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release -DAMSP_CUDA=ON -DAMSP_NATIVE=OFF \
      -DAMSP_TESTS=OFF -DAMSP_BENCHMARKS=OFF -DAMSP_WERROR=$werror \
      -DCMAKE_CUDA_COMPILER="$nvcc" "-DCMAKE_CUDA_ARCHITECTURES=$arch" >/dev/null
cmake --build "$build" -j"$(nproc)" --target amsp

# --- 2. the tree -----------------------------------------------------------------
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
name=amsp-gpu
root=$stage/$name
mkdir -p "$root"/{bin,libexec,lib/ucx,lib/glibc,share/amsp}
cp "$build/amsp" "$root/libexec/amsp"
hydra=$(readlink -f "$(command -v mpiexec.hydra)")
cp "$hydra" "$root/libexec/mpiexec.hydra"
# The proxy under another name: hydra starts libexec/hydra_pmi_proxy, a wrapper
# (below) that runs it through the packed loader where it must.
cp "$(dirname "$hydra")/hydra_pmi_proxy" "$root/libexec/hydra_pmi_proxy.bin"
ucx_dir=$(dirname "$(ldconfig -p | awk '/libucs.so.0 /{print $NF; exit}')")/ucx
# Shared memory between ranks of one node (cross-memory attach); the network
# transports stay out: a multi-node run uses the site's own MPI.
cp "$ucx_dir"/libuct_cma.so.0 "$root/lib/ucx/"
cp -r "$repo/inputs" "$root/share/amsp/inputs"
cp "$repo"/validation/gpu/{check.sh,check.py,ncu_table.py,torch_reference.py} "$root/share/amsp/"
# The benchmarks the check runs on the machine's CPU cores, in their tree (they import
# each other by relative path).
for f in benchmarks/{hidden_bench,plan_validation,ckpt_stall}.py \
         validation/engine/{equivalence_test,issue_order}.py validation/slurm/local_cluster.py; do
  install -D -m 644 "$repo/$f" "$root/share/amsp/tree/$f"
done
cp "$repo/validation/gpu/cuda-libs.sh" "$root/libexec/cuda-libs.sh"

# The corpus the check trains on: the machine it runs on has no text of ours.
"$build/amsp" data prepare --input $("$repo/inputs/corpus/files.sh") \
    --output "$root/share/amsp/corpus.h5" >/dev/null

# --- 3. every shared library the programs need, but glibc's and CUDA's -----------
is_system() {  # glibc and the dynamic loader: the machine's own
  case $1 in
    linux-vdso.so.*|ld-linux*|libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libresolv.so.*|libutil.so.*|libanl.so.*) return 0 ;;
  esac
  return 1
}
is_cuda() {  # found on the GPU machine (libexec/cuda-libs.sh)
  case $1 in
    libcuda.so.*|libcudart.so.*|libcublas.so.*|libcublasLt.so.*|libnccl.so.*|libcudnn*.so.*|libnvidia-*) return 0 ;;
  esac
  return 1
}
declare -A origin
elfs=("$root"/libexec/amsp "$root"/libexec/mpiexec.hydra "$root"/libexec/hydra_pmi_proxy.bin "$root"/lib/ucx/*.so.0)
declare -A glibc_libs
for elf in "${elfs[@]}"; do
  while read -r soname path; do
    if is_system "$soname"; then glibc_libs[$soname]=$path; continue; fi
    is_cuda "$soname" || [[ -n ${origin[$soname]:-} ]] || origin[$soname]=$path
  done < <(LD_LIBRARY_PATH=/usr/local/cuda/lib64 ldd "$elf" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}')
done
missing=$(for elf in "${elfs[@]}"; do LD_LIBRARY_PATH=/usr/local/cuda/lib64 ldd "$elf" | awk '/not found/ {print $1}'; done | sort -u)
[[ -z $missing ]] || { echo "bundle.sh: libraries not found on this machine: $missing" >&2; exit 1; }
for soname in "${!origin[@]}"; do
  cp -L "${origin[$soname]}" "$root/lib/$soname"
done
# glibc whole (the loader, libc and the libraries split from it), untouched: only
# the packed loader loads them, never a machine's own.
cp -L "$(readlink -f /lib64/ld-linux-x86-64.so.2)" "$root/lib/glibc/ld-linux-x86-64.so.2"
for soname in "${!glibc_libs[@]}"; do cp -L "${glibc_libs[$soname]}" "$root/lib/glibc/$soname"; done

# RPATH (not RUNPATH): it applies to a library's own dependencies too and comes
# before LD_LIBRARY_PATH, so a packed library is always the one loaded.
chmod u+w "$root"/lib/*.so* "$root"/lib/ucx/*.so* "$root"/libexec/*
for f in "$root"/libexec/amsp "$root"/libexec/mpiexec.hydra "$root"/libexec/hydra_pmi_proxy.bin; do
  patchelf --force-rpath --set-rpath '$ORIGIN/../lib' "$f"
done
for f in "$root"/lib/*.so*; do patchelf --force-rpath --set-rpath '$ORIGIN' "$f"; done
for f in "$root"/lib/ucx/*.so*; do patchelf --force-rpath --set-rpath '$ORIGIN/..' "$f"; done
strip --strip-unneeded "$root"/lib/*.so* "$root"/lib/ucx/*.so* 2>/dev/null || true

# --- 4. wrappers and the manifest ------------------------------------------------
glibc=$(for f in "$root"/libexec/amsp "$root"/libexec/*.hydra "$root"/libexec/*.bin "$root"/lib/*.so* "$root"/lib/ucx/*.so*; do
          objdump -T "$f" 2>/dev/null | grep -o 'GLIBC_[0-9][0-9.]*' ; done | sed 's/GLIBC_//' | sort -uV | tail -1)
# The wrappers: find CUDA's libraries, then run the real program, through the
# packed loader when the machine's glibc is too old (AMSP_BUNDLE_OWN_GLIBC).
wrapper() {  # wrapper PATH REAL_PROGRAM
  cat > "$1" <<EOF
#!/bin/sh
# A program of the amsp GPU bundle: finds CUDA's libraries, then runs libexec/$2.
here=\$(cd "\$(dirname "\$0")/.." && pwd)
. "\$here/libexec/cuda-libs.sh"
if [ -n "\${AMSP_BUNDLE_OWN_GLIBC:-}" ]; then
  exec "\$here/lib/glibc/ld-linux-x86-64.so.2" --library-path "\$here/lib/glibc\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" \\
       "\$here/libexec/$2" "\$@"
fi
exec "\$here/libexec/$2" "\$@"
EOF
  chmod +x "$1"
}
wrapper "$root/bin/amsp" amsp
wrapper "$root/bin/mpiexec" mpiexec.hydra
wrapper "$root/libexec/hydra_pmi_proxy" hydra_pmi_proxy.bin
cat > "$root/bin/check.sh" <<'EOF'
#!/bin/sh
# The GPU check from this bundle (share/amsp/check.sh --help).
here=$(cd "$(dirname "$0")/.." && pwd)
exec bash "$here/share/amsp/check.sh" --bundle-dir "$here" "$@"
EOF
chmod +x "$root"/bin/*
{
  echo "amsp GPU bundle"
  echo "commit $(git -C "$repo" rev-parse --short=12 HEAD)$(git -C "$repo" diff --quiet HEAD -- || echo '+changes')"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "cuda $("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') arch $arch"
  echo "glibc $glibc"
  for lib in $(readelf -d "$root/libexec/amsp" | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p'); do
    if is_cuda "$lib"; then echo "cuda-lib $lib"; fi
  done
  for soname in $(printf '%s\n' "${!origin[@]}" | sort); do echo "lib $soname ${origin[$soname]}"; done
  echo "lib ucx/libuct_cma.so.0 $ucx_dir/libuct_cma.so.0"
} > "$root/MANIFEST"

# --- 5. the archive ----------------------------------------------------------------
mkdir -p "$(dirname "$out")"
tar -C "$stage" -cf - "$name" | xz -T0 -9 > "$out.tmp"
bytes=$(stat -c %s "$out.tmp")
if ((bytes > max_bytes)); then
  rm -f "$out.tmp"
  echo "bundle.sh: the archive is $((bytes / 1048576)) MiB, over the 48 MiB limit" >&2
  exit 1
fi
mv "$out.tmp" "$out"
echo "bundle: $out, $(awk -v b=$bytes 'BEGIN {printf "%.1f", b / 1048576}') MiB, ${#origin[@]} libraries packed and glibc (its own loader used where a machine's glibc is older than $glibc), CUDA $arch"
