#!/usr/bin/env python3
"""The SASS of a CUDA kernel variant, without a GPU: compiles a full source written by the
compile test (``TEFL_COMPILE_DUMP=DIR``) with libnvrtc, the way the CUDA backend does, prints
ptxas' register and spill report, and disassembles the cubin with ``nvdisasm``.

    TEFL_COMPILE_DUMP=/tmp/dump TEFL_COMPILE_ONLY=norm \\
        cargo test --release -p tefl-backend-nvidia every_kernel_compiles_with_nvrtc
    python3 scripts/sass.py /tmp/dump/norm_14.cu [--arch sm_90] [--nvdisasm PATH] > norm.sass

libnvrtc is the one `.ci/run` fetches (target/nvrtc, or set TEFL_NVRTC); nvdisasm comes from
the `nvidia-cuda-nvdisasm` wheel (``pip download --no-deps nvidia-cuda-nvdisasm``, unzip it,
pass its ``nvidia/cu13/bin/nvdisasm``). How the norm forward's serialised row loads were found.

``--moves`` also reports, on stderr, each wait for the warpgroup MMAs in flight
(``WARPGROUP.DEPBAR``) followed within 40 instructions by 16 or more register moves: ptxas
moving accumulators, which it can only do once every MMA writing or reading them is done. How
the attention backward's split score chains were found (docs/performance-log.md, 2026-11-30).
"""

import argparse
import ctypes
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_nvrtc():
    lib_dir = os.environ.get("TEFL_NVRTC") or os.path.join(ROOT, "target/nvrtc/nvidia/cu13/lib")
    path = os.path.join(lib_dir, "libnvrtc.so.13")
    if not os.path.exists(path):
        sys.exit(f"sass.py: no {path} (run .ci/run once, or set TEFL_NVRTC to libnvrtc's folder)")
    # libnvrtc opens its builtins library by name: its folder must be on the loader's path.
    ld = os.environ.get("LD_LIBRARY_PATH", "")
    if lib_dir not in ld.split(":"):
        os.environ["LD_LIBRARY_PATH"] = f"{lib_dir}:{ld}" if ld else lib_dir
        os.execv(sys.executable, [sys.executable, *sys.argv])
    return ctypes.CDLL(path)


def compile_cubin(nvrtc, source, arch):
    prog = ctypes.c_void_p()
    if nvrtc.nvrtcCreateProgram(ctypes.byref(prog), source, b"kernel.cu", 0, None, None) != 0:
        sys.exit("sass.py: nvrtcCreateProgram failed")
    # The backend's options (tefl-backend-nvidia/src/nvrtc.rs, whose tests check that this
    # line has them), plus ptxas' report.
    opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++17", b"-default-device", b"-lineinfo", b"-Xptxas=-v"]
    status = nvrtc.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    print(log.value.decode(errors="replace"), file=sys.stderr)
    if status != 0:
        sys.exit(f"sass.py: the compile failed (nvrtc status {status})")
    nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    cubin = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetCUBIN(prog, cubin)
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    return cubin.raw


def move_bursts(sass):
    """(address, moves) of each warpgroup wait followed within 40 instructions by 16 or more
    register moves."""
    ins = re.findall(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", sass)
    found = []
    for i, (addr, text) in enumerate(ins):
        if text.startswith("WARPGROUP.DEPBAR"):
            moves = sum(1 for _, t in ins[i + 1 : i + 41] if re.match(r"(IMAD\.MOV\S*|MOV) R", t))
            if moves >= 16:
                found.append((addr, moves))
    return found


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source", help="a full kernel source written by TEFL_COMPILE_DUMP")
    p.add_argument("--arch", default="sm_90", help="sm_80, sm_90, or sm_90a for the wgmma sources")
    p.add_argument("--nvdisasm", default="nvdisasm", help="the nvdisasm executable")
    p.add_argument("--moves", action="store_true", help="report accumulator moves after warpgroup waits")
    a = p.parse_args()
    try:
        with open(a.source, "rb") as f:
            source = f.read()
    except OSError as e:
        sys.exit(f"sass.py: {e}")
    cubin = compile_cubin(load_nvrtc(), source, a.arch)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as out:
        out.write(cubin)
        out.flush()
        try:
            r = subprocess.run([a.nvdisasm, "-c", out.name], capture_output=True, text=True)
        except OSError as e:
            sys.exit(f"sass.py: cannot run {a.nvdisasm}: {e}")
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    if a.moves and r.returncode == 0:
        bursts = move_bursts(r.stdout)
        for addr, moves in bursts:
            print(f"sass.py: {moves} register moves after the warpgroup wait at /*{addr}*/", file=sys.stderr)
        print(f"sass.py: {len(bursts)} accumulator move burst(s)", file=sys.stderr)
    sys.exit(r.returncode)


if __name__ == "__main__":
    main()
