#!/usr/bin/env python3
"""amsp data prepare on several ranks writes the file one process writes, byte for byte.

Twelve JSON Lines files of uneven sizes (some gzip-compressed, one empty of
documents) are tokenized with a tokenizer.json on 1 rank, on 3 ranks and on 4
ranks with one thread each; every dataset and attribute must be identical. Then
a bad record in a file that rank 2 reads must end the job with exit code 2 and
one line naming the rank, the file and the line, leaving no output and no part
file behind.

usage: prepare_ranks_test.py AMSP MPIEXEC WORKDIR
"""
import filecmp
import gzip
import json
import os
import random
import shutil
import subprocess
import sys

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def tokenizer_json(path):
    """A byte-level BPE tokenizer.json with a handful of merges, written by hand:
    no Python package needed."""
    printable = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255]
    chars, extra = {}, 0
    for b in range(256):
        chars[b] = chr(b) if b in printable else chr(256 + extra)
        extra += b not in printable
    vocab = {chars[b]: b for b in range(256)}
    merges = [("t", "h"), ("th", "e"), (chars[32], "the"), ("o", "f"), (chars[32], "of")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    spec = {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": len(vocab), "content": "<s>", "special": True, "normalized": False}],
            "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
            "post_processor": {"type": "TemplateProcessing",
                               "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                          {"Sequence": {"id": "A", "type_id": 0}}],
                               "special_tokens": {"<s>": {"id": "<s>", "ids": [len(vocab)], "tokens": ["<s>"]}}},
            "decoder": {"type": "ByteLevel"},
            "model": {"type": "BPE", "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges]}}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(spec, f, ensure_ascii=False)


def write_inputs(folder):
    rng = random.Random(5)
    os.makedirs(folder)
    for i in range(12):
        docs = [] if i == 4 else [f"file {i} doc {d}: the state of the art " + "x" * rng.randint(0, 400)
                                  for d in range(rng.randint(1, 2500))]
        lines = "".join(json.dumps({"text": d}) + "\n" for d in docs) or "\n"
        name = os.path.join(folder, f"part-{i:02d}.jsonl")
        if i % 3 == 2:
            with gzip.open(name + ".gz", "wt") as f:
                f.write(lines)
        else:
            with open(name, "w") as f:
                f.write(lines)


def prepare(amsp, mpiexec, ranks, inputs, tok, out, expect_rc=0):
    cmd = [mpiexec, "-n", str(ranks), amsp, "data", "prepare", "--input", inputs, "--tokenizer", tok,
           "--output", out, "--threads", "1", "--valid-fraction", "0.1"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != expect_rc:
        sys.exit(f"prepare_ranks_test: {ranks} ranks: exit {p.returncode}, expected {expect_rc}:\n{p.stdout}{p.stderr}")
    return p


def contents(path):
    with h5py.File(path, "r") as f:
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
        return attrs, {n: np.asarray(f[n][:]) for n in ("/train/tokens", "/valid/tokens", "/tokenizer/model")}


def main():
    amsp, mpiexec, work = sys.argv[1:4]
    shutil.rmtree(work, ignore_errors=True)
    inputs = os.path.join(work, "inputs")
    write_inputs(inputs)
    tok = os.path.join(work, "tokenizer.json")
    tokenizer_json(tok)
    want_attrs, want = None, None
    for ranks in (1, 3, 4):
        out = os.path.join(work, f"ranks{ranks}.h5")
        prepare(amsp, mpiexec, ranks, inputs, tok, out)
        attrs, data = contents(out)
        if want is None:
            want_attrs, want = attrs, data
            print(f"1 rank: {attrs['documents']} documents, {len(data['/train/tokens'])} + "
                  f"{len(data['/valid/tokens'])} tokens")
            continue
        for name in want:
            if not np.array_equal(want[name], data[name]):
                sys.exit(f"prepare_ranks_test: {ranks} ranks: {name} differs from 1 rank's")
        for key in want_attrs:
            if not np.array_equal(np.asarray(want_attrs[key]), np.asarray(attrs[key])):
                sys.exit(f"prepare_ranks_test: {ranks} ranks: attribute {key} differs: "
                         f"{attrs[key]!r} against {want_attrs[key]!r}")
        # No modification times in the file (H5Pset_obj_track_times off): the bytes too.
        if not filecmp.cmp(os.path.join(work, "ranks1.h5"), out, shallow=False):
            sys.exit(f"prepare_ranks_test: {ranks} ranks: the same contents, but not the same file bytes as 1 rank's")
        print(f"{ranks} ranks: identical to 1 rank, byte for byte")

    # A bad record in the tenth file (rank 2's share of 3): one line, exit 2.
    with open(os.path.join(inputs, "part-09.jsonl"), "a") as f:
        f.write('{"txt": "no text field"}\n')
    out = os.path.join(work, "bad.h5")
    p = prepare(amsp, mpiexec, 3, inputs, tok, out, expect_rc=2)
    errors = [line for line in p.stderr.splitlines() if line.startswith("amsp: error:")]
    if len(errors) != 1 or "part-09.jsonl:" not in errors[0] or "rank 2:" not in errors[0]:
        sys.exit(f"prepare_ranks_test: expected one error line naming rank 2 and part-09.jsonl, got:\n{p.stderr}")
    left = [n for n in os.listdir(work) if n.startswith("bad.h5")]
    if left:
        sys.exit(f"prepare_ranks_test: a failed prepare left {left} behind")
    print(f"bad record on rank 2: {errors[0]}")
    print("prepare_ranks_test: ok")


if __name__ == "__main__":
    main()
