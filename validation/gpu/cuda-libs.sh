# Sourced (POSIX sh) by the amsp GPU bundle's wrappers in bin/, with $here set
# to the bundle's root. Two things before any packed program runs:
#   1. on a machine whose glibc is older than the newest version any packed
#      file needs (MANIFEST's glibc line), sets AMSP_BUNDLE_OWN_GLIBC: the
#      wrappers then run the programs through the bundle's own loader and glibc
#      (lib/glibc), and say so once;
#   2. finds the CUDA libraries amsp links (MANIFEST's cuda-lib lines) and puts
#      their folders on LD_LIBRARY_PATH, saying once, on one line, which it took.
# The search, first hit wins for each library: AMSP_CUDA_LIBS (folders, colon-
# separated), NCCL_HOME/lib, CUDA_HOME (or CUDA_PATH)/lib64, /usr/local/cuda's
# lib64, the dynamic loader's cache, then the nvidia-* wheels of the Python
# environment of AMSP_PYTHON or python3 (site-packages/nvidia/*/lib: how PyTorch
# brings cuBLAS and NCCL). Runs once per job: the result travels in the
# environment (AMSP_BUNDLE_READY) to mpiexec's ranks.

if [ -z "${AMSP_BUNDLE_READY:-}" ]; then
  amsp_need=$(sed -n 's/^glibc //p' "$here/MANIFEST")
  amsp_have=$(getconf GNU_LIBC_VERSION 2>/dev/null | sed 's/^glibc //')
  if [ -n "$amsp_need" ] && [ -n "$amsp_have" ] &&
     [ "$(printf '%s\n%s\n' "$amsp_need" "$amsp_have" | sort -V | head -1)" != "$amsp_need" ]; then
    echo "amsp bundle: this machine's glibc is $amsp_have, the bundle's programs need $amsp_need: running them with the bundle's own glibc" >&2
    AMSP_BUNDLE_OWN_GLIBC=1
    export AMSP_BUNDLE_OWN_GLIBC
  fi

  amsp_python_dirs() {
    for py in ${AMSP_PYTHON:-} python3; do
      command -v "$py" >/dev/null 2>&1 || continue
      "$py" - <<'PY' 2>/dev/null && return
import glob, os
try:
    import nvidia
except ImportError:
    raise SystemExit(1)
for root in list(nvidia.__path__):
    for d in sorted(glob.glob(os.path.join(root, "*", "lib")) + glob.glob(os.path.join(root, "*", "lib64"))):
        print(d)
PY
    done
  }
  amsp_cache_dir() {  # the folder of $1 in the dynamic loader's cache
    /sbin/ldconfig -p 2>/dev/null | awk -v lib="$1" '$1 == lib && /x86-64/ {print $NF; exit}' | sed 's|/[^/]*$||'
  }
  amsp_found=""
  amsp_path=""
  amsp_pydirs=""
  for amsp_lib in $(sed -n 's/^cuda-lib //p' "$here/MANIFEST"); do
    amsp_dir=""
    amsp_from=""
    for d in $(echo "${AMSP_CUDA_LIBS:-}" | tr ':' ' ') ${NCCL_HOME:+$NCCL_HOME/lib} \
             ${CUDA_HOME:+$CUDA_HOME/lib64} ${CUDA_PATH:+$CUDA_PATH/lib64} /usr/local/cuda/lib64; do
      if [ -e "$d/$amsp_lib" ]; then amsp_dir=$d; amsp_from=toolkit; break; fi
    done
    if [ -z "$amsp_dir" ]; then
      amsp_dir=$(amsp_cache_dir "$amsp_lib")
      [ -n "$amsp_dir" ] && amsp_from="system"
    fi
    if [ -z "$amsp_dir" ]; then
      [ -n "$amsp_pydirs" ] || amsp_pydirs=$(amsp_python_dirs)
      for d in $amsp_pydirs; do
        if [ -e "$d/$amsp_lib" ]; then amsp_dir=$d; amsp_from="Python environment"; break; fi
      done
    fi
    if [ -z "$amsp_dir" ]; then
      echo "amsp bundle: $amsp_lib not found (looked in AMSP_CUDA_LIBS, NCCL_HOME, CUDA_HOME, /usr/local/cuda, the loader's cache and python3's nvidia packages): set AMSP_CUDA_LIBS to its folder" >&2
      exit 2
    fi
    amsp_found="$amsp_found${amsp_found:+, }$amsp_lib from $amsp_dir ($amsp_from)"
    case ":$amsp_path:" in *":$amsp_dir:"*) ;; *) amsp_path="$amsp_path${amsp_path:+:}$amsp_dir" ;; esac
  done
  # cuDNN is not linked; gpu-info reports the one it would find on this path.
  [ -n "$(amsp_cache_dir libcudnn.so.9)" ] || [ -n "$amsp_pydirs" ] || amsp_pydirs=$(amsp_python_dirs)
  for d in $amsp_pydirs; do
    [ -e "$d/libcudnn.so.9" ] && case ":$amsp_path:" in *":$d:"*) ;; *) amsp_path="$amsp_path:$d" ;; esac
  done
  echo "amsp bundle: CUDA libraries: $amsp_found" >&2
  LD_LIBRARY_PATH="$amsp_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  AMSP_BUNDLE_READY=1
  AMSP_INPUTS="$here/share/amsp/inputs"
  export LD_LIBRARY_PATH AMSP_BUNDLE_READY AMSP_INPUTS
  unset amsp_need amsp_have amsp_found amsp_path amsp_pydirs amsp_lib amsp_dir amsp_from
fi
