#!/usr/bin/env python3
"""Looks for NVIDIA GPU code (ELF images) in Vulkan pipeline-cache or driver shader-cache
files and disassembles each with nvdisasm / cuobjdump when the toolkit has them.

usage: vk_sass.py OUTDIR FILE_OR_DIR...   (writes OUTDIR/elfN.bin and OUTDIR/elfN.sass)
"""
import os
import shutil
import struct
import subprocess
import sys
import zlib


def files(paths):
    for p in paths:
        if os.path.isdir(p):
            for root, _, names in os.walk(p):
                for n in names:
                    yield os.path.join(root, n)
        elif os.path.exists(p):
            yield p


def elf_images(data):
    at = 0
    while True:
        j = data.find(b"\x7fELF", at)
        if j < 0 or j + 64 > len(data):
            return
        at = j + 4
        if data[j + 4] != 2:  # ELF64 only
            continue
        shoff = struct.unpack_from("<Q", data, j + 0x28)[0]
        shentsize, shnum = struct.unpack_from("<HH", data, j + 0x3A)
        phoff = struct.unpack_from("<Q", data, j + 0x20)[0]
        phentsize, phnum = struct.unpack_from("<HH", data, j + 0x36)
        end = max(shoff + shentsize * shnum, phoff + phentsize * phnum)
        if 0 < end < 64 << 20 and j + end <= len(data):
            yield j, data[j : j + end]


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    tools = [t for t in ("/usr/local/cuda/bin/nvdisasm", "/usr/local/cuda/bin/cuobjdump") if os.path.exists(t)]
    tools += [t for t in (shutil.which("nvdisasm"), shutil.which("cuobjdump")) if t]
    print("tools:", tools)
    n = 0
    for path in files(sys.argv[2:]):
        data = open(path, "rb").read()
        print(f"{path}: {len(data)} bytes, head {data[:48].hex()}")
        blobs = [data]
        # Some caches compress their entries: try zlib at every zlib header.
        for k in range(len(data) - 2):
            if data[k] == 0x78 and data[k + 1] in (0x01, 0x5E, 0x9C, 0xDA):
                try:
                    blobs.append(zlib.decompressobj().decompress(data[k:]))
                except zlib.error:
                    pass
        for blob in blobs:
            for off, img in elf_images(blob):
                name = os.path.join(out, f"elf{n}.bin")
                open(name, "wb").write(img)
                print(f"  ELF at {off}: {len(img)} bytes -> {name}")
                for t in tools:
                    args = [t, "-sass", name] if t.endswith("cuobjdump") else [t, "-c", name]
                    r = subprocess.run(args, capture_output=True, text=True)
                    if r.returncode == 0 and r.stdout.strip():
                        open(name[:-4] + ".sass", "w").write(r.stdout)
                        print(f"  {os.path.basename(t)}: {len(r.stdout.splitlines())} lines")
                        break
                    print(f"  {os.path.basename(t)} failed: {r.stderr.strip()[:200]}")
                n += 1
    print(n, "ELF images")


main()
