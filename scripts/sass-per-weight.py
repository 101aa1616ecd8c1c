#!/usr/bin/env python3
"""Instructions per weight of the matvec kernels, from their SASS.

    cuobjdump -sass build-sm52/src/backends/cuda/CMakeFiles/m40_cuda.dir/matmul_matvec.cu.o > sass.txt
    python3 scripts/sass-per-weight.py sass.txt

(matmul_streamed.cu.o likewise: its kernel's trip is a batch of 8 rows.)
For each matvec_kernel<Decoder, tokens, rows, lanes, units per round> it takes
the longest loop (a backward branch and its target: the loop over a row's
units), counts its instructions (NOPs aside) and divides by the weights one
trip covers (units per round x rows x values per unit). docs/cuda-kernels.md
("Instructions per weight") quotes the output for CUDA 11.8's sm_52 code.
"""
import re, subprocess, sys
from collections import Counter
txt = open(sys.argv[1]).read()
funcs = re.split(r'\n\s*Function : ', txt)
for f in funcs[1:]:
    name = f.split('\n')[0].strip()
    dem = subprocess.run(['c++filt', name], capture_output=True, text=True).stdout.strip()
    m = re.search(r'matvec_kernel<m40::cuda::mm::(\w+(?:<[^>]*>)?), (\d+), (\d+), (\d+), (\d+)(?:, (true|false))?>', dem)
    streamed = re.search(r'streamed_matvec_kernel<m40::cuda::mm::(\w+), (?:true|false), (\d)>', dem)
    if streamed:  # matmul_streamed.cu: a batch of 8 / tokens rows a trip, one unit each
        m = streamed
        dec, T, L, U, lane_order = streamed.group(1), streamed.group(2), '128', '1', 'false'
        R = str(8 // int(T))
    if not m: continue
    if not streamed: dec, T, R, L, U, lane_order = m.groups()
    ins = []
    for line in f.split('\n'):
        mm = re.search(r'/\*([0-9a-f]{4,5})\*/\s*\{?\s*(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;}]*)[;}]', line)
        if mm: ins.append((int(mm.group(1), 16), mm.group(3), mm.group(4)))
    loops = []
    for addr, op, args in ins:
        if op.startswith('BRA'):
            t = re.search(r'0x([0-9a-f]+)', args)
            if t and int(t.group(1), 16) < addr: loops.append((int(t.group(1), 16), addr))
    if not loops: continue
    lo, hi = max(loops, key=lambda l: l[1] - l[0])
    body = [op for a, op, _ in ins if lo <= a <= hi and op not in ('NOP',)]
    unit = {'DecodeF16': 8, 'DecodeBF16': 8, 'DecodeF32': 8, 'DecodeQ4_KWide': 32, 'DecodeQ5_KWide': 32, 'DecodeQ6_KWide': 64, 'DecodeQ3_KWide': 64, 'DecodeQ2_KWide': 64}.get(dec, 16)  # kUnit
    weights = int(U) * int(R) * unit
    c = Counter(o.split('.')[0] for o in body)
    print(f"{dec:10s} T={T} rows={R} units/round={U}{' lane-ordered' if lane_order == 'true' else ''}: {len(body)} instr per trip, {weights} weights -> {len(body)/weights:.2f} per weight; "
          + ', '.join(f'{k} {v}' for k, v in c.most_common(8)))
